"""Finding the Pulumi toolchain: the CLI, the Python language host and the dynamic-provider launcher.

Search order for the CLI: ``ALE_IAC_PULUMI`` (a path to the binary), ``pulumi`` on ``PATH``, then the
newest toolchain that ``scripts/build-pulumi.sh`` built into the cache
(``<cache>/toolchain/pulumi-v<version>/bin``).

The version pins (the CLI that build-pulumi.sh builds, the oldest CLI accepted, ...) live in one
file at the root of the checkout, ``versions.env``, which build-pulumi.sh sources and :func:`pins`
reads. ale-iac runs from its checkout (``pip install -e .``), so the file is found from this package.
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
from ale_iac.paths import cache_root, project_root

VERSIONS_FILE_NAME = "versions.env"

# What bash's `source` and parse_versions() both read the same way: NAME=value, the value without
# quotes, blanks or expansions; whole-line comments and blank lines.
_VERSIONS_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9._+-]*)")


class PulumiNotFoundError(AleIacError):
    """No Pulumi CLI could be found."""


class PulumiTooOldError(AleIacError):
    """A Pulumi CLI was found but cannot run inline destroy/refresh."""


class VersionsFileError(AleIacError):
    """versions.env is missing or not in the NAME=value form that bash and Python both read."""


@dataclass(frozen=True)
class Pins:
    """The toolchain pins of versions.env."""

    pulumi: str
    """PULUMI_VERSION: the CLI that scripts/build-pulumi.sh builds (``ALE_IAC_PULUMI_VERSION`` overrides it there)."""
    pulumi_min: str
    """PULUMI_MIN_VERSION: the oldest CLI accepted (inline-program destroy and refresh need it)."""
    go_min: str
    """GO_MIN_VERSION: the Go that the pinned CLI's pkg/go.mod asks for."""

    @property
    def pulumi_min_tuple(self) -> tuple[int, int, int]:
        parsed = parse_version(self.pulumi_min)
        if parsed is None:  # read_pins() lets no such value through
            raise VersionsFileError(f"{VERSIONS_FILE_NAME}: PULUMI_MIN_VERSION={self.pulumi_min} is not x.y.z")
        return parsed


_PIN_KEYS = {"pulumi": "PULUMI_VERSION", "pulumi_min": "PULUMI_MIN_VERSION", "go_min": "GO_MIN_VERSION"}


def versions_file() -> Path:
    """The checkout's versions.env (next to pyproject.toml)."""
    return project_root() / VERSIONS_FILE_NAME


def parse_versions(text: str, source: str = VERSIONS_FILE_NAME) -> dict[str, str]:
    """The NAME=value assignments of a versions file; anything bash might read differently is an error."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _VERSIONS_LINE.fullmatch(line)
        if match is None:
            raise VersionsFileError(
                f"{source}:{number}: {raw!r} is not NAME=value (a value of letters, digits and ._+- only, "
                "so that bash and Python read it alike)"
            )
        values[match[1]] = match[2]
    return values


def read_pins(path: Path) -> Pins:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise VersionsFileError(
            f"cannot read {path} ({exc.strerror}): ale-iac runs from its checkout (pip install -e .)"
        ) from exc
    values = parse_versions(text, str(path))
    missing = [key for key in _PIN_KEYS.values() if not values.get(key)]
    if missing:
        raise VersionsFileError(f"{path} sets no {', '.join(missing)}")
    result = Pins(**{field: values[key] for field, key in _PIN_KEYS.items()})
    for field in ("pulumi", "pulumi_min"):
        if parse_version(getattr(result, field)) is None:
            raise VersionsFileError(f"{path}: {_PIN_KEYS[field]}={getattr(result, field)} is not a version x.y.z")
    return result


@functools.lru_cache(maxsize=1)
def pins() -> Pins:
    """The pins of the checkout's versions.env (read once)."""
    return read_pins(versions_file())


def install_hint() -> str:
    p = pins()
    return (
        f"run ./scripts/setup.sh (it builds the pinned Pulumi CLI v{p.pulumi} from the Go module proxy; needs Go), "
        f"or install the Pulumi CLI >= {p.pulumi_min} (https://www.pulumi.com/docs/install/) and put it on PATH"
    )


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
        raise PulumiNotFoundError(f"Pulumi CLI not found at {pulumi}: {install_hint()}")
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
        raise PulumiNotFoundError(f"Pulumi CLI at {pulumi} does not run ({exc}): {install_hint()}") from exc
    version = parse_version(out)
    if version is None:
        raise PulumiTooOldError(
            f"Pulumi CLI at {pulumi} reports no version ({out!r}; built without the Version ldflag?): {install_hint()}"
        )
    if version < pins().pulumi_min_tuple:
        raise PulumiTooOldError(
            f"Pulumi CLI at {pulumi} is {out}, older than the {pins().pulumi_min} ale-iac needs: {install_hint()}"
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
    raise PulumiNotFoundError(f"Pulumi CLI not found{where}: {install_hint()}")


# ------------------------------------------------------------------------------------------- Kubernetes


class KubectlNotFoundError(AleIacError):
    """No kubectl could be found (the Kubernetes provider's units are reached through its port-forward)."""


def kube_bin_dir() -> Path:
    """Where ``scripts/kube-cluster.sh build`` puts the cluster's binaries, kubectl and the Pulumi Kubernetes
    provider plugin: ``<cache>/kubernetes/v<KUBERNETES_VERSION>/bin`` (the pin of versions.env)."""
    values = parse_versions(versions_file().read_text(encoding="utf-8"))
    version = values.get("KUBERNETES_VERSION")
    if not version:
        raise VersionsFileError(f"{versions_file()} sets no KUBERNETES_VERSION")
    return cache_root() / "kubernetes" / f"v{version}" / "bin"


def find_kubectl() -> Path:
    """``ALE_IAC_KUBECTL``, else the kubectl that kube-cluster.sh built, else ``kubectl`` on ``PATH``."""
    named = os.environ.get("ALE_IAC_KUBECTL")
    candidates = [Path(named)] if named else []
    candidates.append(kube_bin_dir() / "kubectl")
    found = shutil.which("kubectl")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KubectlNotFoundError(
        f"no kubectl (tried {', '.join(map(str, candidates))}): run scripts/kube-cluster.sh build cluster, "
        "install kubectl, or set ALE_IAC_KUBECTL"
    )
