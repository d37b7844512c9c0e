"""The compositions a certification drew, and each property's verdict on each: the "Compositions drawn"
table of the certificate and of ``--report``.

A contract whose examples fall into a few named kinds (the ``training-step`` contract's layout, pipeline
schedule, micro-batches and clipping) says which kind an example is with
:meth:`~distcheck.engine.contracts.contract.Contract.composition` (``case -> {column: value}``, default
None: no table). The engine hands every example it runs, shrinking replays included, with its outcomes to
a :class:`Drawn` (one per world size and dtype), which keeps one :class:`CompositionRow` per distinct
composition, in the order first drawn. A property's verdict on a composition is ``pass`` when it held on
every example of that composition, ``FAIL`` when it failed on one (a rank that raised or hung fails every
property of its example, as in the certificate), ``skip`` when the contract skips it for the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distcheck.report import FAIL, PASS, SKIP

if TYPE_CHECKING:
    from distcheck.engine.contracts.contract import Contract

__all__ = ["CompositionRow", "Drawn", "composition_columns", "verdict_text"]


@dataclass
class CompositionRow:
    """One composition drawn at one world size and dtype.

    Attributes:
        world_size, dtype: where it ran.
        columns: the contract's description of the composition (``{"layout": "dp_shard=2, tp=2", ...}``).
        examples: examples of this composition run (shrinking replays included).
        verdicts: property -> ``"pass"``, ``"FAIL"`` or ``"skip"``.
        failures: property -> the examples of this composition on which it failed.
    """

    world_size: int
    dtype: str
    columns: dict[str, str]
    examples: int = 0
    verdicts: dict[str, str] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


class Drawn:
    """The compositions of one world size and dtype, appended to ``into`` (a certification's list) as they
    are first drawn. ``skipped``: the properties the contract skips for this target."""

    def __init__(self, contract: Contract, world_size: int, dtype: str, into: list[CompositionRow],
                 skipped: Sequence[str] = ()) -> None:
        self.contract, self.world_size, self.dtype, self.into = contract, world_size, dtype, into
        self.skipped = set(skipped)
        self.rows: dict[tuple[tuple[str, str], ...], CompositionRow] = {}

    def add(self, cases: Sequence[Any], outcomes: Any) -> None:
        """Record ``cases`` (one world step's examples) with ``outcomes``: one ``{property: Outcome}`` per
        case, or anything else for a step that crashed or hung (every property of every case failed)."""
        names = [p.name for p in self.contract.properties]
        for i, case in enumerate(cases):
            columns = self.contract.composition(case)
            if columns is None:
                continue
            key = tuple((str(k), str(v)) for k, v in columns.items())
            row = self.rows.get(key)
            if row is None:
                row = CompositionRow(self.world_size, self.dtype, dict(key),
                                     verdicts={p: SKIP if p in self.skipped else PASS for p in names},
                                     failures={p: 0 for p in names if p not in self.skipped})
                self.rows[key] = row
                self.into.append(row)
            row.examples += 1
            for p in row.failures:
                held = isinstance(outcomes, list) and p in outcomes[i] and outcomes[i][p].ok
                if not held:
                    row.failures[p] += 1
                    row.verdicts[p] = FAIL


def composition_columns(rows: Sequence[CompositionRow]) -> list[str]:
    """The description columns of ``rows``, in the order they first appear."""
    return list(dict.fromkeys(k for r in rows for k in r.columns))


def verdict_text(row: CompositionRow, prop: str) -> str:
    """``pass``, ``skip`` or ``FAIL (k of n)``: property ``prop`` on the composition of ``row``."""
    verdict = row.verdicts.get(prop, "-")
    return f"{FAIL} ({row.failures[prop]} of {row.examples})" if verdict == FAIL else verdict
