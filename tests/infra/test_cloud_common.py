"""What the three cloud modules share (``ale_iac.infra.cloud_common``) beyond what each cloud's tests cover."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Eight threads, released together, each getting the cloud's module as a program does and then the SDK classes it
# declares with. In a fresh interpreter: the race is in the SDK's first load.
RACE = """
import sys, threading
from ale_iac.infra.declaration import provider_module
kind, sdk, path = sys.argv[1:4]
barrier, errors = threading.Barrier(8), []
def declare():
    barrier.wait()
    try:
        found = getattr(provider_module(kind), sdk)
        for name in path.split("."):
            found = getattr(found, name)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=declare) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors)
"""


@pytest.mark.parametrize(
    ("kind", "sdk", "path"),
    [
        ("gcloud", "gcp", "compute.Firewall"),
        ("gcloud", "gcp", "storage.BucketObject"),
        ("aws", "aws", "vpc.SecurityGroupIngressRule"),
        ("aws", "aws", "ec2.Instance"),
        ("aliyun", "alicloud", "ecs.Instance"),
        ("aliyun", "alicloud", "oss.BucketObject"),
    ],
)
def test_units_declared_in_threads_at_once_find_the_sdk_whole(kind: str, sdk: str, path: str) -> None:
    """Before ``load_lazy_submodules``, 7 of the 8 threads failed ("module 'pulumi_gcp.compute' has no attribute
    'Firewall'"): the SDK's lazily loaded submodule, half-loaded by the first thread, seen by the others."""
    done = subprocess.run(
        [sys.executable, "-c", RACE, kind, sdk, path], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
