"""``python -m ale_iac.bridges vm|cua --endpoint URL``: one bridge over stdio, without the CLI's
dependencies (typer, rich, Pulumi), for where only the runtime bundle is: inside a sandbox or an
agent's container. The endpoint's token, if it needs one, comes from ``ALE_IAC_ENDPOINT_TOKEN`` or
the file ``ALE_IAC_ENDPOINT_TOKEN_FILE`` names."""

from __future__ import annotations

import argparse
import sys

from ale_iac.bridges.serve import endpoint_token_from_env, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ale_iac.bridges", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["vm", "cua"])
    parser.add_argument("--endpoint", required=True, help="base URL of the computer-server")
    args = parser.parse_args(argv)
    serve(args.kind, args.endpoint, endpoint_token_from_env())
    return 0


if __name__ == "__main__":
    sys.exit(main())
