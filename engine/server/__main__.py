"""OpenAI-compatible HTTP server over the engine: streaming completions and chat, tiers, metrics.

    python -m engine.server --model tiny --port 8000      # or: slobench serve ...

This module is the command line: its flags are server_args.py's, `run_server` (launch.py) starts and stops
the server, and the app with its handlers is api_server.py.
"""

from __future__ import annotations

import argparse
import sys

from engine.server.launch import run_server
from engine.server.server_args import add_server_arguments

__all__ = ["add_server_arguments", "main", "run_server"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.server", description=__doc__.splitlines()[0])
    add_server_arguments(parser)
    run_server(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
