"""Which bulk transport a handle's unit offers, per path (no engine needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs
from ale_iac.sandbox.transport import transport_for, upload_dir


def _handle(**fields: Any) -> UnitOutputs:
    base = {"unit": "u", "provider": "docker", "endpoint": "http://127.0.0.1:1", "snapshot": "s", "image": "i",
            "resource_id": "r", "paths": LINUX_DESKTOP_PATHS}  # fmt: skip
    return UnitOutputs.model_validate({**base, **fields})


def test_docker_units_use_the_archive_api_for_paths_on_their_volumes_only() -> None:
    docker = _handle(transport="docker", container_id="abc")
    assert transport_for(docker, "/data/tasks/t/input") == "docker"
    assert transport_for(docker, "/root/.ale/w") == "docker"
    assert transport_for(docker, "/media/user/data/agenthle/d/t/v/input") == "docker"
    for path in ("/tmp/x", "/etc", "/data/../etc", "relative/path", "/database"):
        assert transport_for(docker, path) == "http", path
    assert transport_for(_handle(transport="docker"), "/data/x") == "http"  # no container id: no archive API
    assert transport_for(_handle(), "/data/x") == "http"
    assert _handle().transport == "http"


def test_http_units_go_through_the_fallback(tmp_path: Path) -> None:
    calls: list[tuple[Any, Path, str]] = []

    async def fallback(client: Any, local: Path, remote: str) -> int:
        calls.append((client, local, remote))
        return 7

    count = asyncio.run(upload_dir(_handle(), "client", tmp_path, "/data/x", fallback))  # type: ignore[arg-type]
    assert count == 7 and calls == [("client", tmp_path, "/data/x")]
