"""Shape tables: how a task's resource hints (vCPUs, memory, GPU) become a machine/instance type.

Each cloud has one table, ordered from cheapest to dearest by an approximate on-demand list price
(USD per hour, Linux, a common region, at the time of writing). Only the *order* is used: the
"smallest type that satisfies the hints" is the first row that has at least the requested vCPUs,
at least the requested memory, and exactly the requested GPU kind (none when no GPU is asked for,
so a CPU task never lands on a GPU machine). ``docs/clouds.md`` prints the same tables.

Precedence, highest first (see :func:`resolve_shape`):

1. the task's ``machine_type`` (used verbatim: the explicit override);
2. the task's ``vcpus`` / ``memory_gb`` / ``gpu`` hints (the route's ``gpu`` fills a missing GPU);
3. the route's ``machine_type``;
4. the route's ``gpu`` alone (smallest type with that GPU);
5. the cloud's default type.

Disk size: the task's ``disk_gb``, else the route's ``disk_gb``, else the image's own size.
Nothing here imports a cloud SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ale_iac.contract import Shape
from ale_iac.errors import AleIacError

if TYPE_CHECKING:
    from ale_iac.cloud_routes import CloudRouteBase
    from ale_iac.contract import UnitSpec


class ShapeError(AleIacError):
    """No machine type satisfies a unit's shape hints (or an unknown GPU kind was asked for)."""


@dataclass(frozen=True)
class InstanceType:
    """One row of a shape table."""

    name: str
    vcpus: int
    memory_gb: float
    usd_per_hour: float
    gpu: str | None = None
    gpu_count: int = 0
    accelerator: str | None = None
    """GCE only: guest accelerator to attach explicitly (types like g2 carry their GPU built in)."""


def _cpu(name: str, vcpus: int, memory_gb: float, price: float) -> InstanceType:
    return InstanceType(name, vcpus, memory_gb, price)


def _gpu(
    name: str, vcpus: int, memory_gb: float, price: float, gpu: str, accelerator: str | None = None
) -> InstanceType:
    return InstanceType(name, vcpus, memory_gb, price, gpu=gpu, gpu_count=1, accelerator=accelerator)


GCE_TYPES: tuple[InstanceType, ...] = tuple(
    sorted(
        (
            _cpu("n2-highcpu-2", 2, 2, 0.072),
            _cpu("n2-standard-2", 2, 8, 0.097),
            _cpu("n2-highmem-2", 2, 16, 0.131),
            _cpu("n2-highcpu-4", 4, 4, 0.143),
            _cpu("n2-standard-4", 4, 16, 0.194),
            _cpu("n2-highmem-4", 4, 32, 0.262),
            _cpu("n2-highcpu-8", 8, 8, 0.287),
            _cpu("n2-standard-8", 8, 32, 0.388),
            _cpu("n2-highmem-8", 8, 64, 0.524),
            _cpu("n2-highcpu-16", 16, 16, 0.574),
            _cpu("n2-standard-16", 16, 64, 0.777),
            _cpu("n2-highmem-16", 16, 128, 1.048),
            _cpu("n2-standard-32", 32, 128, 1.554),
            _gpu("n1-standard-4", 4, 15, 0.540, "t4", accelerator="nvidia-tesla-t4"),
            _gpu("n1-standard-8", 8, 30, 0.730, "t4", accelerator="nvidia-tesla-t4"),
            _gpu("n1-standard-16", 16, 60, 1.110, "t4", accelerator="nvidia-tesla-t4"),
            _gpu("g2-standard-4", 4, 16, 0.707, "l4"),
            _gpu("g2-standard-8", 8, 32, 0.854, "l4"),
            _gpu("g2-standard-12", 12, 48, 1.000, "l4"),
            _gpu("g2-standard-16", 16, 64, 1.147, "l4"),
            _gpu("g2-standard-32", 32, 128, 1.734, "l4"),
            # The vWS licence (Windows desktops with a GPU, as ALE's gpu-free snapshot) rides on a g2
            # machine with the accelerator named explicitly; the licence adds to the price.
            _gpu("g2-standard-4", 4, 16, 0.907, "l4-vws", accelerator="nvidia-l4-vws"),
            _gpu("g2-standard-8", 8, 32, 1.054, "l4-vws", accelerator="nvidia-l4-vws"),
            _gpu("g2-standard-16", 16, 64, 1.347, "l4-vws", accelerator="nvidia-l4-vws"),
        ),
        key=lambda t: t.usd_per_hour,
    )
)

