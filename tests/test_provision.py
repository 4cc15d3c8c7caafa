"""What ``provision.ensure_images`` builds before provisioning: exactly the images a profile's host routes
need (the qemu artifacts only for qemu routes), with their progress on the caller's log."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac import image_build
from ale_iac.profile import load_profile_file
from ale_iac.provision import ensure_images
from ale_iac.substrates.qemu import disk


def _profile(tmp_path: Path, routes: str) -> Path:
    path = tmp_path / "Pulumi.p.yaml"
    path.write_text(f"config:\n  ale-iac:profile:\n    name: p\n    snapshots:\n{routes}")
    return path


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ensure_images asked the image cache for (recorded instead of built: the builds are tested in
    tests/test_images.py)."""
    asked: list[str] = []

    def build(name: str, **kwargs: object) -> None:
        asked.append(f"rootfs:{name}")
        log = kwargs.get("log")
        if callable(log):
            log(f"building {name}")

    monkeypatch.setattr(image_build, "build_image", build)
    monkeypatch.setattr(disk, "ensure_export", lambda name, _log: asked.append(f"qcow2:{name}"))
    return asked


def test_a_local_profile_makes_no_qemu_artifact(tmp_path: Path, made: list[str]) -> None:
    lines: list[str] = []
    profile = load_profile_file(_profile(tmp_path, "      default:\n        provider: local\n")).profile
    ensure_images(profile, log=lines.append)
    assert made == ["rootfs:desktop"]
    assert lines == ["building desktop"]


def test_a_qemu_profile_makes_its_qcow2_and_its_runner_image_on_first_need(tmp_path: Path, made: list[str]) -> None:
    routes = (
        "      a:\n        provider: qemu\n"
        "      b:\n        provider: qemu\n        runner: container\n"
        "      c:\n        provider: docker\n"
    )
    ensure_images(load_profile_file(_profile(tmp_path, routes)).profile)
    assert made == ["rootfs:desktop", "qcow2:desktop", "rootfs:qemu-runner"]


def test_a_static_profile_builds_nothing(tmp_path: Path, made: list[str]) -> None:
    routes = "      default:\n        provider: static\n        endpoints: [http://127.0.0.1:1/]\n"
    ensure_images(load_profile_file(_profile(tmp_path, routes)).profile)
    assert made == []
