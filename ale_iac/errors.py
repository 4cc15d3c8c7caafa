"""Error types shared across layers. Each says what a user can act on, in a line (a config error: one per problem)."""

from __future__ import annotations

import contextlib
import difflib
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

if TYPE_CHECKING:
    from pydantic import BaseModel

ONE_LINE_MAX = 600


def squash(text: str, limit: int = ONE_LINE_MAX) -> str:
    """``text`` on one line (runs of white space become one space), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def one_line(exc: BaseException) -> str:
    """An exception as one line: our own errors say what to do; others are named by their type.
    A :class:`ConfigError` with several problems gives them all, separated by ``; ``."""
    if isinstance(exc, ConfigError):
        return squash("; ".join(str(problem) for problem in exc.problems))
    if isinstance(exc, AleIacError):
        return squash(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    lines = str(exc).strip().splitlines()
    return squash(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)


class AleIacError(Exception):
    """Base class: an expected failure with a clear message (the CLI prints it without a traceback)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a user file: the file, the field's path in it (empty: the file as a whole), what."""

    source: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.field}: {self.message}" if self.field else f"{self.source}: {self.message}"


class ConfigError(AleIacError):
    """Bad input in a user file (profile, task card, experiment): names the file and the field.

    It holds every problem one check found (``problems``; the first is also ``source``, ``field`` and
    ``detail``), so a user fixes them all at once; its text is one line per problem."""

    def __init__(self, source: str | Path, field: str, message: str, more: Sequence[Problem] = ()) -> None:
        self.source = str(source)
        self.field = field
        self.detail = message
        self.problems = list(dict.fromkeys([Problem(self.source, field, message), *more]))
        super().__init__("\n".join(str(problem) for problem in self.problems))

    @classmethod
    def of(cls, problems: Sequence[Problem]) -> ConfigError:
        """One error holding ``problems`` (at least one)."""
        first, *rest = problems
        return cls(first.source, first.field, first.message, rest)


class Problems:
    """Gathers the problems of the parts of one input (each preset, each task, a profile and its pool), so
    that one check reports them all instead of stopping at the first::

        problems = Problems()
        for ref in refs:
            with problems.check():
                loaded.append(load(ref))
        problems.raise_any()
    """

    def __init__(self) -> None:
        self.found: list[Problem] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        """Run the block; a ConfigError it raises is kept (the rest of the block is skipped)."""
        try:
            yield
        except ConfigError as exc:
            self.found.extend(exc.problems)

    def add(self, source: str | Path, field: str, message: str) -> None:
        self.found.append(Problem(str(source), field, message))

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError.of(self.found)


def did_you_mean(word: str, known: Iterable[str], namespace: str = "") -> str:
    """`` (did you mean 'x'?)`` for the known word closest to a mistyped ``word``, or nothing. A ``namespace``
    prefix all share (``ale-iac:``) is left out of the comparison: it would make any two words look alike."""
    names = {name.removeprefix(namespace): name for name in known}
    close = difflib.get_close_matches(word.removeprefix(namespace), list(names), n=1)
    return f" (did you mean '{names[close[0]]}'?)" if close else ""


def _type_options(annotation: Any) -> list[Any]:
    """The types an annotation allows: ``Annotated`` unwrapped, unions and optionals flattened."""
    if get_origin(annotation) is Annotated:
        return _type_options(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [option for arg in get_args(annotation) for option in _type_options(arg)]
    return [annotation]


def _is_model(value: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(value, type) and issubclass(value, BaseModel)


def _step_into(annotation: Any, part: str | int) -> list[Any]:
    """The types at ``part`` of a value of type ``annotation`` (a field, a mapping's value, a list's item, or
    the union member pydantic names in an error's location: a discriminator's tag or a class name)."""
    found = []
    for option in _type_options(annotation):
        if _is_model(option):
            fields = option.model_fields
            if part in fields:
                found.append(fields[str(part)].annotation)
            elif part == option.__name__ or any(
                part in get_args(f.annotation) for f in fields.values() if get_origin(f.annotation) is Literal
            ):
                found.append(option)
        elif get_origin(option) in (dict, Mapping) and get_args(option):
            found.append(get_args(option)[1])
        elif get_origin(option) in (list, tuple, Sequence) and get_args(option) and isinstance(part, int):
            found.append(get_args(option)[0])
    return found


def known_keys(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The field names of the model(s) at ``path`` in ``model`` (what an unknown key there could have meant)."""
    current: list[Any] = [model]
    for part in path:
        current = [found for annotation in current for found in _step_into(annotation, part)]
    return sorted({name for option in current if _is_model(option) for name in option.model_fields})


def format_validation_error(
    source: str | Path,
    exc: Exception,
    prefix: str = "",
    drop: frozenset[str] = frozenset(),
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """Turn a pydantic ValidationError into a ConfigError naming every offending field.

    ``drop`` lists location parts to hide, such as the tags pydantic inserts for discriminated
    unions (``snapshots.gpu.gcloud.zone`` reads better as ``snapshots.gpu.zone``). With ``model`` (the
    model that was validated), an unknown key gets the closest known one as a suggestion.
    """
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return ConfigError(source, prefix, str(exc))
    problems = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"] if str(p) not in drop)
        field = ".".join(p for p in (prefix, loc) if p)
        kind = error["type"]
        if kind == "extra_forbidden":
            known = known_keys(model, error["loc"][:-1]) if model is not None else []
            message = "unknown key" + did_you_mean(str(error["loc"][-1]), known)
        elif kind == "missing":
            message = "required field is missing"
        else:
            message = error["msg"]
        problems.append(Problem(str(source), field, message))
    return ConfigError.of(problems)
