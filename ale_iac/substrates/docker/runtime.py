"""The ``docker`` substrate's driver: create, inspect, stop and list unit containers; no Pulumi.

One unit is three kinds of engine objects, all labelled ``ale-iac.sandbox=<id>`` (plus home, stack, unit,
run, profile and expiry), so that :func:`stop` and ``ale-iac gc`` find every one of them by label:

* a **network** of its own (``ale-iac-<id>``, a /28 from ``10.213.0.0/16``, inter-container traffic off),
  whose Linux bridge is named ``alesb<hex>`` (no outbound) or ``aleob<hex>`` (outbound allowed). Two host
  firewall rules, installed once and checked at every create (:func:`ensure_firewall`), match those names:
  ``DOCKER-USER -i alesb+ -j DROP`` (nothing from a no-outbound unit is forwarded anywhere, DNS included:
  the engine's resolver forwards from the container's own namespace) and ``INPUT -i alesb+/aleob+ -m
  conntrack --ctstate NEW,INVALID -j DROP`` (no unit opens a connection to the host itself; the replies of
  the host's connections into the unit still pass). A network per unit because an ``--internal`` network
  cannot publish a port, and ``--network none`` has nothing to publish from;
* four **volumes**: ``/root`` (the home, where work dirs go), ``/data`` (task data), ``/media`` (ALE tasks'
  data root, ``/media/user/data/agenthle``) and ``/opt/ale-iac`` (the endpoint's forwarder and token).
  The root file system is read-only; ``/tmp``, ``/run``, ``/var/tmp``
  and ``/var/log/ale`` are tmpfs. The volumes are what the engine's archive API can write into (it writes
  below a container's mounts, not into its tmpfs, and never into a read-only root);
* the **container**: PID 1 is ``/bin/sh -c 'forwarder & exec ale-init'``, so the image's ``ale-init`` is
  PID 1 and reaps the forwarder too. The computer-server listens on the container's ``127.0.0.1:8000``;
  ``ale_iac/substrates/authproxy.py`` (standard library only, copied in with ``put_archive`` before the
  start, 0600) listens on ``:8443``, which is published on the host's ``127.0.0.1`` only, and admits a
  request only with the unit's bearer token, and serves the model channel on the container's
  ``127.0.0.1:4010`` (``--model-listen``). The token is made here and copied in the same way (0600): it
  is in no environment variable, command line, label or other configuration ``docker inspect`` shows.

The container's ``ale-iac.spec`` label is the unit's spec (image, screen, limits, labels, expiry; no token):
:func:`reset` reads it to remake a pool unit under the same id, and :func:`current` reads the endpoint and
the token a reset gave it (the port from the engine, the token from the container's own file, through the
archive API: never an environment variable or a command line).

The walls beyond the engine's defaults (``walls``): a user namespace (ale-iac's own engine runs with
``userns-remap``), ale-iac's seccomp policy, AppArmor where the host has it, and a disk of the unit's own
(``disk_gb``, ext4, nosuid,nodev) under its volumes; each recorded in ``ale-iac.limits`` as applied or not.

Limits come from the shape: ``vcpus`` as a CPU quota (``NanoCpus``; none when the shape asks at least every
CPU of the engine's host, recorded as fitted to the host), ``memory_gb`` as memory with no swap on top,
``shm_gb`` as ``/dev/shm``, ``pids_limit``; what became of each is in the container's ``ale-iac.limits``
label (:func:`limits_of`, the unit's record). No privileged mode, no added capability (six of the engine's
defaults dropped: the set left is the local substrate's), ``no-new-privileges``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from ale_iac.docker_engine import client
from ale_iac.errors import AleIacError
from ale_iac.hostcheck import fit_cpu_quota
from ale_iac.paths import home_id
from ale_iac.substrates.authproxy import unit_entry
from ale_iac.substrates.docker import walls

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

LABEL = "ale-iac."
LABEL_KIND = f"{LABEL}kind"
KIND = "sandbox"
LABEL_SANDBOX = f"{LABEL}sandbox"
LABEL_HOME = f"{LABEL}home"
LABEL_EXPIRES = f"{LABEL}expires"
LABEL_SPEC = f"{LABEL}spec"
"""On the container only: its :class:`DockerSandboxSpec` as JSON (what :func:`reset` starts again)."""
LABEL_LIMITS = f"{LABEL}limits"
"""On the container only: its :class:`Limit` records as JSON, what became of each limit asked (:func:`limits_of`)."""
IDENTITY_LABELS = ("stack", "unit", "run", "profile")
"""Unit labels that become ``ale-iac.<name>`` labels of its engine objects."""

SERVER_PORT = 8000
PROXY_PORT = 8443
INIT = "/usr/local/sbin/ale-init"
PYTHON = "/usr/bin/python3"
ALE_DIR = "/opt/ale-iac"
TOKEN_FILE = "token"
PROXY_FILE = "authproxy.py"
VOLUMES = {"home": "/root", "data": "/data", "media": "/media", "ale": ALE_DIR}
"""Volume role -> mount point. The archive transport reaches exactly these (see :func:`archive_reaches`)."""
TMPFS = {
    "/tmp": "rw,exec,nosuid,nodev,size=2g,mode=1777",
    "/var/tmp": "rw,nosuid,nodev,size=1g,mode=1777",
    "/run": "rw,nosuid,nodev,size=64m,mode=0755",
    "/var/log/ale": "rw,nosuid,nodev,noexec,size=256m,mode=0700",
}
DROPPED_CAPS = ["AUDIT_WRITE", "FSETID", "MKNOD", "NET_RAW", "SETFCAP", "SETPCAP"]
"""Of the engine's default set; what is left is the local substrate's: CHOWN, DAC_OVERRIDE, FOWNER, KILL,
SETGID, SETUID, NET_BIND_SERVICE, SYS_CHROOT."""
DEFAULT_PIDS_LIMIT = 4096
DEFAULT_SHM_GB = 1.0
DEFAULT_DISK_GB = 16.0
NO_OUTBOUND_BRIDGE = "alesb"
OUTBOUND_BRIDGE = "aleob"
PUBLISH: dict[str, Any] = {f"{PROXY_PORT}/tcp": ("127.0.0.1", None)}
"""The forwarder's port, on the host's loopback only, at a port the engine picks."""
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")
SUBNET_PREFIX = 28
_SUBNET_TRIES = 16
_CHUNK = 1 << 20


class DockerSubstrateError(AleIacError):
    """The engine refused or failed an operation on a unit; the message names the unit."""


@dataclass(frozen=True)
class DockerSandboxSpec:
    sandbox_id: str
    image: str
    """Engine image tag (``ale-iac/desktop:<hash12>``)."""
    screen_width: int = 1280
    screen_height: int = 800
    allow_outbound: bool = False
    vcpus: int | None = None
    memory_gb: float | None = None
    shm_gb: float = DEFAULT_SHM_GB
    pids_limit: int = DEFAULT_PIDS_LIMIT
    labels: dict[str, str] = field(default_factory=dict)
    expires_at: str | None = None
    disk_gb: float = DEFAULT_DISK_GB
    """The unit's disk: its four volumes share one ext4 file system of this size (``walls.make_disk``)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DockerSandboxSpec:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass(frozen=True)