EC2_TYPES: tuple[InstanceType, ...] = tuple(
    sorted(
        (
            _cpu("c6i.large", 2, 4, 0.085),
            _cpu("m6i.large", 2, 8, 0.096),
            _cpu("r6i.large", 2, 16, 0.126),
            _cpu("c6i.xlarge", 4, 8, 0.170),
            _cpu("m6i.xlarge", 4, 16, 0.192),
            _cpu("r6i.xlarge", 4, 32, 0.252),
            _cpu("c6i.2xlarge", 8, 16, 0.340),
            _cpu("m6i.2xlarge", 8, 32, 0.384),
            _cpu("r6i.2xlarge", 8, 64, 0.504),
            _cpu("c6i.4xlarge", 16, 32, 0.680),
            _cpu("m6i.4xlarge", 16, 64, 0.768),
            _cpu("r6i.4xlarge", 16, 128, 1.008),
            _cpu("m6i.8xlarge", 32, 128, 1.536),
            _cpu("r6i.8xlarge", 32, 256, 2.016),
            _cpu("m6i.16xlarge", 64, 256, 3.072),
            _gpu("g4dn.xlarge", 4, 16, 0.526, "t4"),
            _gpu("g4dn.2xlarge", 8, 32, 0.752, "t4"),
            _gpu("g4dn.4xlarge", 16, 64, 1.204, "t4"),
            _gpu("g6.xlarge", 4, 16, 0.805, "l4"),
            _gpu("g6.2xlarge", 8, 32, 0.978, "l4"),
            _gpu("g6.4xlarge", 16, 64, 1.323, "l4"),
            _gpu("g5.xlarge", 4, 16, 1.006, "a10g"),
            _gpu("g5.2xlarge", 8, 32, 1.212, "a10g"),
            _gpu("g5.4xlarge", 16, 64, 1.624, "a10g"),
        ),
        key=lambda t: t.usd_per_hour,
    )
)

ECS_TYPES: tuple[InstanceType, ...] = tuple(
    sorted(
        (
            _cpu("ecs.c7.large", 2, 4, 0.090),
            _cpu("ecs.g7.large", 2, 8, 0.110),
            _cpu("ecs.r7.large", 2, 16, 0.140),
            _cpu("ecs.c7.xlarge", 4, 8, 0.180),
            _cpu("ecs.g7.xlarge", 4, 16, 0.220),
            _cpu("ecs.r7.xlarge", 4, 32, 0.280),
            _cpu("ecs.c7.2xlarge", 8, 16, 0.360),
            _cpu("ecs.g7.2xlarge", 8, 32, 0.440),
            _cpu("ecs.r7.2xlarge", 8, 64, 0.560),
            _cpu("ecs.c7.4xlarge", 16, 32, 0.720),
            _cpu("ecs.g7.4xlarge", 16, 64, 0.880),
            _cpu("ecs.r7.4xlarge", 16, 128, 1.120),
            _cpu("ecs.g7.8xlarge", 32, 128, 1.760),
            _gpu("ecs.gn6i-c4g1.xlarge", 4, 15, 0.630, "t4"),
            _gpu("ecs.gn6i-c8g1.2xlarge", 8, 31, 0.800, "t4"),
            _gpu("ecs.gn6i-c16g1.4xlarge", 16, 62, 1.100, "t4"),
            _gpu("ecs.gn7i-c8g1.2xlarge", 8, 30, 1.350, "a10"),
            _gpu("ecs.gn7i-c16g1.4xlarge", 16, 60, 1.600, "a10"),
            _gpu("ecs.gn7i-c32g1.8xlarge", 32, 188, 2.400, "a10"),
        ),
        key=lambda t: t.usd_per_hour,
    )
)

SHAPE_TABLES: dict[str, tuple[InstanceType, ...]] = {"gcloud": GCE_TYPES, "aws": EC2_TYPES, "aliyun": ECS_TYPES}
DEFAULT_TYPES: dict[str, str] = {"gcloud": "n2-standard-4", "aws": "m6i.xlarge", "aliyun": "ecs.g7.xlarge"}
"""Used when neither the task nor the route says anything: 4 vCPUs and 16 GiB, enough for a desktop."""

# GCE families whose machine types carry their GPUs (no guest accelerator to attach).
_GCE_BUILTIN_GPU_FAMILIES = ("g2-", "a2-", "a3-", "a4-", "g4-")
_GCE_ACCELERATORS = {
    "t4": "nvidia-tesla-t4",
    "l4-vws": "nvidia-l4-vws",
    "v100": "nvidia-tesla-v100",
    "p4": "nvidia-tesla-p4",
}


