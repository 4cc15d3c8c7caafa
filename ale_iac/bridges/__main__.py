"""``python -m ale_iac.bridges vm|cua --endpoint URL``: one bridge over stdio, without the CLI's
dependencies (typer, rich, Pulumi), for where only the runtime bundle is: inside a sandbox or an
agent's container. The endpoint's token, if it needs one, comes from ``ALE_IAC_ENDPOINT_TOKEN`` or
the file ``ALE_IAC_ENDPOINT_TOKEN_FILE`` names. Where the agent's entry keeps warm bridges
(``ALE_IAC_WARM_BRIDGES``, ``ale_iac/bridges/warm.py``), this process only hands its stdio to the warm process,
which forks the bridge from modules it has imported already; the bridge's own modules are imported only when
there is none."""

from __future__ import annotations

import argparse
import os
import sys

from ale_iac.bridges.warm import ENTRY_BRIDGES, WARM_ENV, forward


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if os.environ.get(WARM_ENV) and (code := forward(os.environ[WARM_ENV], args_in, ENTRY_BRIDGES)) is not None:
        return code
    parser = argparse.ArgumentParser(prog="python -m ale_iac.bridges", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["vm", "cua"])
    parser.add_argument("--endpoint", required=True, help="base URL of the computer-server")
    args = parser.parse_args(args_in)
    from ale_iac.bridges.serve import endpoint_token_from_env, serve

    serve(args.kind, args.endpoint, endpoint_token_from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