class Limit:
    name: str
    requested: str | None
    applied: bool
    detail: str = ""


@dataclass(frozen=True)
class HostResources:
    """What the engine's host has (``docker info``): a shape's limits are fitted to it."""

    cpus: int
    memory_bytes: int


def host_resources(engine: DockerClient) -> HostResources:
    info = engine.info()
    return HostResources(cpus=int(info.get("NCPU") or 1), memory_bytes=int(info.get("MemTotal") or 0))


@dataclass(frozen=True)
class DockerSandboxState:
    sandbox_id: str
    container_id: str
    container_name: str
    endpoint: str
    host_port: int
    token: str
    network: str
    volumes: list[str]
    labels: dict[str, str]
    limits: list[Limit]
    running: bool = True


@dataclass(frozen=True)
class DockerSandboxInfo:
    """A unit container as the engine reports it (for ``gc`` and ``list``)."""

    sandbox_id: str
    container_id: str
    name: str
    status: str
    labels: dict[str, str]


@contextlib.contextmanager
def _engine(engine: DockerClient | None) -> Iterator[DockerClient]:
    if engine is not None:
        yield engine
        return
    own = client()
    try:
        yield own
    finally:
        own.close()


def container_name(sandbox_id: str) -> str:
    return f"ale-iac-{sandbox_id}"


