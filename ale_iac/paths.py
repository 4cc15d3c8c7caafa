"""Where ale-iac keeps things on the host.

* home (``ALE_IAC_HOME``, default ``~/.ale-iac``): state that must survive a crash — the Pulumi file
  backend, the secrets passphrase, per-stack logs, running local sandboxes, pool leases.
* cache (``ALE_IAC_CACHE``, default ``$XDG_CACHE_HOME/ale-iac``): things that can be rebuilt — the
  Pulumi toolchain and built images.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path


def ale_home() -> Path:
    return Path(os.environ.get("ALE_IAC_HOME") or Path.home() / ".ale-iac").expanduser()


def home_id() -> str:
    """Six hex digits naming this ale-iac home on this host. Ephemeral stack names carry it
    (``run-<id>-...``, ``sbx-<id>-...``), so that ``gc`` and ``sandbox destroy --all`` act only on what
    this home made, even when several homes share one Pulumi backend (``PULUMI_BACKEND_URL``)."""
    where = f"{socket.gethostname()}:{ale_home().resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:6]


def cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("ALE_IAC_CACHE") or Path(xdg) / "ale-iac").expanduser()


def project_root() -> Path:
    """The source tree (holds Pulumi.yaml, stacks/, images/, agents/, examples/)."""
    return Path(__file__).resolve().parent.parent
