"""Egress under a policy, for real: a unit (local, docker) with no route of its own reaches a fake internet (a
namespace this test makes: DNS, HTTP and HTTPS servers) only through its own egress proxy on this host,
carried over its endpoint (``substrates.egress``); every attempt is in the proxy's log."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ale_iac.egress_policy import EgressPolicy
from ale_iac.images import ImageInfo
from ale_iac.substrates.channel import ModelChannel, ModelChannelError
from ale_iac.substrates.egress import IN_UNIT_PROXY, Attempt, UnitEgress, leftovers
from ale_iac.substrates.relay import unix_connector
from tests.support.fake_internet import FakeInternet, fake_internet
from tests.support.sandbox import Endpoint, new_sandbox_id, run, wait_for_status

# One worker runs the module: its units and fake internet are made once and shared by every test.
pytestmark = pytest.mark.xdist_group("egress")

T = TypeVar("T")
NAMES = ["allowed.test", "other.test", "wild.test", "a.wild.test", "deep.b.wild.test", "deny.wild.test", "xwild.test"]


class Loop:
    """An event loop in a thread: the channels run there while the tests drive the units synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass
class Unit:
    endpoint: Endpoint
    egress: UnitEgress

    def __repr__(self) -> str:  # a failing test prints its fixtures: never the token
        return f"Unit({self.endpoint.url})"


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeInternet]:
    with fake_internet(NAMES, tmp_path_factory.mktemp("fake-internet")) as net:
        yield net


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    running = Loop()
    try:
        yield running
    finally:
        running.close()


def _policy(net: FakeInternet, allow: list[str]) -> EgressPolicy:
    return EgressPolicy(allow=allow, deny=["deny.wild.test"], ports=[80, 443], resolver=net.dns)


def _runtime(kind: str) -> Any:
    if kind == "docker":
        from ale_iac.substrates.docker import runtime as docker_runtime

        return docker_runtime
    if kind == "qemu":
        from ale_iac.substrates.qemu import runtime as qemu_runtime

        return qemu_runtime
    from ale_iac.substrates.local import runtime as local_runtime

    return local_runtime


def _spec(kind: str, image: Any) -> Any:
    sandbox_id = new_sandbox_id("egress")
    if kind == "docker":
        return _runtime(kind).DockerSandboxSpec(sandbox_id=sandbox_id, image=image)
    if kind == "qemu":
        return _runtime(kind).QemuSandboxSpec(
            sandbox_id=sandbox_id, disk=image.disk, kernel=image.kernel, initrd=image.initrd
        )
    from ale_iac.substrates.local.sandboxes import LocalSandboxSpec

    return LocalSandboxSpec(sandbox_id=sandbox_id, rootfs=str(image.rootfs))


@contextlib.contextmanager
def started_units(kind: str, count: int, image: Any) -> Iterator[list[Endpoint]]:
    """``count`` units of ``kind``, ready; every one started is stopped at the end, whatever happened."""
    runtime, states = _runtime(kind), []
    try:
        for _ in range(count):
            states.append(runtime.start(_spec(kind, image)))
        endpoints = [Endpoint.of(s) if kind == "local" else Endpoint(s.endpoint, s.token) for s in states]
        for endpoint in endpoints:
            wait_for_status(endpoint)
        yield endpoints
    finally:
        for state in states:
            runtime.stop(state.sandbox_id)


def _image(request: pytest.FixtureRequest, kind: str, desktop_image: ImageInfo) -> Any:
    if kind == "docker":
        return request.getfixturevalue("docker_image")
    if kind == "qemu":
        from ale_iac.substrates.qemu.disk import ensure_export

        return ensure_export(desktop_image.name)
    return desktop_image


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("local", marks=pytest.mark.sandbox),
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("qemu", marks=[pytest.mark.qemu, pytest.mark.timeout(900)]),
    ],
)
def units(
    request: pytest.FixtureRequest,
    internet: FakeInternet,
    loop: Loop,
    desktop_image: ImageInfo,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Unit, Unit]]:
    """Two units of one substrate: A may reach the policy's names, B nothing; each has its own proxy."""
    root = tmp_path_factory.mktemp("egress")
    allow = [["allowed.test", "*.wild.test", f"{internet.addresses['other.test']}/32"], []]
    with started_units(request.param, 2, _image(request, request.param, desktop_image)) as endpoints:
        started: list[UnitEgress] = []
        try:
            for endpoint, names in zip(endpoints, allow, strict=True):
                assert endpoint.token is not None
                egress = UnitEgress(endpoint.url, endpoint.token, _policy(internet, names), root=root)
                loop.run(egress.start())
                started.append(egress)
            yield Unit(endpoints[0], started[0]), Unit(endpoints[1], started[1])
        finally:
            for egress in started:
                loop.run(egress.stop())
    assert not list(root.iterdir()), "an egress folder was left behind"


QUERY = "123401000001000000000000" + "07616c6c6f776564" + "0474657374" + "0000010001"
"""A DNS query for allowed.test (A), as bytes on the wire."""

CLIENT = """
import json, ssl, sys, urllib.request, urllib.error
proxy = {proxy!r}
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({{"http": proxy, "https": proxy}}),
    urllib.request.HTTPSHandler(context=ssl._create_unverified_context()),
)
out = {{}}
for url in {urls!r}:
    try:
        with opener.open(url, timeout=20) as reply:
            out[url] = [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as exc:
        out[url] = [exc.code, ""]
    except Exception as exc:
        out[url] = [0, repr(exc)]
print(json.dumps(out))
"""


def _python(endpoint: Endpoint, script: str) -> dict[str, Any]:
    encoded = base64.b64encode(script.encode()).decode()
    return run(endpoint, f"python3 -c \"import base64; exec(base64.b64decode('{encoded}'))\"")


