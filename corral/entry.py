"""The ``corral`` command's entry point: ``corral mcp`` goes straight to the stdio relay
(standard library only, so a client's ``initialize`` is answered in tens of
milliseconds), everything else to the CLI (corral/edges/cli/main.py)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    if sys.argv[1:] == ["mcp"]:
        from corral.edges.mcp.relay import serve

        url = os.environ.get("CORRAL_URL") or "http://127.0.0.1:8765"
        sys.exit(serve(url, os.environ.get("CORRAL_TOKEN"), os.environ.get("CORRAL_SESSION")))
    from corral.edges.cli.main import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
