"""What the precondition markers need of the host, and whether this host has it.

The markers (registered, with their meaning, in pyproject.toml):

* ``needs_root``: the test runs as uid 0.
* ``image``: the built ``desktop`` image (``ale_iac.images.find_image("desktop")``; scripts/setup.sh builds it).
* ``engine``: a usable Pulumi CLI (``ale_iac.toolchain.find_toolchain()``: ``ALE_IAC_PULUMI``, PATH, or the
  toolchain scripts/setup.sh built).
* ``sandbox``: a host that runs local sandboxes: root, the desktop image, and every
  ``ale_iac.substrates.local.runtime.host_checks()`` ok. Most of these tests start real sandboxes.
* ``agent_clis``: the pinned agent CLIs (``ale_iac.agent_sdk.clis``: Claude Code, Codex) installed, or
  ``npm`` on PATH to install them from the npm registry (the test's fixture does, ~6 s each, once).
* ``rootless``: root (to make a normal user with ``useradd`` and drive it with ``runuser`` in a private mount
  namespace: tests/support/rootless.py), the desktop image, and unprivileged user namespaces allowed.
* ``docker``: a Docker engine that answers, or one this host can start (root and ``dockerd`` installed): the
  check itself runs scripts/dockerd.sh, before the test's fixtures, so a docker test never depends on another
  test (or fixture) having started the engine; and the desktop image (imported into the engine).
* ``browser``: Debian's Chromium and its chromedriver (the report's tests that open pages).
* ``kubernetes``: root, Debian's containerd, runc, ctr, busybox-static, openssl and the CNI plugins, Go (or the
  cluster's binaries already built by ``scripts/kube-cluster.sh build``), the Pulumi CLI and the desktop image:
  the session's ``kube_cluster`` fixture (tests/support/kube.py) builds, starts and stops the private cluster.
* ``qemu``: root, QEMU (``qemu-system-x86_64``, ``qemu-img``) and the desktop image; the tests' fixtures
  make the image's qcow2 export and a saved memory state on first need (scripts/setup.sh makes neither).
* ``criu``: what ``sandbox`` needs, and CRIU 4.2 or later that passes ``criu check``
  (``ale_iac.substrates.local.checkpoint``; ``scripts/setup.sh --for tests`` fetches it with scripts/criu.sh).

The hooks in tests/conftest.py use :func:`missing` before each test: where a precondition is missing the
test is skipped with the reason on a developer's host, and fails in CI (``CI=true``), because a test that
never runs tests nothing. Each check runs at most once per process, and only when a test needs it.

``ALE_IAC_TEST_MISSING=sandbox,engine`` (marker names, or ``all``) makes those preconditions count as
missing whatever the host has: to see the skip, and the failure under ``CI=true``, without breaking a host.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

FORCE_MISSING_ENV = "ALE_IAC_TEST_MISSING"
TEST_ENDPOINT_ENV = "ALE_IAC_TEST_ENDPOINT"
CI_ENV = "CI"


def in_ci() -> bool:
    return os.environ.get(CI_ENV, "").strip().lower() in {"1", "true", "yes"}


@functools.cache
def _root() -> str | None:
    uid = os.geteuid()
    return None if uid == 0 else f"runs as uid {uid}, not root"


@functools.cache
def _image() -> str | None:
    from ale_iac.images import find_image

    if find_image("desktop") is None:
        return "the desktop image is not built (run: ale-iac images build desktop; scripts/setup.sh does)"
    return None


@functools.cache
def _engine() -> str | None:
    from ale_iac.errors import AleIacError
    from ale_iac.toolchain import find_toolchain

    try:
        find_toolchain()
    except AleIacError as exc:
        return str(exc)
    return None


@functools.cache
def _sandbox() -> str | None:
    from ale_iac.substrates.local.host import host_checks

    failed = [
        f"{check.name}: {check.detail} ({check.fix})" for check in host_checks() if check.required and not check.ok
    ]
    image = _image()
    if image is not None:
        failed.append(image)
    return "local sandboxes cannot run here: " + "; ".join(failed) if failed else None


@functools.cache
def _criu() -> str | None:
    from ale_iac.substrates.local.checkpoint import criu_status

    sandbox = _sandbox()
    if sandbox is not None:
        return sandbox
    ok, detail = criu_status()
    return None if ok else f"local checkpoints cannot be made here: {detail}"


@functools.cache
def _rootless() -> str | None:
    import shutil
    from pathlib import Path

    failed = [why for why in (_root(), _image()) if why is not None]
    failed += [
        f"{tool} is not installed" for tool in ("useradd", "userdel", "runuser", "unshare") if not shutil.which(tool)
    ]
    try:
        max_userns = Path("/proc/sys/user/max_user_namespaces").read_text().strip()
    except OSError:
        max_userns = "unreadable"
    if max_userns == "0":
        failed.append("user namespaces are disabled (sysctl -w user.max_user_namespaces=15000)")
    return "rootless sandboxes cannot be tested here: " + "; ".join(failed) if failed else None


DOCKERD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dockerd.sh"


def _docker_engine_error() -> str | None:
    """Why ale-iac's Docker engine does not answer on its socket now (None when it does; nothing is started)."""
    from ale_iac.docker_engine import client as docker_client
    from ale_iac.errors import AleIacError

    try:
        docker_client(timeout=10).close()
    except AleIacError as exc:
        return str(exc)
    return None


