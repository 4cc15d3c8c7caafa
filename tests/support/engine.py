"""A tiny dynamic resource for engine tests: writes a file on create, removes it on delete; and the Pulumi
CLIs at work on a stack.

The resource lives in an importable module (not in a test file) because Pulumi pickles dynamic providers by
reference and the provider process must import this class to create or delete the resource.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from ale_iac import procs
from ale_iac.errors import AleIacError


def pulumi_clis(stack: str) -> list[int]:
    """The pids of the host's live ``pulumi`` CLIs working on ``stack`` (whoever started them: a CLI whose runner
    was killed is nobody's child any more)."""
    return [
        pid
        for pid in procs.all_pids()
        if (argv := procs.argv(pid)) and os.path.basename(argv[0]) == "pulumi" and stack in argv
    ]


class MarkerProvider(dyn.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        path = Path(props["path"])
        path.write_text(props["content"])
        hold = float(props.get("hold_s", 0))
        if hold:
            # Lets a test kill the engine while this create is in flight.
            Path(str(path) + ".creating").write_text("x")
            time.sleep(hold)
        return dyn.CreateResult(id_=str(path), outs={**props, "size": len(props["content"])})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        Path(id_).unlink(missing_ok=True)


class Marker(dyn.Resource):
    size: pulumi.Output[int]
    path: pulumi.Output[str]

    def __init__(self, name: str, path: str, content: str, hold_s: float = 0) -> None:
        super().__init__(
            MarkerProvider(),
            name,
            {"path": path, "content": content, "hold_s": hold_s, "size": None},
        )


def marker_program(path: str, content: str, hold_s: float = 0) -> Any:
    def program() -> None:
        marker = Marker("marker", path, content, hold_s)
        pulumi.export("path", marker.path)
        pulumi.export("size", marker.size)
        pulumi.export("secret", pulumi.Output.secret("s3cr3t-" + content))

    return program


class FailingProvider(dyn.ResourceProvider):
    """Its create raises ``props["error"]``, the way a substrate's driver fails in a unit's provider."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        raise AleIacError(props["error"])


class Failing(dyn.Resource):
    def __init__(self, name: str, error: str) -> None:
        super().__init__(FailingProvider(), name, {"error": error})


def failing_program(error: str) -> Any:
    """A program whose one resource fails to create with ``error`` (a traceback in the engine's output)."""

    def program() -> None:
        Failing("doomed", error)

    return program
