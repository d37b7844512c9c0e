"""The first divergence of a recorded replay (:mod:`distcheck.parallel.step.trace`, whose module doc gives
what is recorded and the order): every rank's pieces mapped back to full tensors
(:mod:`~distcheck.parallel.step.mapping`), each held to the contract's bound of its kind
(:mod:`~distcheck.parallel.step.bound`), and the first that leaves it named. numpy only: the parent runs no
torch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from distcheck.parallel.step.mapping import Unmapped, _Candidate, assemble
from distcheck.parallel.step.trace import (
    CLIPPED_GRAD,
    EXP_AVG,
    EXP_AVG_SQ,
    GRAD,
    INPUT_GRAD,
    LOSS,
    NORM,
    OUTPUT,
    OUTPUT_GRAD,
    PARAM,
    PER_MICROBATCH,
    REDUCED_GRAD,
    TOKENS,
)

if TYPE_CHECKING:
    from distcheck.parallel.step.case import StepCase
    from distcheck.parallel.step.reference import StepLayout

__all__ = ["recorded_bound", "within", "first_divergence", "explain_step"]

#: the kinds compared exactly (integers)
_EXACT = frozenset({TOKENS})


def recorded_bound(kind: str, ref: np.ndarray, floor: float) -> np.ndarray:
    """The bound of every entry of a recorded tensor of ``kind`` against the reference's ``ref``, the contract's
    (:mod:`~distcheck.parallel.step.bound`): the reported tokens exact (0); the reported loss and grad norm, sums
    of terms of one sign, ``2^-31 |v_ref|``; every other value ``2^-32 (|v_ref| + S)``, ``S`` = ``floor``, the
    largest magnitude of the reference's tensors of its kind in the step (``value_bound``). The updated
    parameters and AdamW's moments are held to ``param_bounds`` instead (:func:`first_divergence`). The one place
    the recorder's bound of a kind is chosen."""
    from distcheck.parallel.step.bound import value_bound

    shape = np.shape(ref)
    if kind in _EXACT:
        return np.zeros(shape)
    if kind in (LOSS, NORM):
        return 2 * value_bound(ref, 0.0).reshape(shape)
    return value_bound(ref, floor).reshape(shape)


@dataclass
class _Fit:
    ok: bool
    error: float = 0.0
    bound: float = 0.0
    index: tuple = ()
    expected: float = 0.0
    got: float = 0.0
    bad: np.ndarray | None = None


def within(ref: np.ndarray, got: np.ndarray, bound: np.ndarray) -> _Fit:
    """Whether ``got`` is within ``bound`` (an array of ``ref``'s shape, :func:`recorded_bound`) of ``ref``; the
    worst entry's index, values, error and bound, and the mask of entries outside. Unmapped for another shape."""
    e = np.asarray(ref, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    if g.shape != e.shape:
        raise Unmapped(f"shape {g.shape}, the reference's {e.shape}")
    err = np.abs(g - e)
    err = np.where(np.isnan(err), np.inf, err)
    bad = err > bound
    if not bad.any():
        return _Fit(True, float(err.max()) if err.size else 0.0, float(bound.max()) if bound.size else 0.0)
    i = np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), e.shape)
    return _Fit(False, float(err[i]), float(bound[i]), tuple(int(j) for j in i), float(e[i]), float(g[i]), bad)


# ---------------------------------------------------------------------------------------------------- the report


def _index(results: list, layout: StepLayout, m: int) -> dict[tuple, dict[int, dict]]:
    """Every rank's events by key ``(step, micro-batch, dp index, call, kind, name, part)`` (micro-batch, dp index
    and call None for a step's tensors) -> rank -> piece; under pp the last m calls of a step are its m
    micro-batches."""
    got: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r, res in enumerate(results):
        d = layout.dp_index(r)
        calls: dict[tuple, list[dict]] = defaultdict(list)
        for s, mb, _, call, kind, name, part, pc in res["trace"]:
            if kind not in PER_MICROBATCH:
                got[(s, None, None, None, kind, name, part)][r] = pc
            elif mb is None:  # a pipeline schedule's
                calls[(s, kind, name, part)].append(pc)
            else:
                got[(s, mb, d, call, kind, name, part)][r] = pc
        for (s, kind, name, part), pcs in calls.items():
            for k, pc in enumerate(pcs[-m:]):
                got[(s, k, d, 0, kind, name, part)][r] = pc
    return got


