from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ale_iac.llm.gateway import ModelGateway
from ale_iac.llm.plan import Plan
from ale_iac.llm.scripted import ScriptedModelServer
from tests.llm.helpers import TWO_STEP

MakeServer = Callable[..., ScriptedModelServer]


@pytest.fixture
def make_server() -> Iterator[MakeServer]:
    """Start scripted model servers (stopped at the end of the test)."""
    started: list[ScriptedModelServer] = []

    def make(plan: Plan = TWO_STEP, **kwargs: object) -> ScriptedModelServer:
        server = ScriptedModelServer(plan, **kwargs)  # type: ignore[arg-type]
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def server(make_server: MakeServer) -> ScriptedModelServer:
    return make_server()


@pytest.fixture
def gateway() -> Iterator[ModelGateway]:
    with ModelGateway() as gw:
        yield gw
