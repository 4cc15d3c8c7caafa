"""``ale_iac.oci_archive``: a rootfs packed as an OCI image layout in one tar, every blob named by its digest."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from ale_iac.oci_archive import NAME_ANNOTATION, ImageConfig, main, write_archive


def _rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "hello").chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("unit\n")
    return root


def test_the_archive_is_an_oci_layout_whose_blobs_match_their_digests(tmp_path: Path) -> None:
    out = tmp_path / "image.tar"
    config = ImageConfig(cmd=["/bin/hello"], labels={"ale-iac.image": "t"})
    digest = write_archive(_rootfs(tmp_path), out, "ale-iac.local/t:abc", config)
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest and entry["annotations"][NAME_ANNOTATION] == "ale-iac.local/t:abc"
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
    image = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert image["config"]["Cmd"] == ["/bin/hello"] and image["config"]["Labels"] == {"ale-iac.image": "t"}
    [layer] = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(files[f"blobs/sha256/{layer['digest'].split(':')[1]}"])) as inner:
        names = set(inner.getnames())
        assert {"./bin/hello", "./etc/hostname"} <= names
        assert inner.getmember("./bin/hello").mode & 0o111 and inner.getmember("./bin/hello").uid == 0
    assert image["rootfs"]["diff_ids"] == [layer["digest"]]


def test_the_command_line_packs_an_entrypoint(tmp_path: Path) -> None:
    out = tmp_path / "pause.tar"
    assert (
        main(["--rootfs", str(_rootfs(tmp_path)), "--name", "x/p:1", "--out", str(out), "--entrypoint", "/bin/hello"])
        == 0
    )
    with tarfile.open(out) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    assert index["manifests"][0]["annotations"][NAME_ANNOTATION] == "x/p:1"
