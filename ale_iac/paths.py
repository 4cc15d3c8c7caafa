"""Where ale-iac keeps things on the host.

* home (``ALE_IAC_HOME``, default ``~/.ale-iac``): state that must survive a crash — the Pulumi file
  backend, the secrets passphrase, per-stack logs, running local sandboxes, pool leases.
* cache (``ALE_IAC_CACHE``, default ``$XDG_CACHE_HOME/ale-iac``): things that can be rebuilt — the
  Pulumi toolchain and built images.
* shared images (``ALE_IAC_IMAGE_PATH``, a ``:``-separated list, default ``/var/lib/ale-iac/images``):
  images root built and published read-only for the normal users of the host, who unpack a copy of
  their own into their cache (rootless sandboxes run an image their user owns; docs/rootless.md).
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


SHARED_IMAGES_DEFAULT = Path("/var/lib/ale-iac/images")


def shared_image_dirs() -> list[Path]:
    """Where published images are looked for, first to last (the first is where root publishes)."""
    listed = [Path(part).expanduser() for part in os.environ.get("ALE_IAC_IMAGE_PATH", "").split(":") if part]
    return listed or [SHARED_IMAGES_DEFAULT]


def project_root() -> Path:
    """The source tree (holds Pulumi.yaml, stacks/, images/, agents/, examples/)."""
    return Path(__file__).resolve().parent.parent
