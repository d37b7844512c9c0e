"""Cross-rank checks, in the parent: every rank against the reference, ranks against each other,
and the collectives each rank issued against the closed forms.

Every function returns an :class:`~distcheck.engine.contracts.contract.Outcome` whose message, on
failure, names the ranks at fault, the expected and the received values, the max error and
the bound, in full (never cut: the counterexamples are shrunk, so they are short).

Exactness (see :mod:`distcheck.core.exactness`): the references are computed in float64 from inputs
the dtype holds exactly, and results come back as float64 holding the dtype's values exactly.
A ``bitwise`` comparison is then plain equality. A bounded comparison ``|got - expected| <= bound``
is decided in float64 where that is safe (the computed difference is within a relative 2**-52
of the true one) and in exact rational arithmetic for the entries too close to call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from distcheck.engine.contracts.contract import Outcome

__all__ = ["show", "compare", "agree", "compare_collectives", "combine", "format_collectives", "padded_all_gather",
           "PADDED_NOTE"]

#: relative accuracy of a float64 subtraction and absolute value: |fl(|a - b|) - |a - b|| <= 2**-53 |a - b|
_MARGIN = 2.0**-52


def show(a: ArrayLike | None) -> str:
    """A value as nested lists (``[[1.0, -2.0]]``), the way a counterexample prints it."""
    if a is None:
        return "None"
    arr = np.asarray(a)
    return repr(arr.tolist()) if arr.ndim else repr(arr.item())


def _errors(expected: np.ndarray, got: np.ndarray, bound: np.ndarray | None) -> tuple[float, np.ndarray]:
    """(max |got - expected|, boolean mask of entries outside the bound), decided exactly."""
    diff = np.abs(got - expected)
    worst = float(diff.max()) if diff.size else 0.0
    if bound is None:
        return worst, got != expected
    b = np.broadcast_to(bound, diff.shape)
    out = diff > b * (1 + _MARGIN)
    close = ~out & (diff > b * (1 - _MARGIN))
    for idx in zip(*np.nonzero(close), strict=True):  # too close to call in floating point: decide exactly
        err = abs(Fraction(float(got[idx])) - Fraction(float(expected[idx])))
        out[idx] = err > Fraction(float(b[idx]))
    return worst, out


def compare(what: str, dtype: str, expected: Sequence[np.ndarray], got: Sequence[np.ndarray | None],
            got_dtypes: Sequence[str | None], bounds: Sequence[np.ndarray] | None = None) -> Outcome:
    """Rank r's ``got[r]`` against ``expected[r]``: the dtype, the shape and the values.

    ``bounds`` None: bitwise (bound 0); else rank r is held elementwise to ``bounds[r]``.
    """
    bad: list[str] = []
    ranks: list[int] = []
    worst, worst_bound = 0.0, 0.0
    for r, (e, g, gd) in enumerate(zip(expected, got, got_dtypes, strict=True)):
        bound = None if bounds is None else np.asarray(bounds[r], dtype=np.float64)
        if bound is not None and bound.size:
            worst_bound = max(worst_bound, float(bound.max()))
        if g is None:
            bad.append(f"rank {r}: no {what} (the tensor has no gradient: is it part of the graph?)")
        elif gd != dtype:
            bad.append(f"rank {r}: {what} has dtype {gd}, expected {dtype}")
        elif g.shape != e.shape:
            bad.append(f"rank {r}: {what} has shape {tuple(g.shape)}, expected {tuple(e.shape)}; "
                       f"expected {show(e)}, got {show(g)}")
        elif bound is None and np.array_equal(e, g):  # the common case, without forming the differences
            continue
        else:
            err, outside = _errors(e, g, bound)
            worst = max(worst, err)
            if outside.any():
                b = 0.0 if bound is None else float(np.broadcast_to(bound, e.shape)[outside].max())
                regime = "bitwise" if bound is None else "derived bound"
                bad.append(f"rank {r}: expected {show(e)}, got {show(g)}, max error {err:.6g} > bound {b:.6g} "
                           f"({regime})")
            else:
                continue
        ranks.append(r)
    if not bad:
        return Outcome(True, max_error=worst, bound=worst_bound)
    good = [r for r in range(len(expected)) if r not in ranks]
    head = f"{what}: {_ranks(ranks)} differ{'' if len(ranks) > 1 else 's'} from the reference"
    head += f" ({_ranks(good)} match{'' if len(good) > 1 else 'es'})" if good else " (no rank matches)"
    return Outcome(False, max_error=worst, bound=worst_bound, message=head + "; " + "; ".join(bad), ranks=tuple(ranks))


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {list(ranks)}"


def agree(what: str, arrays: Sequence[np.ndarray | None]) -> Outcome:
    """Replicated results (after an all-reduce every rank holds the same bits): each rank's
    array must equal rank 0's bit for bit."""
    base = arrays[0]
    differ = [r for r, a in enumerate(arrays[1:], start=1)
              if a is None or base is None or a.shape != base.shape or not np.array_equal(a, base)]
    if not differ:
        return Outcome(True, max_error=0.0, bound=0.0)
    parts = []
    for r in differ:
        a = arrays[r]
        if a is not None and base is not None and a.shape == base.shape:
            parts.append(f"rank {r} has {show(a)}, rank 0 has {show(base)} (max difference "
                         f"{float(np.abs(a - base).max()):.6g})")
        else:
            parts.append(f"rank {r} has {show(a)}, rank 0 has {show(base)}")
    return Outcome(False, bound=0.0, message=f"{what}: ranks disagree (an all-reduce leaves the same bits on every "
                                             f"rank): " + "; ".join(parts), ranks=tuple(differ))


