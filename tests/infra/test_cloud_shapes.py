"""The shape tables: task hints -> machine/instance type, per cloud (pure functions, no Pulumi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.contract import Shape
from ale_iac.infra.shapes import (
    DEFAULT_TYPES,
    SHAPE_TABLES,
    ShapeError,
    canonical_gpu,
    pick_instance_type,
    resolve_shape,
    table_markdown,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "clouds.md"


@pytest.mark.parametrize("cloud", sorted(SHAPE_TABLES))
def test_shape_tables_are_ordered_cheapest_first_and_defaults_exist(cloud: str) -> None:
    table = SHAPE_TABLES[cloud]
    prices = [row.usd_per_hour for row in table]
    assert prices == sorted(prices)
    assert DEFAULT_TYPES[cloud] in {row.name for row in table if row.gpu is None}
    assert all(row.vcpus >= 2 and row.memory_gb >= 2 for row in table)


@pytest.mark.parametrize("cloud", sorted(SHAPE_TABLES))
def test_pick_is_the_cheapest_row_that_satisfies_every_hint(cloud: str) -> None:
    table = SHAPE_TABLES[cloud]
    for vcpus in (None, 1, 2, 3, 4, 6, 8, 12, 16, 32):
        for memory in (None, 2.0, 8.0, 15.5, 16.0, 30.0, 64.0, 100.0):
            for gpu in (None, *sorted({r.gpu for r in table if r.gpu})):
                fits = [
                    r
                    for r in table
                    if r.gpu == gpu
                    and (vcpus is None or r.vcpus >= vcpus)
                    and (memory is None or r.memory_gb >= memory)
                ]
                if not fits:
                    with pytest.raises(ShapeError):
                        pick_instance_type(cloud, vcpus, memory, gpu)
                    continue
                picked = pick_instance_type(cloud, vcpus, memory, gpu)
                assert picked == min(fits, key=lambda r: r.usd_per_hour), (cloud, vcpus, memory, gpu)


@pytest.mark.parametrize(
    ("cloud", "hints", "expected"),
    [
        ("gcloud", Shape(vcpus=4), "n2-highcpu-4"),
        ("gcloud", Shape(vcpus=4, memory_gb=16), "n2-standard-4"),
        ("gcloud", Shape(memory_gb=100), "n2-highmem-16"),
        ("gcloud", Shape(gpu="nvidia-tesla-t4"), "n1-standard-4"),
        ("gcloud", Shape(gpu="nvidia-l4", vcpus=10), "g2-standard-12"),
        ("aws", Shape(vcpus=2), "c6i.large"),
        ("aws", Shape(vcpus=4, memory_gb=16), "m6i.xlarge"),
        ("aws", Shape(vcpus=2, memory_gb=12), "r6i.large"),
        ("aws", Shape(gpu="t4"), "g4dn.xlarge"),
        ("aws", Shape(gpu="a10g", vcpus=16), "g5.4xlarge"),
        ("aliyun", Shape(vcpus=4, memory_gb=16), "ecs.g7.xlarge"),
        ("aliyun", Shape(vcpus=16, memory_gb=100), "ecs.r7.4xlarge"),
        ("aliyun", Shape(gpu="nvidia-t4", memory_gb=16), "ecs.gn6i-c8g1.2xlarge"),
        ("aliyun", Shape(gpu="a10"), "ecs.gn7i-c8g1.2xlarge"),
    ],
)
def test_documented_examples_of_the_shape_mapping(cloud: str, hints: Shape, expected: str) -> None:
    resolved = resolve_shape(cloud, hints)
    assert (resolved.machine_type, resolved.source) == (expected, "task-hints")


def test_precedence_override_then_hints_then_route_then_cloud_default() -> None:
    override = resolve_shape("aws", Shape(vcpus=64, machine_type="x2idn.16xlarge"), "m6i.large")
    assert (override.machine_type, override.source) == ("x2idn.16xlarge", "task-override")
    hints = resolve_shape("aws", Shape(vcpus=4), "m6i.8xlarge")
    assert (hints.machine_type, hints.source) == ("c6i.xlarge", "task-hints")
    route = resolve_shape("aws", Shape(disk_gb=90), "m6i.8xlarge", route_disk_gb=30)
    assert (route.machine_type, route.source, route.disk_gb) == ("m6i.8xlarge", "route-default", 90)
    route_gpu = resolve_shape("aws", Shape(), route_gpu="l4", route_disk_gb=30)
    assert (route_gpu.machine_type, route_gpu.source, route_gpu.disk_gb) == ("g6.xlarge", "route-gpu", 30)
    default = resolve_shape("aliyun", Shape())
    assert (default.machine_type, default.source, default.disk_gb) == ("ecs.g7.xlarge", "cloud-default", None)
    # A task's CPU hints keep the route's GPU.
    mixed = resolve_shape("gcloud", Shape(vcpus=12), route_gpu="nvidia-l4-vws")
    assert (mixed.machine_type, mixed.accelerator) == ("g2-standard-16", "nvidia-l4-vws")


def test_gce_accelerators_for_explicit_machine_types() -> None:
    assert resolve_shape("gcloud", Shape(machine_type="n1-standard-8", gpu="t4")).accelerator == "nvidia-tesla-t4"
    assert resolve_shape("gcloud", Shape(machine_type="g2-standard-24", gpu="l4")).accelerator is None
    assert resolve_shape("gcloud", Shape(machine_type="g2-standard-24", gpu="l4-vws")).accelerator == "nvidia-l4-vws"
    assert resolve_shape("aws", Shape(machine_type="g4dn.xlarge", gpu="t4")).accelerator is None


def test_nothing_fits_is_a_clear_error_naming_the_unit_and_the_way_out() -> None:
    with pytest.raises(ShapeError) as caught:
        resolve_shape("aws", Shape(vcpus=128, memory_gb=2048), what="unit 'big'")
    assert str(caught.value) == (
        "unit 'big': no aws type in the shape table fits vcpus>=128, memory_gb>=2048, no gpu "
        "(largest: m6i.16xlarge, 64 vCPU, 256 GiB); set shape.machine_type to choose a type explicitly"
    )
    with pytest.raises(ShapeError) as unknown:
        resolve_shape("aliyun", Shape(gpu="h100"), what="unit 'g'")
    assert "has no type with GPU 'h100' (known: a10, t4)" in str(unknown.value)


def test_gpu_names_are_canonicalised() -> None:
    assert {canonical_gpu(n) for n in ("nvidia-tesla-t4", "NVIDIA-T4", "t4", " tesla-t4 ")} == {"t4"}
    assert canonical_gpu("nvidia-l4-vws") == "l4-vws"


@pytest.mark.parametrize("cloud", sorted(SHAPE_TABLES))
def test_docs_print_the_same_tables_as_the_code(cloud: str) -> None:
    docs = DOCS.read_text() if DOCS.exists() else ""
    if table_markdown(cloud) not in docs:
        pytest.fail(f"docs/clouds.md lacks the current {cloud} table; paste table_markdown({cloud!r}) there")