def fetch(unit: Unit, *urls: str) -> dict[str, list[Any]]:
    """Each URL fetched inside the unit through its proxy: [status, body] (0 and the error when none)."""
    reply = _python(unit.endpoint, CLIENT.format(proxy=IN_UNIT_PROXY, urls=list(urls)))
    assert reply["return_code"] == 0, reply
    result: dict[str, list[Any]] = json.loads(reply["stdout"].strip().splitlines()[-1])
    return result


def logged(unit: Unit, host: str) -> list[Attempt]:
    return [a for a in unit.egress.attempts() if a.host == host]


def test_an_allowed_host_is_reached_over_http_and_over_https_through_connect(
    units: tuple[Unit, Unit], internet: FakeInternet
) -> None:
    a, _ = units
    result = fetch(a, "http://allowed.test/", "https://allowed.test/2000")
    ip = internet.addresses["allowed.test"]
    assert result["http://allowed.test/"] == [200, f"hello from {ip}"]
    assert result["https://allowed.test/2000"][0] == 200 and result["https://allowed.test/2000"][1].startswith(
        f"hello from {ip}"
    )
    attempts = logged(a, "allowed.test")
    assert {(x.method, x.port, x.allowed, x.address) for x in attempts} >= {
        ("GET", 80, True, ip),
        ("CONNECT", 443, True, ip),
    }
    assert all(x.bytes_in > 0 for x in attempts)
    assert any(x.method == "CONNECT" and x.bytes_in > 2000 for x in attempts)
    channel = a.egress.channel  # every byte both ways, a tunnel's included (its TLS handshake, the request)
    assert channel is not None and channel.bytes_up > 300 and channel.bytes_down > 2000


def test_a_denied_host_is_refused_and_logged(units: tuple[Unit, Unit]) -> None:
    a, _ = units
    result = fetch(
        a, "http://deny.wild.test/", "http://other.test/", "https://other.test/", "http://allowed.test:8080/"
    )
    assert result["http://deny.wild.test/"][0] == 403
    assert result["http://other.test/"][0] == 403
    assert "403" in result["https://other.test/"][1]
    assert result["http://allowed.test:8080/"][0] == 403
    assert [x.reason for x in logged(a, "deny.wild.test")] == ["deny deny.wild.test"]
    assert {x.reason for x in logged(a, "other.test")} == {"no allow entry matches the name"}
    assert any(x.port == 8080 and x.reason == "port 8080 is not in ports" for x in logged(a, "allowed.test"))
    assert not any(x.allowed for x in logged(a, "other.test") + logged(a, "deny.wild.test"))


def test_a_cidr_admits_an_address_but_not_the_name_that_resolves_into_it(
    units: tuple[Unit, Unit], internet: FakeInternet
) -> None:
    a, _ = units
    ip = internet.addresses["other.test"]
    result = fetch(a, f"http://{ip}/")
    assert result[f"http://{ip}/"] == [200, f"hello from {ip}"]


def test_a_wildcard_matches_only_names_below_its_domain(units: tuple[Unit, Unit]) -> None:
    a, _ = units
    result = fetch(a, "http://a.wild.test/", "http://deep.b.wild.test/", "http://wild.test/", "http://xwild.test/")
    assert result["http://a.wild.test/"][0] == 200
    assert result["http://deep.b.wild.test/"][0] == 200
    assert result["http://wild.test/"][0] == 403
    assert result["http://xwild.test/"][0] == 403


def test_a_direct_connection_and_a_direct_dns_query_fail_inside(
    units: tuple[Unit, Unit], internet: FakeInternet
) -> None:
    a, _ = units
    script = f"""
import socket
out = []
try:
    socket.create_connection(({internet.addresses["allowed.test"]!r}, 80), timeout=3).close(); out.append("tcp reached")
except OSError as exc:
    out.append("tcp failed")
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(bytes.fromhex({QUERY!r}), ({internet.dns!r}, 53))
    s.recvfrom(512); out.append("dns answered")
except OSError as exc:
    out.append("dns failed")
try:
    socket.getaddrinfo("allowed.test", 80); out.append("resolved")
except OSError:
    out.append("no resolution")
print(" ".join(out))
"""
    reply = _python(a.endpoint, script)
    assert reply["stdout"].split() == ["tcp", "failed", "dns", "failed", "no", "resolution"], reply


def test_one_unit_cannot_use_another_units_proxy(units: tuple[Unit, Unit], loop: Loop) -> None:
    a, b = units
    before = len(a.egress.attempts())
    assert fetch(b, "http://allowed.test/")["http://allowed.test/"][0] == 403  # B's own proxy: B may reach nothing
    assert [x.reason for x in b.egress.attempts()] == ["no allow entry matches the name"]
    assert len(a.egress.attempts()) == before
    assert b.endpoint.token is not None
    # A's proxy cannot be joined to B's endpoint without B's token, nor B's with A's.
    stolen = ModelChannel(b.endpoint.url, a.egress._token, unix_connector(str(a.egress.socket)), pool=1)
    with pytest.raises(ModelChannelError, match="401"):
        loop.run(stolen.open())
    loop.run(stolen.aclose())


def test_a_proxy_whose_runner_is_gone_is_found_for_gc(units: tuple[Unit, Unit]) -> None:
    a, _ = units
    assert a.egress.folder not in leftovers(a.egress.folder.parent)  # its runner (this process) is alive
    owner = json.loads((a.egress.folder / "owner.json").read_text())
    assert owner["proxy"][0] == a.egress.proc.pid if a.egress.proc else False
    assert Path(a.egress.socket).exists()
