"""Result rows: the one record every check of distcheck returns, and its verdict.

A :class:`CheckResult` is one row: what was checked, on which backend and world
size, how many examples were tried, the verdict, and the largest error seen. The
verdicts are :class:`distcheck.core.vocab.Verdict` (JSON keeps the strings
``"pass"``, ``"FAIL"``, ``"skip"``, ``"finding"``). The table that prints rows is
:mod:`distcheck.report`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from distcheck.core.vocab import Verdict

__all__ = ["FAIL", "FINDING", "PASS", "SKIP", "CheckResult", "Verdict", "exit_code", "to_json"]

PASS, FAIL, SKIP, FINDING = Verdict.PASS, Verdict.FAIL, Verdict.SKIP, Verdict.FINDING


@dataclass
class CheckResult:
    """One row of a check report.

    Attributes:
        check: name of the property or figure, e.g. ``"ddp.unequal_shards.weighted"``.
        backend: where it ran: ``"reference"``, ``"sympy"``, ``"golden"``, ``"gloo"``,
            ``"nccl"``, ``"threaded"``, ``"fake"``.
        world_size: ranks in the world (1 for pure references).
        examples: examples tried (Hypothesis examples, figures, or runs).
        verdict: ``"pass"``, ``"FAIL"``, ``"skip"`` or ``"finding"`` (a known upstream
            discrepancy, reproduced and reported; see distcheck.engine.findings).
        max_error: the largest absolute error seen (None where not numeric).
        bound: the bound the error was held to (None for exact checks).
        detail: one line: the counterexample, the reason for a skip, or the figure.
    """

    check: str
    backend: str
    verdict: str
    world_size: int = 1
    examples: int = 0
    max_error: float | None = None
    bound: float | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)


def to_json(results: Iterable[CheckResult]) -> str:
    """The rows as a JSON list of objects (every field of :class:`CheckResult`), indented by 2."""
    return json.dumps([asdict(r) for r in results], indent=2, default=str)


def exit_code(results: Iterable[CheckResult]) -> int:
    """1 if any result failed, else 0."""
    return 1 if any(r.verdict == FAIL for r in results) else 0
