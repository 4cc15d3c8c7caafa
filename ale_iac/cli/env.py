"""``ale-iac env``: the environment plain ``pulumi`` needs to act on ale-iac's stacks.

The Automation API calls of ale-iac pass the backend, the secrets passphrase, the toolchain and
the Python interpreter to every CLI call (:meth:`ale_iac.engine.Engine.env_vars`); a ``pulumi``
typed in a shell gets none of them, and without a backend it asks to log in to Pulumi Cloud.
``eval "$(.venv/bin/ale-iac env)"`` exports the very same values, so plain ``pulumi`` and ale-iac
see the same stacks (README, "Plain pulumi").
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from ale_iac.paths import ale_home

PASSPHRASE_ENV = "PULUMI_CONFIG_PASSPHRASE"


def env_lines() -> list[str]:
    """``export NAME=value`` lines, quoted for POSIX shells."""
    from ale_iac.engine import Engine

    engine = Engine()
    values = engine.env_vars()
    # The venv's bin (ale-iac itself) after the toolchain's, both ahead of the caller's PATH.
    head, _, rest = values["PATH"].partition(":")
    venv_bin = str(Path(sys.executable).parent)
    values["PATH"] = ":".join(p for p in (head, venv_bin if venv_bin != head else "", rest) if p)
    values["ALE_IAC_HOME"] = str(ale_home().resolve())
    lines = []
    for name in sorted(values):
        if name == PASSPHRASE_ENV:
            # Already in the caller's environment; never echo a secret.
            lines.append(f"# {PASSPHRASE_ENV} is taken from your environment")
            continue
        lines.append(f"export {name}={shlex.quote(values[name])}")
    return lines


def env() -> None:
    """Print shell lines exporting what plain `pulumi` needs (backend, passphrase, toolchain), for `eval "$(...)"`."""
    for line in env_lines():
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("env")(env)
