"""The ``ones`` command line: ``ones simulate`` (``cli.simulate``) and the live commands ``init``, ``up``,
``run``, ``submit``, ``status`` (``cli.live``, ``cli.status``, ``cli.supervise``)."""

from __future__ import annotations

import argparse
import sys

from ones_pipeline.cli import live, simulate
from ones_pipeline.sim.truth import TraceError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ones", description="ONES elastic scheduler for deep-learning jobs")
    sub = parser.add_subparsers(dest="command", required=True)
    simulate.add_command(sub)
    live.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "simulate":
            return simulate.cmd_simulate(args)
        if args.command in live.LIVE_COMMANDS:
            return live.run_command(args)
    except TraceError as exc:
        print(f"ones {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
