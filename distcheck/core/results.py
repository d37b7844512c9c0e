"""Result rows: the one record every check of distcheck returns, and its verdict.

A :class:`CheckResult` is one row: what was checked, on which backend and world
size, how many examples were tried, the verdict, and the largest error seen. The
verdicts are :class:`distcheck.core.vocab.Verdict` (JSON keeps the strings
``"pass"``, ``"FAIL"``, ``"skip"``, ``"finding"``). The table that prints rows is
:mod:`distcheck.report`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from distcheck.core.vocab import Verdict

__all__ = ["FAIL", "FINDING", "PASS", "SKIP", "NOTHING_CAN_FAIL", "CheckResult", "exit_code", "to_json",
           "nothing_can_fail", "check_exit_code", "say_nothing_can_fail"]

PASS, FAIL, SKIP, FINDING = Verdict.PASS, Verdict.FAIL, Verdict.SKIP, Verdict.FINDING
#: what a run (or a certification) in which no row was able to fail says: every row a skip. Never a pass:
#: ``distcheck certify`` and ``distcheck check`` exit 2, a certificate reads it instead of "certified"
NOTHING_CAN_FAIL = "nothing here can fail"


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


def nothing_can_fail(rows: Sequence[CheckResult]) -> list[str]:
    """Why nothing in ``rows`` was able to fail, or ``[]`` when something was: a ``[tool.distcheck]``
    target none of whose properties could fail (its rows carry ``extra["nothing_can_fail"]``, set by
    :func:`distcheck.certify.config.target_rows`), or every row a skip (at least one row)."""
    targets = list(dict.fromkeys(str(r.extra["nothing_can_fail"]) for r in rows if r.extra.get("nothing_can_fail")))
    if targets:
        return targets
    if rows and all(r.verdict == SKIP for r in rows):
        return list(dict.fromkeys(f"{r.check}: {r.detail}" for r in rows))[:3]
    return []


def check_exit_code(rows: Sequence[CheckResult]) -> int:
    """``distcheck check``'s exit code: 1 when a row failed, else 2 when nothing could fail
    (:func:`nothing_can_fail`: never a pass), else 0."""
    code = exit_code(rows)
    return 2 if code == 0 and nothing_can_fail(rows) else code


def say_nothing_can_fail(rows: Sequence[CheckResult]) -> None:
    """Write to stderr, one line each, why nothing could fail (when no row failed)."""
    import sys

    if exit_code(rows) == 0:
        for reason in nothing_can_fail(rows):
            sys.stderr.write(f"distcheck: error: {NOTHING_CAN_FAIL}: {reason}\n")
