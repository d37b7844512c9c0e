"""Every rank's values against the reference's under a bound, reported in one short line (numpy only): the
``training-step`` contract's comparisons (:mod:`distcheck.parallel.step.contracts`): each value (:func:`within`),
the parameters' names (:func:`extra_params`), the clipping factor (:func:`clipping`) and the tokens
(:func:`tokens`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from distcheck.engine.contracts.contract import Outcome
from distcheck.parallel.step.bound import BOUND, kind_floor, value_bound
from distcheck.parallel.step.precision import UNIT_ROUNDOFF

__all__ = ["within", "first", "extra_params", "clipping", "tokens"]


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
    errors: dict[int, Any] = {}
    for r, g in zip(ranks, got, strict=True):
        if g is None or np.shape(g) != np.shape(ref):
            bad.append(r)
            detail = detail or f"rank {r} has {'nothing' if g is None else f'shape {np.shape(g)}'}, expected shape " \
                               f"{np.shape(ref)}"
            continue
        if id(g) not in errors:  # ranks that shipped the same array (step.records) share one object
            errors[id(g)] = np.abs(np.atleast_1d(np.asarray(g, dtype=np.float64)) - e)
        err = errors[id(g)]
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


def extra_params(at: str, ref: dict, steps: list[dict]) -> Outcome:
    """A parameter some rank holds under a name the reference lacks: a weight the reference ties (and lists
    once, ``named_parameters()``) that the parallelize function left as two parameters."""
    extra = {i: sorted(set(st_["params"]) - set(ref)) for i, st_ in enumerate(steps)}
    bad = [i for i, names in extra.items() if names]
    if not bad:
        return Outcome(True, max_error=0.0, bound=0.0)
    return Outcome(False, bound=0.0, ranks=tuple(bad), message=f"{at}: ranks {bad} hold parameters the reference "
                   f"does not have: {', '.join(extra[bad[0]])} (a weight tied in the model, untied by the "
                   "parallelize function?)")


def clipping(at: str, r: dict, steps: list[dict], held: tuple = (None, None), dtype: str = "float64") -> Outcome:
    """Every rank's clipping factor against the reference's ``r["scale"]`` (``held``: its bound and the
    single-device step's own error under a low precision, :func:`within`), and one factor for every entry: the
    residual of the local shards against one factor within the rounding of ``scale * g`` in the gradients' dtype."""
    # a rank whose local gradients are all zero shows no factor: it is held to the reference's own
    scale = within(f"{at} clipping factor (reference norm {r['norm']:.17g})", r["scale"],
                   [r["scale"] if st_["scale"] is None else st_["scale"] for st_ in steps], None, held[0], held[1],
                   dtype)

    # the residual of one factor, in gradient units: the rounding of scale * g (twice the gradients' own unit
    # roundoff in float64's 2^-31, four times it in a lower precision's), against the gradients' own size
    def rounding(st_: dict) -> float:
        kind = st_.get("grad_dtype") or "float64"
        return 2 * BOUND if kind == "float64" else 4 * UNIT_ROUNDOFF.get(kind, UNIT_ROUNDOFF["bfloat16"])

    uneven = [i for i, st_ in enumerate(steps)
              if st_["residual"] > rounding(st_) * r["scale"] * kind_floor([st_.get("grad_max", 0.0)])]
    if uneven:
        return first([scale, Outcome(False, bound=BOUND, ranks=tuple(uneven), message=f"{at}: ranks {uneven} "
                                     "scaled their gradients by more than one factor")])
    return scale


def tokens(at: str, total: int, steps: list[dict], batch_index: list[tuple[int, int]]) -> Outcome:
    """Every rank reports the step's ``total`` tokens, and the ranks' own counts, one per ``batch_index[i]`` (rank
    i's (dp index, cp index): the ranks holding different tokens), add up to it (exact)."""
    bad = [(i, st_["tokens"]) for i, st_ in enumerate(steps) if st_["tokens"] != total]
    own: dict[tuple[int, int], int] = {}
    for d, st_ in zip(batch_index, steps, strict=True):
        own.setdefault(d, st_["local_tokens"])
    msgs = [f"rank {i} reports {t:g} tokens" for i, t in bad]
    if sum(own.values()) != total:
        msgs.append(f"the dp (and cp) ranks' own counts {[own[d] for d in sorted(own)]} add up to "
                    f"{sum(own.values())}")
    if not msgs:
        return Outcome(True, max_error=0.0, bound=0.0)
    return Outcome(False, bound=0.0, ranks=tuple(i for i, _ in bad),
                   message=f"{at}: the step has {total} non-ignored tokens; " + "; ".join(msgs))
