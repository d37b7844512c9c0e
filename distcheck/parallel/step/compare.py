"""Every rank's values against the reference's under a bound, reported in one short line (numpy only): the
``training-step`` contract's comparisons (:mod:`distcheck.parallel.step.contracts`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from distcheck.engine.contracts.contract import Outcome
from distcheck.parallel.step.bound import value_bound

__all__ = ["within", "first"]


def within(what: str, ref: Any, got: list, ranks: list[int] | None = None, bound: Any = None,
            own: Any = None, own_name: str = "") -> Outcome:
    """Every rank's ``got[i]`` (rank ``ranks[i]``, default i) against ``ref`` under ``bound`` (an array of ``ref``'s
    shape, or a scalar; default ``2^-31 |ref|``, a scalar that sums terms of one sign: the contract's doc), in one short
    line: the ranks at fault, and the worst entry (its index, expected, got, error, bound; under a low precision
    ``own``, the single-device step's own error there, named ``own_name``)."""
    e = np.atleast_1d(np.asarray(ref, dtype=np.float64))
    bound = 2 * value_bound(e, 0.0) if bound is None else np.broadcast_to(np.asarray(bound, np.float64), e.shape)
    worst, bad, detail = 0.0, [], ""
    ranks = list(range(len(got))) if ranks is None else ranks
    for r, g in zip(ranks, got, strict=True):
        if g is None or np.shape(g) != np.shape(ref):
            bad.append(r)
            detail = detail or f"rank {r} has {'nothing' if g is None else f'shape {np.shape(g)}'}, expected shape " \
                               f"{np.shape(ref)}"
            continue
        err = np.abs(np.atleast_1d(np.asarray(g, dtype=np.float64)) - e)
        worst = max(worst, float(err.max()) if err.size else 0.0)
        over = err > bound
        if over.any():
            bad.append(r)
            i = int(np.argmax(np.where(over, err, -1.0)))
            if not detail:
                at = "" if e.size == 1 else f" at index {tuple(int(j) for j in np.unravel_index(i, np.shape(ref)))}"
                detail = (f"rank {r}{at}: expected {e.flat[i]:.17g}, got {np.ravel(g)[i]:.17g}, error "
                          f"{err.flat[i]:.3g} > bound {bound.flat[i]:.3g}")
                if own is not None:
                    mine = np.broadcast_to(np.asarray(own, np.float64), e.shape).flat[i]
                    detail += f" (the single-device {own_name} step's own error there: {mine:.3g})"
    top = float(bound.max()) if bound.size else 0.0
    if not bad:
        return Outcome(True, max_error=worst, bound=top)
    good = [r for r in ranks if r not in bad]
    return Outcome(False, max_error=worst, bound=top, ranks=tuple(bad),
                   message=f"{what}: ranks {bad} differ from the reference"
                           + (f" (ranks {good} match)" if good else "") + f"; {detail}")


def first(outcomes: list[Outcome]) -> Outcome:
    """One outcome: the first failure's message (and how many more failed), the worst error and bound."""
    failed = [o for o in outcomes if not o.ok]
    errors = [o.max_error for o in outcomes if o.max_error is not None]
    bounds = [o.bound for o in outcomes if o.bound is not None]
    if not failed:
        return Outcome(True, max_error=max(errors, default=0.0), bound=max(bounds, default=0.0))
    more = f" (and {len(failed) - 1} more of {len(outcomes)} checks)" if len(failed) > 1 else ""
    return Outcome(False, max_error=max(errors, default=0.0), bound=max(bounds, default=0.0),
                   ranks=tuple(sorted({r for o in failed for r in o.ranks})), message=failed[0].message + more)