def _what(kind: str, name: str, part: int, tied: list[str]) -> str:
    shown = (name or "the model") + (f"[{part}]" if part else "")
    also = f" (tied to {', '.join(tied)} in the reference)" if tied else ""
    return {OUTPUT: f"output of {shown}", OUTPUT_GRAD: f"gradient of the loss w.r.t. the output of {shown}",
            INPUT_GRAD: f"input grad of {shown}", GRAD: f"grad of {shown}{also}",
            REDUCED_GRAD: f"reduced grad of {shown}{also} (after every micro-batch, before clipping)",
            CLIPPED_GRAD: f"clipped grad of {shown}{also}", EXP_AVG: f"AdamW exp_avg of {shown}{also}",
            EXP_AVG_SQ: f"AdamW exp_avg_sq of {shown}{also}", PARAM: f"updated parameter {shown}{also}",
            LOSS: "the reported loss", TOKENS: "the reported tokens",
            NORM: "the grad norm the clipping hook returned"}[kind]


def _ranks(ranks: list[int]) -> str:
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def _slots(ref_events: list, layout: StepLayout) -> tuple[dict, dict, list]:
    """The reference's tensors by key, the floor of each (step, kind) and the slots in execution order (module
    doc): per step, each micro-batch's tensors in the order dp rank 0's were made, then the step's."""
    floors: dict[tuple, float] = defaultdict(float)
    ref: dict[tuple, np.ndarray] = {}
    slots: list[tuple] = []
    for pos, (s, mb, d, call, kind, name, part, pc) in enumerate(ref_events):
        if layout.pp > 1 and name == "" and kind in PER_MICROBATCH:
            continue  # a stage's root is a cut of the model: the model's own root is on no rank
        a = np.asarray(pc["local"], dtype=np.float64)
        floors[(s, kind)] = max(floors[(s, kind)], float(np.abs(a).max()) if a.size else 0.0)
        if kind in PER_MICROBATCH:
            ref[(s, mb, d, call, kind, name, part)] = a
            if d == 0:
                slots.append(((s, 0, mb, pos), (s, mb, call, kind, name, part)))
        else:
            ref[(s, None, None, None, kind, name, part)] = a
            slots.append(((s, 1, 0, pos), (s, None, None, kind, name, part)))
    slots.sort(key=lambda x: x[0])
    return ref, floors, [slot for _, slot in slots]


def _param_bounds(case: StepCase, ref_events: list) -> dict[tuple, np.ndarray]:
    """``(step, kind, name) -> bound`` of the updated parameters and AdamW's moments: the contract's
    (``param_bounds``: the moments' bounds carried through AdamW's update) from the reference's values."""
    from distcheck.parallel.step.bound import param_bounds
    from distcheck.parallel.step.harness import ADAMW

    states: list[dict] = [{"params": {}, "state": {}} for _ in range(case.steps)]
    for s, _, _, _, kind, name, _, pc in ref_events:
        if kind == PARAM:
            states[s]["params"][name] = np.asarray(pc["local"], dtype=np.float64)
        elif kind in (EXP_AVG, EXP_AVG_SQ):
            moments = states[s]["state"].setdefault(name, [None, None])
            moments[kind == EXP_AVG_SQ] = np.asarray(pc["local"], dtype=np.float64)
    bounds: dict[tuple, np.ndarray] = {}
    for s, per_name in enumerate(param_bounds(states, lr=case.lr, **ADAMW)):
        for name, (bp, bm, bv) in per_name.items():
            bounds.update({(s, PARAM, name): bp, (s, EXP_AVG, name): bm, (s, EXP_AVG_SQ, name): bv})
    return bounds