def bridge_name(sandbox_id: str, allow_outbound: bool) -> str:
    """Linux bridge names are at most 15 characters: a prefix the firewall matches, then 10 hex digits."""
    import hashlib

    digest = hashlib.sha256(sandbox_id.encode()).hexdigest()[:10]
    return f"{OUTBOUND_BRIDGE if allow_outbound else NO_OUTBOUND_BRIDGE}{digest}"


# --- the host firewall -------------------------------------------------------------------------------

FIREWALL_RULES: tuple[tuple[str, ...], ...] = (
    ("DOCKER-USER", "-i", f"{NO_OUTBOUND_BRIDGE}+", "-j", "DROP"),
    ("INPUT", "-i", f"{NO_OUTBOUND_BRIDGE}+", "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP"),
    ("INPUT", "-i", f"{OUTBOUND_BRIDGE}+", "-m", "conntrack", "--ctstate", "NEW,INVALID", "-j", "DROP"),
)


def firewall_status() -> tuple[bool, str]:
    """Whether every rule of :data:`FIREWALL_RULES` is in place (for ``doctor``), and what is missing."""
    iptables = shutil.which("iptables")
    if iptables is None:
        return False, "iptables is not installed"
    missing = [" ".join(rule) for rule in FIREWALL_RULES if not _rule_present(iptables, rule)]
    return (not missing), ("missing: " + "; ".join(missing)) if missing else "in place"


def _rule_present(iptables: str, rule: tuple[str, ...]) -> bool:
    done = subprocess.run([iptables, "-w", "-C", *rule], capture_output=True, check=False)
    return done.returncode == 0


def ensure_firewall() -> None:
    """Install the rules that keep units off the host and (without outbound) off every network. Fails
    closed: a unit is not created when they cannot be checked or added."""
    iptables = shutil.which("iptables")
    if iptables is None:
        raise DockerSubstrateError("iptables is not installed: docker units cannot be walled off the network")
    for rule in FIREWALL_RULES:
        if _rule_present(iptables, rule):
            continue
        done = subprocess.run([iptables, "-w", "-I", *rule], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DockerSubstrateError(
                f"cannot add the firewall rule '{' '.join(rule)}' ({done.stderr.strip()}); "
                "docker units need root and an engine that manages iptables (the DOCKER-USER chain)"
            )


# --- create ------------------------------------------------------------------------------------------


def _labels(spec: DockerSandboxSpec) -> dict[str, str]:
    labels = {LABEL_KIND: KIND, LABEL_SANDBOX: spec.sandbox_id, LABEL_HOME: home_id()}
    for name in IDENTITY_LABELS:
        if name in spec.labels:
            labels[f"{LABEL}{name}"] = spec.labels[name]
    if spec.expires_at:
        labels[LABEL_EXPIRES] = spec.expires_at
    return labels


def _subnets(sandbox_id: str) -> Iterator[ipaddress.IPv4Network]:
    count = 2 ** (SUBNET_PREFIX - SUBNET_POOL.prefixlen)
    start = int.from_bytes(secrets.token_bytes(4), "big") % count
    base = int(SUBNET_POOL.network_address)
    size = 2 ** (32 - SUBNET_PREFIX)
    for step in range(_SUBNET_TRIES):
        yield ipaddress.IPv4Network((base + ((start + step) % count) * size, SUBNET_PREFIX))


def _create_network(engine: DockerClient, spec: DockerSandboxSpec, labels: dict[str, str]) -> str:
    from docker.errors import APIError
    from docker.types import IPAMConfig, IPAMPool

    name = container_name(spec.sandbox_id)
    last = ""
    for subnet in _subnets(spec.sandbox_id):
        hosts = list(subnet.hosts())
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet), gateway=str(hosts[0]))])
        try:
            engine.networks.create(
                name,
                driver="bridge",
                ipam=ipam,
                labels=labels,
                options={
                    "com.docker.network.bridge.name": bridge_name(spec.sandbox_id, spec.allow_outbound),
                    "com.docker.network.bridge.enable_icc": "false",
                },
            )
            return name
        except APIError as exc:
            last = str(exc)
            if "overlap" not in last.lower():
                raise
    raise DockerSubstrateError(f"no free /{SUBNET_PREFIX} in {SUBNET_POOL} for {spec.sandbox_id}: {last}")