def canonical_gpu(name: str) -> str:
    """``nvidia-tesla-t4``, ``NVIDIA-T4`` and ``t4`` all mean ``t4``; ``nvidia-l4-vws`` is ``l4-vws``."""
    text = name.strip().lower()
    for prefix in ("nvidia-", "tesla-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


@dataclass(frozen=True)
class ResolvedShape:
    """What a cloud module needs to size a VM, and why it was chosen (shown in plans and errors)."""

    machine_type: str
    gpu: str | None
    accelerator: str | None
    disk_gb: int | None
    source: str
    """Which rule picked the type: task-override, task-hints, route-default, route-gpu, cloud-default."""


def pick_instance_type(
    cloud: str, vcpus: int | None, memory_gb: float | None, gpu: str | None, what: str = "unit"
) -> InstanceType:
    """The first (cheapest) row of ``cloud``'s table that satisfies the hints; ShapeError if none does."""
    table = SHAPE_TABLES[cloud]
    kind = canonical_gpu(gpu) if gpu else None
    candidates = [t for t in table if t.gpu == kind]
    if not candidates:
        known = sorted({t.gpu for t in table if t.gpu})
        raise ShapeError(
            f"{what}: {cloud} shape table has no type with GPU {gpu!r} (known: {', '.join(known)}); "
            "set shape.machine_type to choose a type explicitly"
        )
    for row in candidates:
        if (vcpus is None or row.vcpus >= vcpus) and (memory_gb is None or row.memory_gb >= memory_gb):
            return row
    biggest = max(candidates, key=lambda t: (t.vcpus, t.memory_gb))
    wanted = ", ".join(
        part
        for part in (
            f"vcpus>={vcpus}" if vcpus is not None else "",
            f"memory_gb>={memory_gb:g}" if memory_gb is not None else "",
            f"gpu={kind}" if kind else "no gpu",
        )
        if part
    )
    raise ShapeError(
        f"{what}: no {cloud} type in the shape table fits {wanted} (largest: {biggest.name}, "
        f"{biggest.vcpus} vCPU, {biggest.memory_gb:g} GiB); set shape.machine_type to choose a type explicitly"
    )


def _accelerator_for(cloud: str, machine_type: str, gpu: str | None) -> str | None:
    """GCE: the guest accelerator an explicitly named machine type needs for ``gpu`` (None otherwise)."""
    if cloud != "gcloud" or gpu is None:
        return None
    kind = canonical_gpu(gpu)
    for row in GCE_TYPES:
        if row.name == machine_type and row.gpu == kind:
            return row.accelerator
    if machine_type.startswith(_GCE_BUILTIN_GPU_FAMILIES) and kind != "l4-vws":
        return None
    return _GCE_ACCELERATORS.get(kind, f"nvidia-{kind}")


def resolve_shape(
    cloud: str,
    task: Shape,
    route_machine_type: str | None = None,
    route_gpu: str | None = None,
    route_disk_gb: int | None = None,
    what: str = "unit",
) -> ResolvedShape:
    """Apply the precedence of the module docstring to one unit."""
    disk = task.disk_gb if task.disk_gb is not None else route_disk_gb
    gpu = task.gpu if task.gpu is not None else route_gpu
    if task.machine_type:
        return ResolvedShape(
            task.machine_type, gpu, _accelerator_for(cloud, task.machine_type, gpu), disk, "task-override"
        )
    if task.vcpus is not None or task.memory_gb is not None or task.gpu is not None:
        row = pick_instance_type(cloud, task.vcpus, task.memory_gb, gpu, what)
        return ResolvedShape(row.name, row.gpu, row.accelerator, disk, "task-hints")
    if route_machine_type:
        return ResolvedShape(
            route_machine_type, gpu, _accelerator_for(cloud, route_machine_type, gpu), disk, "route-default"
        )
    if route_gpu is not None:
        row = pick_instance_type(cloud, None, None, route_gpu, what)
        return ResolvedShape(row.name, row.gpu, row.accelerator, disk, "route-gpu")
    return ResolvedShape(DEFAULT_TYPES[cloud], None, None, disk, "cloud-default")


def table_markdown(cloud: str) -> str:
    """The table as Markdown (docs/clouds.md embeds this; a test keeps the two in sync)."""
    lines = [
        "| order | type | vCPU | memory GiB | GPU | accelerator attached | approx. USD/h |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, row in enumerate(SHAPE_TABLES[cloud], start=1):
        lines.append(
            f"| {index} | `{row.name}` | {row.vcpus} | {row.memory_gb:g} | {row.gpu or '-'} | "
            f"{row.accelerator or '-'} | {row.usd_per_hour:.3f} |"
        )
    return "\n".join(lines)


def preflight(cloud: str, unit: UnitSpec, route: CloudRouteBase) -> ResolvedShape:
    """Everything about a cloud unit that can fail without the cloud (today: its shape), checked
    before any resource is registered; ``declare()`` may call it for every unit before declaring any."""
    return resolve_shape(cloud, unit.shape, route.machine_type, route.gpu, route.disk_gb, what=f"unit {unit.name!r}")
