"""``ale-iac report --serve``: the report folder over HTTP on 127.0.0.1 only, until interrupted.

The standard library's static file server is enough: a report is static files. It binds the
loopback address only, whatever the caller asks, so a report (agent output, screenshots) is never
reachable from another machine.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request on the terminal."""


def serve(folder: Path, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve ``folder`` on 127.0.0.1:``port`` (0: a free port); ``on_ready(url)`` once it listens."""
    handler = functools.partial(_Quiet, directory=str(folder))
    with ThreadingHTTPServer((HOST, port), handler) as server:
        on_ready(f"http://{HOST}:{server.server_address[1]}/index.html")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
