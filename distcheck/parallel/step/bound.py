"""The bound that holds a parallel training step's float64 values to the single-device step's (numpy only).

What is compared: after every step, each parameter ``p`` and AdamW moment ``m`` (``exp_avg``), ``v``
(``exp_avg_sq``), elementwise, and the scalars the step reports (loss, grad norm, clipping factor).

**The floor of a kind (never a result that may cancel).** The parallel step does the reference's
arithmetic in another order: the inner sums of tensor-parallel matmuls split across ranks, gradient sums
over micro-batches and dp ranks, the norm's sum of squares over shards. Two orders of a sum of n terms
differ by at most ``2 gamma_{n-1} sum |terms|`` (Higham, *Accuracy and Stability of Numerical Algorithms*,
2nd ed., Lemma 3.1 and §4.2). The bound of a value is therefore set by the magnitudes of the terms it sums,
not by the value: a gradient entry that is 0 in exact arithmetic (a query projection when every sequence
keeps one token: a softmax over one key does not depend on the query) sums terms of the size of the step's
other gradients and keeps their rounding, while the reference may round it to exactly 0. Scaling a bound by
the value itself, or by the largest entry of its own tensor, gives 0 there and flags correct code. So each
value is held to ::

    |v - v_ref| <= 2^-32 (|v_ref| + S_kind)

where ``S_kind`` is the largest magnitude of that kind of value anywhere in the step's model (every
parameter's ``max |p|``, every ``max |m|``, every ``max |v|`` of the reference, at that step): the terms of a
weight-gradient entry are products of the step's activations and upstream gradients, whose size the largest
gradient entry of the step measures (``S_m`` is ``(1 - beta_1^s)`` times a gradient's scale, ``S_v`` a
squared one's). ``S_kind`` is 0 only when every value of the kind is 0 in the reference, which the drawn
steps never produce (every step keeps at least one token, so the loss depends on the head).

**Each step from the same state.** Step s + 1 of the reference starts from the parameters and moments the
parallel run reached after step s (:func:`distcheck.parallel.step.harness.reference_step`), so that every
step is held to the single-device step's arithmetic from the same state. Compounded over steps, a deviation
within the bound would not stay there: where a gradient cancels, ``v`` is near 0 and AdamW's
``m / (sqrt(v) + eps)`` (eps = 1e-8) multiplies the deviation of ``m`` by up to 1/eps, and the next step's
gradients move with the parameters (measured on torch's composition: the error of step 2 rose to 2^-8 of a
bound that held step 1 at 2^-17). A bug still shows: each step's start has passed the previous step's check,
and a rank that drifts from the others differs from the reference started from the lowest rank's state.

**Through AdamW (derived, not estimated).** The update ``p <- p - lr wd p - lr m_hat / (sqrt(v_hat) + eps)``
(``m_hat = m / (1 - beta_1^s)``, ``v_hat = v / (1 - beta_2^s)``) turns a deviation of ``m`` and ``v`` into one
of ``p`` that no relative bound on ``p`` contains. :func:`param_bounds` carries the moments' bounds through
the update, exactly and without linearising the square root::

    |f(m', v') - f(m, v)| <= dm / (lo + eps) + |m| min(sqrt(dv), dv / sqrt(v)) / ((sqrt(v) + eps)(lo + eps))

with ``f(m, v) = m / (sqrt(v) + eps)``, ``|m' - m| <= dm``, ``|v' - v| <= dv`` and ``lo = sqrt(max(0, v - dv))``
(``|sqrt(v') - sqrt(v)| <= sqrt(|v' - v|)``, and ``<= |v' - v| / sqrt(v)``), times ``lr``, plus the relative
floor of ``p`` itself (the start ``p`` and its weight decay are shared).

**What is proved and what is estimated.** Proved: the reordering bound of each sum (Higham) and the AdamW
propagation above. Estimated: that the first-order error of every compared moment, carried through one step's
softmax, RMSNorm, cross-entropy and clipping, is at most kappa = 2^11 times ``2 gamma_{n-1}`` (n <= 2^9 terms,
so ``2 gamma_{n-1} <= 2^-43``) times its kind's scale: 2^-32 in all. With the drawn sizes (unit-scale
weights, width <= 16, <= 2 layers, <= 3 steps) the errors seen from torch's composition stay below 2^-14 of
the bound (``benchmarks/step_bound_margin.py`` prints the margin of each step and kind; the compositions in
which values cancel, one kept token per sequence with a clip that binds, are a test of
``tests/test_step.py``), and every bug class the step mutants carry moves a value by more than 2^-12 of it.

**Lower precisions** (float32, bf16 mixed precision): :mod:`distcheck.parallel.step.precision`, which holds each
value to the single-device step in the same precision with this module's kind scales and AdamW propagation
(:func:`update_bound`); in float64 the single-device step is the reference itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BOUND", "kind_floor", "value_bound", "param_bounds", "update_bound"]

#: the relative bound of every compared float64 value, against ``|v_ref| + S_kind`` (module doc)
BOUND = 2.0**-32


def kind_floor(tensors: Sequence[Any] | Mapping[str, Any]) -> float:
    """``S_kind``: the largest magnitude of any entry of ``tensors`` (arrays of any shapes; None skipped), 0.0
    when there is none (module doc)."""
    values = tensors.values() if isinstance(tensors, Mapping) else tensors
    return max((float(np.max(np.abs(np.asarray(t, dtype=np.float64)))) for t in values
                if t is not None and np.size(t)), default=0.0)


def value_bound(ref: Any, floor: float) -> np.ndarray:
    """``2^-32 (|ref| + floor)`` elementwise, float64, the shape of ``ref`` (at least 1-d)."""
    return BOUND * (np.abs(np.atleast_1d(np.asarray(ref, dtype=np.float64))) + floor)


def update_bound(m: np.ndarray, v: np.ndarray, dm: np.ndarray, dv: np.ndarray, eps: float) -> np.ndarray:
    """The largest change of ``m / (sqrt(v) + eps)`` when m moves by at most dm and v by at most dv (module doc),
    elementwise, float64 arrays of one shape (v >= 0; an entry with v = 0 and dv > 0 moves by up to dm / eps plus
    ``|m| sqrt(dv) / eps^2``)."""
    v = np.maximum(v, 0.0)
    root = np.sqrt(v)
    lo = np.sqrt(np.maximum(v - dv, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.where(root > 0, dv / np.where(root > 0, root, 1.0), np.inf)
    moved = np.minimum(np.sqrt(dv), step)
    return dm / (lo + eps) + np.abs(m) * moved / ((root + eps) * (lo + eps))


_update_bound = update_bound


def param_bounds(steps: Sequence[Mapping[str, Any]], *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float) -> list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """The bound of every parameter and moment after each step, from the reference's values.

    ``steps[s]`` holds ``params`` (name -> the reference's parameter after step s + 1) and ``state`` (name ->
    ``(exp_avg, exp_avg_sq)``, float64 arrays of the parameter's shape, None where AdamW holds none); ``lr``,
    ``betas``, ``eps``, ``weight_decay`` are AdamW's. Returns, per step, name -> ``(bound of p, bound of
    exp_avg, bound of exp_avg_sq)``, arrays of the parameter's shape (a moment's bound is zeros where the
    reference holds no moment). The moments' bounds are ``value_bound`` with their kind's floor; the
    parameter's adds the moments' carried through the update (each step starts from a shared state: module
    doc)."""
    b1, b2 = betas
    out: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for s, step in enumerate(steps, start=1):
        params, state = step["params"], step["state"]
        floors = (kind_floor(params), kind_floor([st[0] for st in state.values()]),
                  kind_floor([st[1] for st in state.values()]))
        bounds = {}
        for name, p in params.items():
            p = np.asarray(p, dtype=np.float64)
            m, v = state.get(name, (None, None))
            own = BOUND * (np.abs(p) + floors[0])
            if m is None or v is None:
                zeros = np.zeros_like(p)
                bounds[name] = (own, zeros, zeros)
                continue
            m, v = np.asarray(m, dtype=np.float64), np.asarray(v, dtype=np.float64)
            dm, dv = value_bound(m, floors[1]).reshape(m.shape), value_bound(v, floors[2]).reshape(v.shape)
            c1, c2 = 1.0 - b1**s, 1.0 - b2**s
            moved = update_bound(m / c1, v / c2, dm / c1, dv / c2, eps)
            bounds[name] = (lr * moved + own, dm, dv)
        out.append(bounds)
    return out
