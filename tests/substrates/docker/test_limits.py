"""The docker substrate's limits from a shape, fitted to the engine's host (no engine needed)."""

from __future__ import annotations

from ale_iac.substrates.docker.runtime import DockerSandboxSpec, HostResources, _limits

HOST = HostResources(cpus=2, memory_bytes=8 * 2**30)


def _spec(**fields: object) -> DockerSandboxSpec:
    return DockerSandboxSpec(sandbox_id="s-1", image="ale-iac/desktop:x", **fields)  # type: ignore[arg-type]


def test_a_quota_below_the_hosts_cpus_is_applied() -> None:
    kwargs, limits = _limits(_spec(vcpus=1, memory_gb=2), HOST)
    assert kwargs["nano_cpus"] == 1_000_000_000 and kwargs["mem_limit"] == kwargs["memswap_limit"] == "2048m"
    named = {limit.name: limit for limit in limits}
    assert named["cpu"].applied and named["cpu"].detail == "" and named["memory"].detail == ""


def test_a_shape_asking_every_cpu_or_more_gets_no_quota_and_says_why() -> None:
    for asked in (2, 4):
        kwargs, limits = _limits(_spec(vcpus=asked), HOST)
        cpu = {limit.name: limit for limit in limits}["cpu"]
        assert "nano_cpus" not in kwargs and not cpu.applied and cpu.requested == str(asked)
        assert cpu.detail == f"fitted to the host: it has 2 CPUs, the shape asked {asked}; not restricted"


def test_memory_above_the_hosts_is_set_and_recorded_with_the_numbers() -> None:
    kwargs, limits = _limits(_spec(memory_gb=16), HOST)
    memory = {limit.name: limit for limit in limits}["memory"]
    assert kwargs["mem_limit"] == "16384m" and memory.applied
    assert memory.detail.startswith("above the host's memory: it has 8.0 GiB, the shape asked 16 GiB")