def format_collectives(records: Iterable[tuple[str, int]]) -> str:
    """``all_reduce x1 (S=64 B)``-style listing of ``(collective, S)`` records; ``none`` when empty."""
    if not records:
        return "none"
    counts = Counter((c, s) for c, s in records)
    return ", ".join(f"{c} x{n} (S={s} B)" for (c, s), n in sorted(counts.items()))


#: the note of a collectives property that counted an uneven all-gather at its padded volume
PADDED_NOTE = ("an all-gather of a dimension tp does not divide was counted at its padded volume, every shard "
               "padded to ceil(L/tp) slices (closed form comm.size_bytes.all_gather_padded)")


def padded_all_gather(length: int, n: int, slice_bytes: int) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """``(exact record, padded record)`` of an all-gather of a dimension of ``length`` slices of
    ``slice_bytes`` bytes over ``n`` ranks, or None when ``n`` divides ``length`` (nothing to pad).

    The exact record has S = length * slice_bytes (nccl-tests' gathered output); the padded one
    S = n * ceil(length / n) * slice_bytes, the closed form ``comm.size_bytes.all_gather_padded``
    (gloo's all-gather needs equal shards, so a correct implementation pads each to ceil(L/n))."""
    from distcheck.core.vocab import Collective
    from distcheck.engine.catalogue import get

    if length % n == 0:
        return None
    padded = int(get("comm.size_bytes.all_gather_padded").evaluate(length=length, n=n, slice_bytes=slice_bytes))
    return (Collective.ALL_GATHER, length * slice_bytes), (Collective.ALL_GATHER, padded)


def compare_collectives(phase: str, expected: Iterable[tuple[str, int]],
                        got_per_rank: Sequence[Iterable[tuple[str, int]]], source: str,
                        padded: Sequence[tuple[tuple[str, int], tuple[str, int]]] = ()) -> Outcome:
    """Every rank's ``(collective, S bytes)`` records of ``phase`` against ``expected`` (as multisets).

    ``source`` says where the expectation comes from (the closed form and its value). ``padded``:
    ``(exact record, padded record)`` pairs of :func:`padded_all_gather`: a rank's record equal to
    a padded record counts as its exact one (an uneven all-gather padded to ceil(L/n) per rank, at
    exactly the closed form's volume; any other size still differs). A pass that used one says so
    in its note (:data:`PADDED_NOTE`).
    """
    want = sorted(expected)
    image = {tuple(pad): tuple(exact) for exact, pad in padded}
    bad = [(r, recs) for r, recs in enumerate(got_per_rank)
           if sorted(image.get(tuple(rec), tuple(rec)) for rec in recs) != want]
    if not bad:
        used = any(tuple(rec) in image for recs in got_per_rank for rec in recs)
        return Outcome(True, max_error=0.0, bound=0.0, note=PADDED_NOTE if used else "")
    lines = [f"rank {r}: {format_collectives(recs)}" for r, recs in bad]
    also = "".join(f"; or {c} at its padded volume S={pad} B (each shard padded to ceil(L/n) slices, closed form "
                   f"comm.size_bytes.all_gather_padded) for the {c} of S={exact} B" for (c, exact), (_, pad) in padded)
    return Outcome(False, bound=0.0, ranks=tuple(r for r, _ in bad),
                   message=f"{phase} collectives differ from {format_collectives(want)} ({source}{also}): "
                           + "; ".join(lines))


def combine(*outcomes: Outcome) -> Outcome:
    """One outcome for several checks of one property: it holds when all hold."""
    failed = [o for o in outcomes if not o.ok]
    errors = [o.max_error for o in outcomes if o.max_error is not None]
    bounds = [o.bound for o in outcomes if o.bound is not None]
    ranks = sorted({r for o in failed for r in o.ranks})
    return Outcome(not failed, max_error=max(errors) if errors else None, bound=max(bounds) if bounds else None,
                   message="; ".join(o.message for o in failed), ranks=tuple(ranks))
