"""Writing files whole: a reader sees the old content or the new, never half of it (standard library only)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write ``path`` through a temporary file in the same folder and a rename; ``mode`` for a new file.

    The temporary name is unique per writer, so concurrent writers of one file never mix their bytes.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, mode: int = 0o600) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n", mode)
