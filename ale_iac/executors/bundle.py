"""The runtime bundle: what a deployer needs to run somewhere other than this host's venv.

The ``sandbox`` and ``docker`` executors run the deployer with the Python of the image (the desktop
image's ``/usr/bin/python3``, 3.13), which has none of ale-iac's dependencies. The bundle is two
folders, both cached under ``~/.cache/ale-iac/runtime/``:

* ``deps-cp<XY>-<hash>/``: the dependencies the in-sandbox side imports (the agent SDK, the MCP
  bridges, the computer-server client), installed by pip for that interpreter's ABI from wheels
  only (``pip install --target --python-version --only-binary=:all:``), at the very versions this
  venv has. Keyed by those pins: built once (~7 s, needs the package index), then reused.
* ``src-<hash>/ale_iac``: this checkout's ``ale_iac`` package (sources only), keyed by content, so a
  changed checkout never runs stale code in a sandbox.

Nothing secret is in either: they hold code only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ale_iac.errors import AleIacError
from ale_iac.paths import cache_root

RUNTIME_REQUIREMENTS = (
    "pydantic",
    "httpx",
    "mcp",
    "PyYAML",
    "psutil",
    "sniffio",
    "filelock",
    "anthropic",
    "openai",
    "pillow",
)
"""What the in-sandbox side imports (``ale_iac.executors.entry``, ``ale_iac.bridges``) and what deployers
running there import (agents/ale_claw: the two model SDKs, Pillow for downscaling screenshots), at this
venv's versions."""
PLATFORMS = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
"""Wheel platforms accepted for the bundle: glibc-based x86_64 Linux (the desktop image)."""
PACKAGE = Path(__file__).resolve().parent.parent
_SKIP_DIRS = {"__pycache__"}


@dataclass(frozen=True)
class Bundle:
    python: str
    """``major.minor`` of the interpreter it is for."""
    deps: Path
    """Folder to put on ``PYTHONPATH`` (site-packages-like)."""
    src: Path
    """Folder holding ``ale_iac/``, to put on ``PYTHONPATH`` first."""

    @property
    def digest(self) -> str:
        """Short identity of the pair, e.g. for a cache folder inside a sandbox."""
        return f"{self.deps.name}-{self.src.name}"


def requirement_pins() -> list[str]:
    """``name==version`` for each runtime requirement, as installed in this venv."""
    pins = []
    for name in RUNTIME_REQUIREMENTS:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise AleIacError(f"{name} is not installed in this venv (run scripts/setup.sh)") from None
    return pins


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:12]


def _source_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith((".pyc", ".pyo"))]
    return files


def ensure_bundle(python: str = "3.13", log: Callable[[str], None] = lambda line: None) -> Bundle:
    """The bundle for interpreter ``python`` (``major.minor``), built if missing."""
    if not python.replace(".", "").isdigit() or python.count(".") != 1:
        raise AleIacError(f"python version must look like '3.13', got {python!r}")
    root = cache_root() / "runtime"
    key = (root, python)
    if key not in _MADE:  # sources hashed (every file read) once per process, not once per unit
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / ".lock")):
            _MADE[key] = Bundle(python=python, deps=_ensure_deps(root, python, log), src=_ensure_src(root))
    return _MADE[key]


_MADE: dict[tuple[Path, str], Bundle] = {}


def _ensure_deps(root: Path, python: str, log: Callable[[str], None]) -> Path:
    pins = requirement_pins()
    abi = "cp" + python.replace(".", "")
    target = root / f"deps-{abi}-{_digest([abi.encode(), *(p.encode() for p in pins)])}"
    if target.is_dir():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    argv += ["--target", str(tmp), "--python-version", python, "--implementation", "cp"]
    argv += ["--abi", abi, "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]
    for platform in (*PLATFORMS, "any"):
        argv += ["--platform", platform]
    log(f"building the runtime bundle for Python {python}: pip install {' '.join(pins)}")
    proc = subprocess.run([*argv, *pins], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise AleIacError(f"cannot build the runtime bundle for Python {python} (pip needs the package index):\n{tail}")
    shutil.rmtree(tmp / "bin", ignore_errors=True)  # console scripts with this host's interpreter path
    tmp.rename(target)
    return target


def _ensure_src(root: Path) -> Path:
    files = _source_files(PACKAGE)
    digest = _digest(part for f in files for part in (str(f.relative_to(PACKAGE)).encode(), f.read_bytes()))
    target = root / f"src-{digest}"
    if target.is_dir():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for f in files:
        dest = tmp / "ale_iac" / f.relative_to(PACKAGE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    tmp.rename(target)
    return target
