"""Error types shared across layers. Each carries one line a user can act on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

ONE_LINE_MAX = 600


def squash(text: str, limit: int = ONE_LINE_MAX) -> str:
    """``text`` on one line (runs of white space become one space), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def one_line(exc: BaseException) -> str:
    """An exception as one line: our own errors say what to do; others are named by their type."""
    if isinstance(exc, AleIacError):
        return squash(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    lines = str(exc).strip().splitlines()
    return squash(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)


class AleIacError(Exception):
    """Base class: an expected failure with a clear message (the CLI prints it without a traceback)."""


class ConfigError(AleIacError):
    """Bad input in a user file (profile, task card, experiment): names the file and the field."""

    def __init__(self, source: str | Path, field: str, message: str) -> None:
        self.source = str(source)
        self.field = field
        self.detail = message
        where = f"{self.source}: {field}" if field else self.source
        super().__init__(f"{where}: {message}")


def format_validation_error(
    source: str | Path, exc: Exception, prefix: str = "", drop: frozenset[str] = frozenset()
) -> ConfigError:
    """Turn a pydantic ValidationError into a ConfigError naming the first offending field.

    ``drop`` lists location parts to hide, such as the tags pydantic inserts for discriminated
    unions (``snapshots.gpu.gcloud.zone`` reads better as ``snapshots.gpu.zone``).
    """
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return ConfigError(source, prefix, str(exc))
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if str(p) not in drop)
    field = ".".join(p for p in (prefix, loc) if p)
    kind = first["type"]
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "missing":
        message = "required field is missing"
    else:
        message = first["msg"]
    more = len(exc.errors()) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ConfigError(source, field, message)


def yaml_error(source: str | Path, exc: Exception) -> ConfigError:
    """A one-line error for a YAML syntax problem, with its line and column."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ConfigError(source, "", f"not valid YAML{where}: {problem}")


def read_yaml(path: Path) -> Any:
    """A YAML file's content; a missing file or a syntax error is one ConfigError naming the file."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None


def validate(model: type[M], data: Any, source: str | Path, prefix: str = "", drop: frozenset[str] = frozenset()) -> M:
    """``model`` from ``data``, or one ConfigError naming ``source`` and the first bad field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix, drop) from None


def load_model(path: Path, model: type[M]) -> M:
    """A YAML file validated as ``model`` (errors name the file and the field)."""
    return validate(model, read_yaml(path), path)
