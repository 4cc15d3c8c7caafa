"""A stand-in cloud metadata service for one connection on stdin/stdout (QEMU's ``guestfwd=...-cmd:``).

QEMU's user network runs this once per connection the guest opens to the forwarded address (169.254.169.254:80,
the address GCE and EC2 use), so a cloud disk booted under QEMU (``cloud_boot.py``) finds its metadata where the
cloud would have it. It answers as the clouds do, with their header rules:

* GCE: ``GET /computeMetadata/v1/instance/attributes/<key>`` only with ``Metadata-Flavor: Google`` (else 403);
* EC2 IMDSv2: ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``) gives a session token,
  and ``GET /latest/user-data`` needs it (else 401).

``VALUES`` is a JSON file of the instance attributes (``{"ale-endpoint-token": ...}``); the EC2 user data is
their ``key=value`` lines. ``LOG`` gets one line per request: method, path, whether the header rule was met and
the status; never a value. Standard library only.

    python3 metadata_standin.py VALUES LOG
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path
from typing import BinaryIO

GCE_ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"
EC2_TOKEN = "/latest/api/token"
EC2_USER_DATA = "/latest/user-data"
SESSION_FILE = ".ec2-session"
HEAD_LIMIT = 16 * 1024


def read_head(stream: BinaryIO) -> tuple[str, str, dict[str, str]]:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < HEAD_LIMIT:
        chunk = stream.read(1)
        if not chunk:
            break
        data += chunk
    lines = data.decode("latin-1").split("\r\n")
    method, path = ([*lines[0].split(" "), "", ""])[:2]
    headers = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()
    return method, path, headers


def answer(method: str, path: str, headers: dict[str, str], values: dict[str, str], session: Path) -> tuple[int, str]:
    """(status, body) for one request, by the clouds' rules."""
    if path.startswith(GCE_ATTRIBUTES):
        if headers.get("metadata-flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.\n"
        key = path[len(GCE_ATTRIBUTES) :]
        return (200, values[key]) if method == "GET" and key in values else (404, "not found\n")
    if path == EC2_TOKEN and method == "PUT":
        if "x-aws-ec2-metadata-token-ttl-seconds" not in headers:
            return 400, "missing ttl\n"
        token = secrets.token_urlsafe(16)
        session.write_text(token)
        return 200, token
    if path == EC2_USER_DATA and method == "GET":
        given = headers.get("x-aws-ec2-metadata-token")
        if not session.is_file() or given != session.read_text():
            return 401, "unauthorized\n"
        return 200, "".join(f"{key}={value}\n" for key, value in values.items())
    return 404, "not found\n"


def main(argv: list[str]) -> int:
    values_path, log_path = Path(argv[1]), Path(argv[2])
    values = {str(k): str(v) for k, v in json.loads(values_path.read_text()).items()}
    method, path, headers = read_head(sys.stdin.buffer)
    status, body = answer(method, path, headers, values, values_path.with_name(SESSION_FILE))
    payload = body.encode()
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(payload)}\r\n"
    sys.stdout.buffer.write((head + "Connection: close\r\n\r\n").encode() + payload)
    sys.stdout.buffer.flush()
    flavor = headers.get("metadata-flavor") == "Google"
    with log_path.open("a") as log:
        log.write(json.dumps({"t": time.time(), "method": method, "path": path, "flavor": flavor, "status": status}))
        log.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
