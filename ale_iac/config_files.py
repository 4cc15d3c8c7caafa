"""Configuration files: YAML read and validated into pydantic models, every problem as a ConfigError that
names the file and the field (with the closest known key for a mistyped one)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ale_iac.errors import ConfigError, format_validation_error

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")


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
    """``model`` from ``data``, or one ConfigError naming ``source`` and every bad field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(source, exc, prefix, drop, model) from None


def load_model(path: Path, model: type[M]) -> M:
    """A YAML file validated as ``model`` (errors name the file and the field)."""
    return validate(model, read_yaml(path), path)
