"""Claims that contradict each other cannot all hold (docs/AUDIT.md, "Claims that contradict each other"): the
claims a contradicting consistency check relates, each held under the default reading, become ``ambiguous``,
naming the input whose rounding decides and the values of it that make each one hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distcheck.audit.exact_values import _fmt
from distcheck.audit.keys import AMBIGUOUS, HOLDS, HOLDS_ROUNDED
from distcheck.audit.rounded_inputs import describe

if TYPE_CHECKING:
    from distcheck.audit.consistency import CheckVerdict

__all__ = ["settle"]

#: the verdicts of a figure that holds under the default reading (the claimed quantity, inputs and unit)
_HELD = (HOLDS, HOLDS_ROUNDED)


def _held_at(v: Any) -> str:
    """Where claim verdict ``v`` holds, as text: the values of its rounded inputs that make it hold."""
    if v.rounding is None or not v.rounding.inputs:
        return f"{v.claim.id} holds at the printed inputs, read exactly"
    return f"{v.claim.id} holds for {describe(v.rounding, _fmt)}"


def settle(verdicts: list[Any], checks: list[CheckVerdict]) -> None:
    """Claims that contradict each other cannot all hold (docs/AUDIT.md, "Claims that contradict each other").

    For each consistency check that finds a contradiction among two or more claims that hold under the default
    reading, where one of them holds only through the rounding of its inputs or the check relates claims on the
    same inputs by an identity (an automatic check): each of those claims becomes ``ambiguous``, its explanation
    naming the check, the other claims and, for each claim, the values of its rounded inputs that make it hold;
    the check's explanation gets the same. The check stays a contradiction. Changes ``verdicts`` and ``checks``
    in place."""
    by_id = {v.claim.id: v for v in verdicts}
    was = {v.claim.id: v.verdict for v in verdicts}
    for k in checks:
        if k.verdict != "contradiction":
            continue
        held = [by_id[i] for i in dict.fromkeys(k.claims) if i in by_id and was[i] in _HELD]
        if len(held) < 2 or not (k.automatic or any(was[v.claim.id] == HOLDS_ROUNDED for v in held)):
            continue
        decided = [v for v in held if v.rounding is not None and v.rounding.inputs]
        if decided:
            names = list(dict.fromkeys(r.name for v in decided for r in v.rounding.inputs))
            what = f"{', '.join(names)} decide{'s' if len(names) == 1 else ''}"
        else:  # held at the printed values, each: the figures meet only at a tie
            what = "the tie rule the source rounded with decides"
        settle = f"{what}: " + "; ".join(_held_at(v) for v in held)
        k.explanation += f"; they cannot all hold: {settle}"
        for v in held:
            others = [o.claim.id for o in held if o is not v]
            v.contradicts.append({"check": k.id, "claims": tuple(others), "was": was[v.claim.id]})
            v.explanation += (f"; but it contradicts {', '.join(others)}, which also "
                              f"{'holds' if len(others) == 1 else 'hold'} (check {k.id}): they cannot all hold; "
                              f"{settle}")
            v.verdict = AMBIGUOUS
