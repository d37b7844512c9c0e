"""``distcheck libs``: certify the real libraries and print their rows or the README table.

    distcheck libs                          # every target: the contract rows, then one line per target
    distcheck libs --target deepspeed       # one target (repeatable)
    distcheck libs --format markdown        # the README table "What distcheck finds in real libraries"
    distcheck libs --allow-skips            # a library that is not installed is a skip row, not an error

Exit code 0 when no row FAILs (a recorded finding is not a failure), 1 otherwise, 2 on bad
input, and 2 when a chosen library is not installed: one line naming the distributions and the
extra that installs them (``pip install 'distcheck[libs]'``), since nothing of theirs could be
checked; ``--allow-skips`` reports each as a skip row instead. ``--require-installed`` (a missing
library fails) is what every run does now, and is still accepted. :func:`add_libs_parser` is called
by :mod:`distcheck.cli`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["add_libs_parser", "run_libs_command"]


def add_libs_parser(sub: Any, *, seed: Callable[[str], int]) -> argparse.ArgumentParser:
    """Add the ``libs`` subcommand to ``sub`` (argparse subparsers); ``seed`` is the argument type
    ``distcheck check`` uses for ``--seed``."""
    from distcheck.libs import DEFAULT_EXAMPLES, EXTRA, TARGET_NAMES

    p = sub.add_parser(
        "libs",
        help="certify real libraries: DeepSpeed, accelerate, Megatron-core, torchtitan, transformers "
             "(needs distcheck[libs])",
        description=(
            "Certify the installed libraries under the memory-estimator and rank-layout contracts (DeepSpeed's ZeRO "
            "estimators, accelerate's training estimate, Megatron-core's RankGenerator and theoretical memory, "
            "torchtitan's ParallelDims) and report, for each, the convention it follows or the recorded "
            "finding with its smallest counterexample. docs/LIBRARIES.md describes the contracts."
        ),
    )
    p.add_argument("--target", action="append", choices=TARGET_NAMES, metavar="NAME",
                   help=f"run only this target (repeatable): {', '.join(TARGET_NAMES)}")
    p.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, metavar="N",
                   help=f"Hypothesis examples per property (default {DEFAULT_EXAMPLES})")
    p.add_argument("--seed", type=seed, default=0, metavar="N", help="seed of the drawn examples (default 0)")
    missing = p.add_mutually_exclusive_group()
    missing.add_argument("--allow-skips", action="store_true",
                         help=f"report a target whose library is not installed as a skip row (exit 0 if nothing "
                              f"else fails) instead of refusing to run (exit 2, naming pip install "
                              f"'distcheck[{EXTRA}]')")
    missing.add_argument("--require-installed", action="store_true",
                         help="a library that is not installed is an error (exit 2): the default, kept for the "
                              "scripts that name it")
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                   help="table: every contract row; json: the rows; markdown: one row per target (the README table)")
    return p


def run_libs_command(args: argparse.Namespace) -> int:
    """Run ``distcheck libs`` with parsed ``args``; return the exit code."""
    import time

    from distcheck.core.errors import ConfigError
    from distcheck.libs import run_libs
    from distcheck.libs.table import summary_rows, to_markdown
    from distcheck.report import exit_code, print_report

    if args.examples < 1:
        raise ConfigError("--examples", args.examples, "must be an integer >= 1")
    if not args.allow_skips:
        _refuse_missing(args.target)
    started = time.perf_counter()
    rows = run_libs(args.target, max_examples=args.examples, seed=args.seed, require_installed=not args.allow_skips)
    if args.format == "markdown":
        print(to_markdown(summary_rows(rows)), end="")
    else:
        print_report(rows, title="distcheck libs", seconds=time.perf_counter() - started, fmt=args.format)
        if args.format == "table":
            for t in summary_rows(rows):
                print(f"{t.target} ({t.library} {t.version}): {t.verdict}")
    return exit_code(rows)


def _refuse_missing(targets: list[str] | None) -> None:
    """Raise ConfigError (exit 2) naming every chosen target's distribution that is not installed and the
    extra that installs them: ``distcheck libs`` would check nothing of theirs."""
    from distcheck.core.errors import ConfigError
    from distcheck.libs import EXTRA, TARGET_NAMES
    from distcheck.libs.targets import dist_version, target

    dists = dict.fromkeys(target(name).DIST for name in (targets or TARGET_NAMES))
    missing = [d for d in dists if dist_version(d) is None]
    if missing:
        are, theirs = ("is", "its") if len(missing) == 1 else ("are", "theirs")
        raise ConfigError("libs", ", ".join(missing), f"{are} not installed, so nothing of {theirs} can be checked: "
                          f"pip install 'distcheck[{EXTRA}]' installs the extra (or pass --allow-skips to report "
                          "each as a skip)")
