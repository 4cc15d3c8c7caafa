"""A root file system packed as an OCI image archive (standard library only; a leaf utility).

The archive is an OCI image layout in one tar (``oci-layout``, ``index.json``, ``blobs/sha256/...``): one
uncompressed layer (``tar --numeric-owner`` of the rootfs), its config (entrypoint, command, environment,
labels) and its manifest. ``ctr -n k8s.io images import`` takes it as it is, under the name in the index's
``io.containerd.image.name`` annotation; a registry takes it through any OCI tool (``skopeo copy
oci-archive:...``, docs/kubernetes.md). Nothing is pulled or pushed here.

``python -m ale_iac.oci_archive --rootfs DIR --name NAME --out FILE`` is what ``scripts/kube-cluster.sh`` packs
its pod-sandbox ("pause") image with, before any venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_CHUNK = 1 << 20
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


class OciArchiveError(Exception):
    """The rootfs could not be packed (tar failed, or the target is not writable)."""


@dataclass(frozen=True)
class ImageConfig:
    """What the image's config says a container of it runs (a pod's ``command``/``args`` override both)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
    labels: dict[str, str] = field(default_factory=dict)


def _pack_layer(rootfs: Path, sink: io.BufferedWriter) -> tuple[str, int]:
    """``tar -C rootfs -c .`` into ``sink``; the layer's sha256 and size."""
    tar = subprocess.Popen(
        ["tar", "-C", str(rootfs), "--numeric-owner", "--xattrs", "-cf", "-", "."],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None and tar.stderr is not None
    digest = hashlib.sha256()
    size = 0
    while chunk := tar.stdout.read(_CHUNK):
        digest.update(chunk)
        sink.write(chunk)
        size += len(chunk)
    errors = tar.stderr.read().decode(errors="replace").strip()
    if tar.wait() != 0:
        raise OciArchiveError(f"tar of {rootfs} failed: {errors or 'no message'}")
    return digest.hexdigest(), size


def _blob(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(rootfs: Path, out: Path, name: str, config: ImageConfig | None = None) -> str:
    """Pack ``rootfs`` as an OCI archive at ``out`` (written beside it, then renamed) named ``name``
    (``registry/repository:tag``); returns the manifest's digest (``sha256:...``)."""
    config = config or ImageConfig()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch:
        layer_path = Path(scratch) / "layer.tar"
        with layer_path.open("wb") as sink:
            layer_digest, layer_size = _pack_layer(rootfs, sink)
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": list(config.entrypoint) or None,
                "Cmd": list(config.cmd) or None,
                "Env": list(config.env),
                "Labels": dict(config.labels),
            },
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        }
        config_digest, config_bytes = _blob(json.dumps(image_config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{config_digest}", "size": len(config_bytes)},
            "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": f"sha256:{layer_digest}", "size": layer_size}],
        }
        manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_MEDIA_TYPE,
                    "digest": f"sha256:{manifest_digest}",
                    "size": len(manifest_bytes),
                    "annotations": {NAME_ANNOTATION: name, REF_ANNOTATION: name.rsplit(":", 1)[-1]},
                }
            ],
        }
        partial = Path(scratch) / "archive.tar"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add_bytes(tar, "index.json", json.dumps(index).encode())
            _add_bytes(tar, f"blobs/sha256/{config_digest}", config_bytes)
            _add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_bytes)
            tar.add(layer_path, arcname=f"blobs/sha256/{layer_digest}")
        os.replace(partial, out)
    return f"sha256:{manifest_digest}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rootfs", type=Path, required=True)
    parser.add_argument("--name", required=True, help="the image's name, registry/repository:tag")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--entrypoint", action="append", default=[], help="one word of the entrypoint (repeat)")
    args = parser.parse_args(argv)
    print(write_archive(args.rootfs, args.out, args.name, ImageConfig(entrypoint=args.entrypoint)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
