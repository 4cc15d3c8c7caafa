"""Finding the Pulumi toolchain: the CLI, the Python language host and the dynamic-provider launcher.

Search order for the CLI: ``ALE_IAC_PULUMI`` (a path to the binary), ``pulumi`` on ``PATH``, then the
newest toolchain that ``scripts/build-pulumi.sh`` built into the cache
(``<cache>/toolchain/pulumi-v<version>/bin``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ale_iac.errors import AleIacError
from ale_iac.paths import cache_root

MIN_VERSION = (3, 181, 0)
"""Inline-program destroy and refresh need at least this CLI (the Automation API refuses older)."""

INSTALL_HINT = (
    "run ./scripts/setup.sh (it builds a pinned Pulumi CLI from the Go module proxy; needs Go), "
    "or install the Pulumi CLI >= 3.181 (https://www.pulumi.com/docs/install/) and put it on PATH"
)


class PulumiNotFoundError(AleIacError):
    """No Pulumi CLI could be found."""


class PulumiTooOldError(AleIacError):
    """A Pulumi CLI was found but cannot run inline destroy/refresh."""


@dataclass(frozen=True)
class Toolchain:
    pulumi: Path
    version: str
    language_host: Path | None
    dynamic_launcher: Path | None

    @property
    def bin_dir(self) -> Path:
        return self.pulumi.parent

    @property
    def root(self) -> Path:
        """The directory whose ``bin/pulumi`` is the CLI (what ``PulumiCommand(root=...)`` takes)."""
        return self.pulumi.parent.parent


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def _candidates() -> list[Path]:
    found: list[Path] = []
    explicit = os.environ.get("ALE_IAC_PULUMI")
    if explicit:
        found.append(Path(explicit))
    on_path = shutil.which("pulumi")
    if on_path:
        found.append(Path(on_path))
    cached = sorted(
        (cache_root() / "toolchain").glob("pulumi-v*/bin/pulumi"),
        key=lambda p: parse_version(p.parent.parent.name) or (0, 0, 0),
        reverse=True,
    )
    found.extend(cached)
    return found


def _sibling(pulumi: Path, name: str) -> Path | None:
    beside = pulumi.parent / name
    if beside.exists():
        return beside
    on_path = shutil.which(name)
    return Path(on_path) if on_path else None


def probe(pulumi: Path) -> Toolchain:
    """Run ``pulumi version`` on one binary and describe the toolchain around it."""
    if not pulumi.exists():
        raise PulumiNotFoundError(f"Pulumi CLI not found at {pulumi}: {INSTALL_HINT}")
    try:
        out = subprocess.run(
            [str(pulumi), "version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"},
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise PulumiNotFoundError(f"Pulumi CLI at {pulumi} does not run ({exc}): {INSTALL_HINT}") from exc
    version = parse_version(out)
    if version is None:
        raise PulumiTooOldError(
            f"Pulumi CLI at {pulumi} reports no version ({out!r}; built without the Version ldflag?): {INSTALL_HINT}"
        )
    if version < MIN_VERSION:
        raise PulumiTooOldError(
            f"Pulumi CLI at {pulumi} is {out}, older than the 3.181.0 ale-iac needs: {INSTALL_HINT}"
        )
    return Toolchain(
        pulumi=pulumi.resolve(),
        version=out,
        language_host=_sibling(pulumi, "pulumi-language-python"),
        dynamic_launcher=_sibling(pulumi, "pulumi-resource-pulumi-python"),
    )


@functools.lru_cache(maxsize=1)
def find_toolchain() -> Toolchain:
    """The first usable toolchain; raises a clear error naming what was tried."""
    tried: list[str] = []
    too_old: PulumiTooOldError | None = None
    for candidate in _candidates():
        try:
            return probe(candidate)
        except PulumiTooOldError as exc:
            too_old = too_old or exc
            tried.append(str(candidate))
        except PulumiNotFoundError:
            tried.append(str(candidate))
    if too_old is not None:
        raise too_old
    where = f" (tried {', '.join(tried)})" if tried else ""
    raise PulumiNotFoundError(f"Pulumi CLI not found{where}: {INSTALL_HINT}")