def docker_engine_answers() -> bool:
    return _docker_engine_error() is None


def stop_docker_engine() -> str:
    """``scripts/dockerd.sh stop``: the dockerd that script started, by the pid it recorded (nothing else); what
    it said."""
    import subprocess

    done = subprocess.run(["bash", str(DOCKERD_SCRIPT), "stop"], capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).strip()


def _start_docker_engine() -> str | None:
    """Start the Docker engine with scripts/dockerd.sh (idempotent, one start at a time under its lock);
    None once it answers, else why not."""
    import subprocess

    proc = subprocess.run(["bash", str(DOCKERD_SCRIPT)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"scripts/dockerd.sh failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()}"
    error = _docker_engine_error()
    return None if error is None else f"scripts/dockerd.sh started the engine, but it does not answer: {error}"


@functools.cache
def _docker() -> str | None:
    """The engine answers, or this host can start it and did: whichever test of the marker runs first, on
    whichever worker, finds the engine up (the check runs before any of its fixtures)."""
    import shutil

    failed = []
    error = _docker_engine_error()
    if error is not None:
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            failed.append(f"{error} (and it cannot be started here: that needs root and dockerd)")
        else:
            started = _start_docker_engine()
            if started is not None:
                failed.append(started)
    image = _image()
    if image is not None:
        failed.append(image)
    return "the docker executor cannot run here: " + "; ".join(failed) if failed else None


@functools.cache
def _qemu() -> str | None:
    import shutil

    failed = [f"{tool} is not installed" for tool in ("qemu-system-x86_64", "qemu-img") if shutil.which(tool) is None]
    for why in (_root(), _image()):
        if why is not None:
            failed.append(why)
    if failed:
        return "qemu guests cannot run here: " + "; ".join(failed) + " (scripts/setup.sh installs QEMU)"
    return None


@functools.cache
def _kubernetes() -> str | None:
    import shutil

    from ale_iac.toolchain import kube_bin_dir

    tools = ("containerd", "runc", "ctr", "openssl", "busybox", "curl")
    failed = [f"{tool} is not installed" for tool in tools if shutil.which(tool) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        failed.append("the CNI plugins are not installed (containernetworking-plugins)")
    built = all(
        (kube_bin_dir() / name).is_file() for name in ("kube-apiserver", "kubelet", "pulumi-resource-kubernetes")
    )
    if not built and shutil.which("go") is None:
        failed.append("the cluster is not built and Go is not on PATH to build it (scripts/kube-cluster.sh build)")
    for why in (_root(), _image(), _engine()):
        if why is not None:
            failed.append(why)
    if failed:
        return (
            "the private Kubernetes cluster cannot run here: "
            + "; ".join(failed)
            + " (scripts/setup.sh installs the packages)"
        )
    return None


@functools.cache
def _agent_clis() -> str | None:
    import shutil

    from ale_iac.agent_sdk.clis import CLIS, find_cli

    if all(find_cli(name) is not None for name in CLIS) or shutil.which("npm"):
        return None
    return (
        f"the agent CLIs ({', '.join(CLIS)}) are not installed and npm is not on PATH to install them "
        "(apt-get install npm; python -m ale_iac.agent_sdk.clis ensure claude-code codex)"
    )


@functools.cache
def _browser() -> str | None:
    from tests.support.browser import CHROMEDRIVER, CHROMIUM

    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if absent:
        return f"{' and '.join(absent)} not installed (apt-get install chromium chromium-driver; scripts/setup.sh does)"
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "needs_root": _root,
    "image": _image,
    "engine": _engine,
    "sandbox": _sandbox,
    "criu": _criu,
    "docker": _docker,
    "qemu": _qemu,
    "kubernetes": _kubernetes,
    "rootless": _rootless,
    "agent_clis": _agent_clis,
    "browser": _browser,
}
"""Marker name -> the check of its precondition (None when met, else why not)."""


def markers_of(item: pytest.Item) -> list[str]:
    """The precondition markers a test carries (its own, its class's, its module's)."""
    return [name for name in CHECKS if item.get_closest_marker(name) is not None]


def _forced() -> set[str]:
    names = {name.strip() for name in os.environ.get(FORCE_MISSING_ENV, "").split(",") if name.strip()}
    return set(CHECKS) if "all" in names else names


def _external_endpoint_only(item: pytest.Item) -> bool:
    """True for a client or bridge test pointed at an existing computer-server (``ALE_IAC_TEST_ENDPOINT``):
    it reaches the server through ``computer_server_endpoint`` and starts no local sandbox."""
    names = set(getattr(item, "fixturenames", ()))
    local = {"local_sandbox", "sandbox_factory", "desktop_image"}
    return bool(os.environ.get(TEST_ENDPOINT_ENV)) and "computer_server_endpoint" in names and not names & local


def missing(item: pytest.Item) -> list[str]:
    """``"<marker>: <why>"`` for each precondition of ``item`` this host does not meet."""
    forced = _forced()
    reasons = []
    for name in markers_of(item):
        if name in forced:
            reasons.append(f"{name}: forced missing by {FORCE_MISSING_ENV}={os.environ[FORCE_MISSING_ENV]}")
            continue
        if name == "sandbox" and _external_endpoint_only(item):
            continue
        why = CHECKS[name]()
        if why is not None:
            reasons.append(f"{name}: {why}")
    return reasons