def _compare(want: np.ndarray, cands: list[_Candidate], bound: np.ndarray) -> tuple[_Fit | None, list[int]]:
    """The worst fit of the candidates outside ``bound`` (None when all are within) and the ranks at fault."""
    worst: _Fit | None = None
    bad: list[int] = []
    for c in cands:
        fit = within(want, c.array, bound)
        if not fit.ok and c.alternative is not None:
            alt = within(want, c.alternative.array, bound)
            fit = alt if alt.ok else fit
        if fit.ok:
            continue
        owners = set(np.unique(c.owner[fit.bad]).tolist()) if fit.bad is not None else {-1}
        bad += c.ranks if -1 in owners else sorted(owners)
        if worst is None or fit.error > worst.error:
            worst = fit
    return worst, bad


def first_divergence(case: StepCase, results: list, reference: dict) -> str:
    """The report of a recorded replay: ``results[r]`` holds rank r's ``trace`` and ``shard_dims`` (declared layouts),
    ``reference`` is :func:`~distcheck.parallel.step.harness.reference_trace`'s (module doc). One line: ``first
    divergence: <tensor>, step s, micro-batch k, ranks ...: error e > bound b (...)``, how many tensors matched
    before it, and the tensors that could not be mapped (skipped, with the reason); or that none leaves its bound."""
    layout = case.layout
    tied = reference["tied"]
    got = _index(results, layout, case.microbatches)
    shard: dict[str, int | str] = {}
    for res in results:
        shard.update(res.get("shard_dims", {}))
    ref, floors, slots = _slots(reference["events"], layout)
    bounds = _param_bounds(case, reference["events"])
    matched, skipped = 0, []
    for s, mb, call, kind, name, part in slots:
        keys = ([(s, mb, d, call, kind, name, part) for d in range(layout.dp)] if kind in PER_MICROBATCH
                else [(s, None, None, None, kind, name, part)])
        what = _what(kind, name, part, tied.get(name, []))
        worst: _Fit | None = None
        bad_ranks: list[int] = []
        for key in keys:
            if not got.get(key):
                skipped.append(f"{what} (no rank recorded it)")
                continue
            bound = bounds.get((s, kind, name))
            if bound is None:
                bound = recorded_bound(kind, ref[key], floors[(s, kind)])
            try:
                cands = assemble(got[key], ref[key].shape, layout,
                                 shard.get(f"{name}:input" if kind == INPUT_GRAD else name),
                                 alternative_sum=kind == GRAD)
                fit, bad = _compare(ref[key], cands, bound)
            except Unmapped as exc:
                skipped.append(f"{what} ({exc})")
                continue
            bad_ranks += bad
            if fit is not None and (worst is None or fit.error > worst.error):
                worst = fit
        if worst is None:
            matched += 1
            continue
        at = f", step {s + 1}" + (f", micro-batch {mb}" if mb is not None else "")
        index = f"at index {worst.index}: " if worst.index else ""
        values = f"{index}expected {worst.expected:.17g}, got {worst.got:.17g}"
        error = (f"{values} (exact)" if kind in _EXACT else
                 f"error {worst.error:.2e} > bound {worst.bound:.2e} ({values})")
        return (f"first divergence: {what}{at}, {_ranks(bad_ranks)}: {error}; {matched} recorded tensors matched "
                f"before it" + _skipped(skipped))
    return (f"first divergence: none of the {matched} recorded tensors (every module's outputs and gradients, the "
            f"step's gradients, AdamW's state and the parameters) leaves its bound on the recorded replay"
            + _skipped(skipped))


def _skipped(skipped: list[str]) -> str:
    if not skipped:
        return ""
    shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return f"; not mapped, skipped: {shown}"


def explain_step(case: StepCase, results: list) -> str:
    """:func:`first_divergence` of every rank's recorded replay (``results``, :func:`~distcheck.parallel.step.
    harness.run_step` with ``record``: rank 0's carries the ``reference_trace``). numpy only: the parent runs no
    torch."""
    return first_divergence(case, results, results[0]["reference_trace"])