def _tar_of(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _command(spec: DockerSandboxSpec) -> list[str]:
    return unit_entry(
        python=PYTHON,
        proxy_file=f"{ALE_DIR}/{PROXY_FILE}",
        token_file=f"{ALE_DIR}/{TOKEN_FILE}",
        listen=f"0.0.0.0:{PROXY_PORT}",
        init=INIT,
        server_port=SERVER_PORT,
        width=spec.screen_width,
        height=spec.screen_height,
    )


def _limits(spec: DockerSandboxSpec, host: HostResources) -> tuple[dict[str, Any], list[Limit]]:
    """The engine's arguments for the shape's limits, and what became of each. The CPU quota is fitted
    to the host as the local substrate fits its own (``hostcheck.fit_cpu_quota``: a shape asking at least
    every CPU gets no quota; the engine would refuse one above its CPUs). Memory is set as asked (the
    engine takes a limit above the host's); the record then says the host's memory is the real bound."""
    kwargs: dict[str, Any] = {
        "pids_limit": int(spec.pids_limit),
        "shm_size": f"{max(1, round(spec.shm_gb * 1024))}m",
    }
    limits = [
        Limit("pids", str(spec.pids_limit), True),
        Limit("shm", f"{spec.shm_gb:g}GiB", True),
    ]
    cpus, fitted = fit_cpu_quota(spec.vcpus, host.cpus)
    if cpus is not None:
        kwargs["nano_cpus"] = int(cpus * 1_000_000_000)
    limits.append(Limit("cpu", None if spec.vcpus is None else str(spec.vcpus), cpus is not None, fitted or ""))
    detail = ""
    if spec.memory_gb is not None:
        memory = f"{max(64, round(spec.memory_gb * 1024))}m"
        kwargs.update(mem_limit=memory, memswap_limit=memory)
        if host.memory_bytes and spec.memory_gb * 2**30 > host.memory_bytes:
            detail = (
                f"above the host's memory: it has {host.memory_bytes / 2**30:.1f} GiB, the shape asked "
                f"{spec.memory_gb:g} GiB; the host's memory is the real bound"
            )
    limits.append(
        Limit(
            "memory", None if spec.memory_gb is None else f"{spec.memory_gb:g}GiB", spec.memory_gb is not None, detail
        )
    )
    return kwargs, limits


def limits_of(sandbox_id: str, engine: DockerClient | None = None) -> list[Limit] | None:
    """What became of the limits the unit's shape asked (as its container records them), or None when
    its container is gone or records none."""
    with _engine(engine) as docker_engine:
        found = docker_engine.containers.list(
            all=True, filters={"label": [f"{LABEL_SANDBOX}={sandbox_id}", f"{LABEL_KIND}={KIND}"]}
        )
    recorded = found[0].labels.get(LABEL_LIMITS) if found else None
    if not recorded:
        return None
    return [Limit(**item) for item in json.loads(recorded)]


def _volumes(
    engine: DockerClient, spec: DockerSandboxSpec, labels: dict[str, str], security: walls.EngineSecurity
) -> tuple[dict[str, dict[str, str]], list[Limit]]:
    """The unit's four volumes, binds of folders of its own disk (``walls.make_disk``: ext4 of ``disk_gb``,
    mounted nosuid,nodev), and the records of both walls."""
    owner = (security.remap_uid, security.remap_gid)
    folders = walls.make_disk(spec.sandbox_id, spec.disk_gb, list(VOLUMES), owner, labels)
    volumes: dict[str, dict[str, str]] = {}
    for role, mount in VOLUMES.items():
        volume = engine.volumes.create(
            f"{container_name(spec.sandbox_id)}-{role}",
            driver="local",
            driver_opts=walls.volume_options(folders[role]),
            labels=labels,
        )
        volumes[str(volume.name)] = {"bind": mount, "mode": "rw"}
    records = [
        Limit("disk", f"{spec.disk_gb:g}GiB", True, "the four volumes share one ext4 file system of this size"),
        Limit("nosuid", None, True, "every writable mount is nosuid,nodev: the volumes' disk, and each tmpfs"),
    ]
    return volumes, records


def start(spec: DockerSandboxSpec, engine: DockerClient | None = None) -> DockerSandboxState:
    """Create and start a unit's network, volumes and container; returns once the engine runs it (the
    endpoint answers a little later: readiness is the caller's). Whatever was made is removed on failure."""
    from docker.errors import DockerException

    ensure_firewall()
    labels = _labels(spec)
    token = secrets.token_urlsafe(32)
    proxy_source = (Path(__file__).resolve().parent.parent / "authproxy.py").read_bytes()
    with _engine(engine) as docker_engine:
        try:
            network = _create_network(docker_engine, spec, labels)
            security = walls.engine_security(docker_engine)
            volumes, disk_limits = _volumes(docker_engine, spec, labels, security)
            kwargs, limits = _limits(spec, host_resources(docker_engine))
            options, records = walls.container_options(security)
            limits += [Limit(name, None, applied, detail) for name, applied, detail in records] + disk_limits
            recorded = json.dumps([dataclasses.asdict(limit) for limit in limits])
            container = docker_engine.containers.create(
                spec.image,
                command=_command(spec),
                entrypoint=[],
                name=container_name(spec.sandbox_id),
                labels={**labels, LABEL_SPEC: spec.to_json(), LABEL_LIMITS: recorded},
                network=network,
                ports=PUBLISH,
                volumes=volumes,
                tmpfs=TMPFS,
                read_only=True,
                cap_drop=DROPPED_CAPS,
                privileged=False,
                hostname="sandbox",
                environment={"LANG": "C.UTF-8"},
                **options,
                **kwargs,
            )
            payload = _tar_of({TOKEN_FILE: (token.encode() + b"\n", 0o600), PROXY_FILE: (proxy_source, 0o600)})
            if not container.put_archive(ALE_DIR, payload):
                raise DockerSubstrateError(f"could not copy the endpoint's forwarder into {container.name}")
            container.start()
            state = _state_of(docker_engine, container, token)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                _remove_all(docker_engine, spec.sandbox_id)
            if isinstance(exc, DockerException):
                raise DockerSubstrateError(f"docker unit {spec.sandbox_id}: {exc}") from None
            raise
    if state is None:
        raise DockerSubstrateError(f"docker unit {spec.sandbox_id} exited at once; see `docker logs`")
    return dataclasses.replace(state, limits=limits)


def reset(sandbox_id: str, engine: DockerClient | None = None) -> DockerSandboxState:
    """Replace a unit by a fresh one of the same spec under the same id (a pool unit between leases).

    Nothing of the old one survives: :func:`stop` removes its container (the writable layer, every
    process, the X display and so its clipboard and windows), its network and its four volumes (the home
    among them); :func:`start` makes them all anew, with a new host port, subnet and token. The id, and so
    the Pulumi resource that owns it, stay the same.
    """
    with _engine(engine) as docker_engine:
        found = docker_engine.containers.list(
            all=True, filters={"label": [f"{LABEL_SANDBOX}={sandbox_id}", f"{LABEL_KIND}={KIND}"]}
        )
        if not found:
            raise DockerSubstrateError(f"docker unit {sandbox_id} does not exist: nothing to reset")
        recorded = found[0].labels.get(LABEL_SPEC)
        if not recorded:
            raise DockerSubstrateError(
                f"docker unit {sandbox_id} records no spec (made before pool resets existed); replace it with "
                "pulumi up --replace"
            )
        spec = DockerSandboxSpec.from_json(recorded)
        _remove_all(docker_engine, sandbox_id)
        return start(spec, docker_engine)


def current(
    sandbox_id: str, known_container: str | None = None, engine: DockerClient | None = None
) -> DockerSandboxState | None:
    """The unit's container as it is now, with its endpoint and token; None when it is gone, or when it
    is still ``known_container`` (then what the stack recorded at creation is still right).

    The token is read from the container's own file with the archive API (the engine's socket only)."""
    from docker.errors import NotFound

    with _engine(engine) as docker_engine:
        try:
            container = docker_engine.containers.get(container_name(sandbox_id))
        except NotFound:
            return None
        if container.labels.get(LABEL_SANDBOX) != sandbox_id or container.id == known_container:
            return None
        stream, _stat = docker_engine.api.get_archive(str(container.id), f"{ALE_DIR}/{TOKEN_FILE}")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            source = tar.extractfile(member) if member is not None else None
            token = source.read().decode().strip() if source is not None else ""
        if not token:
            raise DockerSubstrateError(f"docker unit {sandbox_id} has no endpoint token")
        return _state_of(docker_engine, container, token)


def _state_of(engine: DockerClient, container: Container, token: str) -> DockerSandboxState | None:
    container.reload()
    attrs = container.attrs
    ports = attrs.get("NetworkSettings", {}).get("Ports") or {}
    bound = ports.get(f"{PROXY_PORT}/tcp") or []
    if not bound:
        return None
    host_port = int(bound[0]["HostPort"])
    labels = dict(container.labels)
    sandbox_id = labels.get(LABEL_SANDBOX, "")
    name = container_name(sandbox_id)
    return DockerSandboxState(
        sandbox_id=sandbox_id,
        container_id=str(container.id),
        container_name=str(container.name),
        endpoint=f"http://127.0.0.1:{host_port}",
        host_port=host_port,
        token=token,
        network=name,
        volumes=[f"{name}-{role}" for role in VOLUMES],
        labels=labels,
        limits=[],
        running=container.status == "running",
    )


# --- inspect, list, stop -------------------------------------------------------------------------------


def inspect(sandbox_id: str, engine: DockerClient | None = None) -> DockerSandboxInfo | None:
    """The unit's container as the engine has it (whichever home made it), or None when it is gone."""
    found = list_sandboxes(engine, sandbox_id=sandbox_id, this_home=False)
    return found[0] if found else None


def list_sandboxes(
    engine: DockerClient | None = None, *, sandbox_id: str | None = None, this_home: bool = True
) -> list[DockerSandboxInfo]:
    """Unit containers by label (running or not): this home's, or one unit's."""
    filters = [f"{LABEL_KIND}={KIND}"]
    if sandbox_id is not None:
        filters.append(f"{LABEL_SANDBOX}={sandbox_id}")
    if this_home:
        filters.append(f"{LABEL_HOME}={home_id()}")
    with _engine(engine) as docker_engine:
        containers = docker_engine.containers.list(all=True, filters={"label": filters})
        return [
            DockerSandboxInfo(
                sandbox_id=str(c.labels.get(LABEL_SANDBOX, "")),
                container_id=str(c.id),
                name=str(c.name),
                status=str(c.status),
                labels=dict(c.labels),
            )
            for c in containers
        ]


def orphan_objects(engine: DockerClient | None = None) -> dict[str, dict[str, str]]:
    """This home's units that have a network or volumes but no container (a create or stop killed
    half-way): sandbox id -> the labels of one of those objects."""
    label = [f"{LABEL_KIND}={KIND}", f"{LABEL_HOME}={home_id()}"]
    found: dict[str, dict[str, str]] = {}
    with _engine(engine) as docker_engine:
        objects = [n.attrs for n in docker_engine.networks.list(filters={"label": label})]
        objects += [v.attrs for v in docker_engine.volumes.list(filters={"label": label})]
        for attrs in objects:
            labels = {str(k): str(v) for k, v in (attrs.get("Labels") or {}).items()}
            if labels.get(LABEL_SANDBOX):
                found.setdefault(labels[LABEL_SANDBOX], labels)
        for sandbox_id, labels in walls.disks().items():
            found.setdefault(sandbox_id, labels)
        for unit in list_sandboxes(docker_engine):
            found.pop(unit.sandbox_id, None)
    return found


def stop(sandbox_id: str, engine: DockerClient | None = None) -> bool:
    """Remove the unit's container, network and volumes (found by label). Idempotent; True if a container was there."""
    with _engine(engine) as docker_engine:
        return _remove_all(docker_engine, sandbox_id)


def _remove_all(engine: DockerClient, sandbox_id: str) -> bool:
    from docker.errors import NotFound

    label: dict[str, Any] = {"label": [f"{LABEL_SANDBOX}={sandbox_id}", f"{LABEL_KIND}={KIND}"]}
    had = False
    for container in engine.containers.list(all=True, filters=label):
        had = True
        with contextlib.suppress(NotFound):
            container.remove(force=True, v=True)
    for network in engine.networks.list(filters=label):
        with contextlib.suppress(NotFound):
            network.remove()
    for volume in engine.volumes.list(filters=label):
        with contextlib.suppress(NotFound):
            volume.remove(force=True)
    walls.remove_disk(sandbox_id)  # after the volumes: they are binds of its folders
    return had


def inspect_limits(container_id: str, engine: DockerClient | None = None) -> dict[str, Any]:
    """The HostConfig fields the limits and walls live in, as the engine applied them."""
    with _engine(engine) as docker_engine:
        host = docker_engine.api.inspect_container(container_id)["HostConfig"]
    keys = (
        "NanoCpus", "Memory", "MemorySwap", "ShmSize", "PidsLimit", "ReadonlyRootfs", "Privileged",
        "CapAdd", "CapDrop", "SecurityOpt", "PortBindings", "Binds", "Mounts", "Tmpfs", "NetworkMode",
    )  # fmt: skip
    return {key: host.get(key) for key in keys}


# --- the archive API ----------------------------------------------------------------------------------


def archive_reaches(remote: str) -> bool:
    """Whether the archive API can write ``remote`` of a unit: a path on one of its volumes."""
    path = PurePosixPath(remote)
    if not path.is_absolute() or ".." in path.parts:
        return False
    return any(path == PurePosixPath(m) or PurePosixPath(m) in path.parents for m in VOLUMES.values())


def _mount_of(remote: str) -> PurePosixPath:
    path = PurePosixPath(remote)
    return next(
        PurePosixPath(m) for m in VOLUMES.values() if path == PurePosixPath(m) or PurePosixPath(m) in path.parents
    )


def _write_tar(local: Path, prefix: PurePosixPath, sink: IO[bytes], counter: list[int]) -> None:
    with tarfile.open(fileobj=sink, mode="w|", bufsize=_CHUNK) as tar:
        parts = prefix.parts
        for depth in range(1, len(parts) + 1):
            info = tarfile.TarInfo(str(PurePosixPath(*parts[:depth])))
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 0, 0
            tar.addfile(info)
        for path in sorted(local.rglob("*")):
            name = str(prefix / path.relative_to(local).as_posix())
            if path.is_symlink():
                continue
            if path.is_dir():
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 0, 0
                tar.addfile(info)
            elif path.is_file():
                info = tarfile.TarInfo(name)
                stat = path.stat()
                info.size, info.mtime, info.uid, info.gid = stat.st_size, int(stat.st_mtime), 0, 0
                info.mode = 0o755 if stat.st_mode & 0o100 else 0o644
                with path.open("rb") as source:
                    tar.addfile(info, source)
                counter[0] += 1


def copy_in(container_id: str, local: Path, remote: str, engine: DockerClient | None = None) -> int:
    """Copy a host folder into ``remote`` (on a volume of the unit) with the archive API, streamed as a
    tar (parents made, root-owned, modes 0644/0755); returns the number of files."""
    if not archive_reaches(remote):
        raise DockerSubstrateError(f"{remote} is on no volume of the unit: the archive API cannot write it")
    mount = _mount_of(remote)
    read_fd, write_fd = os.pipe()
    counter = [0]
    failure: list[BaseException] = []

    def produce() -> None:
        with os.fdopen(write_fd, "wb") as sink:
            try:
                _write_tar(local, PurePosixPath(remote).relative_to(mount), sink, counter)
            except BrokenPipeError:
                pass
            except BaseException as exc:
                failure.append(exc)

    writer = threading.Thread(target=produce, name="ale-iac-archive-in", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as source, _engine(engine) as docker_engine:
        chunks = iter(lambda: source.read(_CHUNK), b"")
        ok = docker_engine.api.put_archive(container_id, str(mount), chunks)
    writer.join()
    if failure:
        raise failure[0]
    if not ok:
        raise DockerSubstrateError(f"the engine refused the archive for {remote}")
    return counter[0]


class _ChunkReader:
    """A file-like ``read`` over the engine's stream of chunks: all that tarfile's stream mode needs."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.pending = b""

    def read(self, size: int = -1) -> bytes:
        parts = [self.pending]
        have = len(self.pending)
        while size < 0 or have < size:
            chunk = next(self.chunks, b"")
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        if size < 0:
            self.pending = b""
            return data
        self.pending = data[size:]
        return data[:size]


def copy_out(container_id: str, remote: str, local: Path, engine: DockerClient | None = None) -> int:
    """Copy a unit folder to the host with the archive API (regular files only, never outside ``local``);
    returns the number of files, 0 when ``remote`` does not exist."""
    from docker.errors import NotFound

    local.mkdir(parents=True, exist_ok=True)
    root = local.resolve()
    count = 0
    with _engine(engine) as docker_engine:
        try:
            stream, _stat = docker_engine.api.get_archive(container_id, remote, chunk_size=_CHUNK)
        except NotFound:
            return 0
        with tarfile.open(fileobj=_ChunkReader(iter(stream)), mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                parts = PurePosixPath(member.name).parts[1:]  # the first is the folder's own name
                if not member.isreg() or not parts:
                    continue
                if ".." in parts or member.name.startswith("/"):
                    raise DockerSubstrateError(f"refusing to pull {member.name!r} from {remote}: it points outside")
                dest = root.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.parent.resolve().is_relative_to(root):
                    raise DockerSubstrateError(f"refusing to pull {member.name!r} from {remote}: it points outside")
                if dest.is_symlink():
                    dest.unlink()
                source = tar.extractfile(member)
                assert source is not None
                with dest.open("wb") as sink:
                    shutil.copyfileobj(source, sink, _CHUNK)
                count += 1
    return count
