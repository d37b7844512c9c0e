"""``distcheck zoo``: its arguments and its run (the entries are the repository's zoo/ folder, docs/ZOO.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_zoo_parser", "run_zoo"]


def add_zoo_parser(sub: Any, *, seed: Callable[[str], int]) -> None:
    """``distcheck zoo`` (distcheck.zoo; the entries are the repository's zoo/ folder)."""
    zoo = sub.add_parser(
        "zoo",
        help="reproduce public silent bugs of distributed training: each caught, each fixed twin certified",
        description=(
            "Run every entry of the zoo (zoo/ at the repository's root, one module per public report): certify "
            "the buggy target, which must FAIL on the entry's property, and its fixed twin, which must certify. "
            "Exit 0 only if every bug is caught and every twin certified."
        ),
    )
    zoo.add_argument("--entry", "--only", action="append", dest="entry", metavar="NAME",
                     help="run only this entry (repeatable)")
    zoo.add_argument("--dir", type=Path, default=None, help="the zoo folder (default: ./zoo)")
    zoo.add_argument("--seed", type=seed, default=0, metavar="N", help="seed of the drawn examples (default 0)")
    zoo.add_argument("--allow-skips", action="store_true",
                     help="an entry whose library is not installed is a skip, not a failure")
    zoo.add_argument("--list", action="store_true", help="print the entries' metadata (markdown) without running")
    zoo.add_argument("--format", choices=("table", "markdown", "json"), default="table", help="report format")


def run_zoo(args: argparse.Namespace) -> int:
    """``distcheck zoo``: exit 0 only if every bug is caught on its property and every twin certifies."""
    from distcheck import zoo

    entries = zoo.discover(args.dir, args.entry)
    if args.list:
        print(zoo.metadata_markdown(entries), end="")
        return 0
    from distcheck.runners.pool import RankPool

    rows = []
    pools: dict[int, RankPool] = {}  # one world per size, shared by the entries: each run skips a world's start-up
    try:
        for i, (name, entry) in enumerate(entries.items(), 1):
            sys.stderr.write(f"distcheck zoo: [{i}/{len(entries)}] {name}\n")
            if entry.world_size not in pools and not zoo.missing(entry):
                pools[entry.world_size] = RankPool(entry.world_size, backend="gloo", timeout_s=zoo.TIMEOUT_S)
            rows.append(zoo.run_entry(name, entry, seed=args.seed, pool=pools.get(entry.world_size)))
    finally:
        for pool in pools.values():
            pool.close()
    render = {"table": zoo.to_table, "markdown": zoo.to_markdown, "json": zoo.to_json}[args.format]
    text = render(rows)
    print(text, end="" if text.endswith("\n") else "\n")
    bad = [r for r in rows if not (r.ok or (r.skip and args.allow_skips))]
    return 1 if bad else 0
