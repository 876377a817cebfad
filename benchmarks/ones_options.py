"""The ``ones`` options a benchmark takes on its command line (``--ones-params`` / ``--params``), checked."""

from __future__ import annotations

import argparse
import json

from ones_pipeline.core.policies import make_policy


def ones_options(parser: argparse.ArgumentParser, text: str, flag: str) -> dict:
    """``text`` as a JSON object of ``ones`` options, checked by building the policy with them: a bad one ends
    the program through ``parser.error``, naming ``flag`` and what is wrong, before anything runs."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        parser.error(f"{flag}: not JSON ({exc})")
    if not isinstance(options, dict):
        parser.error(f"{flag}: a JSON object of ones options, got {text!r}")
    try:
        make_policy("ones", **options)
    except (TypeError, ValueError) as exc:
        parser.error(f"{flag}: {exc}")
    return options
