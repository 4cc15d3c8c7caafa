"""Error types shared across layers. Each carries one line a user can act on."""

from __future__ import annotations

from pathlib import Path


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
