"""The precisions a training step is certified in, and the criterion that holds a low-precision parallel step to
the single-device step in the same precision (numpy only; :func:`autocast_for` imports torch when called).

**The precisions** (:data:`PRECISIONS`; the contract's ``--dtypes`` picks the dtype, ``--option
mixed_precision=...`` which bf16 recipes are drawn; the target reads the one certified from ``layout.precision``):

==================  =========  ===========  =========  ========  ==============================================
precision           dtype      master       compute    reduce    how
==================  =========  ===========  =========  ========  ==============================================
``float64``         float64    float64      float64    float64   the model in float64 (the default)
``float32``         float32    float32      float32    float32   the model in float32
``bf16-fsdp``       bfloat16   float32      bfloat16   float32   FSDP2's ``MixedPrecisionPolicy(param_dtype=
                                                                 torch.bfloat16, reduce_dtype=torch.float32)``,
                                                                 applied by the target's ``parallelize``
``bf16-autocast``   bfloat16   float32      bfloat16   float32   the forward and the loss under
                                                                 ``torch.autocast(device, torch.bfloat16)``
                                                                 (distcheck's step enters it), no FSDP2 policy
==================  =========  ===========  =========  ========  ==============================================

``master`` is the parameters' dtype and AdamW's state (``exp_avg``, ``exp_avg_sq``): fp32 master weights under
both bf16 recipes. The loss is formed in float32 from bf16 logits (``token_loss_sum`` casts them, as torchtitan's
``cross_entropy_loss`` does; autocast runs ``cross_entropy`` in float32 anyway).

**Three steps from the same state.** For every step s, from the state the parallel run reached after step s - 1
(step 1 from the case's weights rounded to the master dtype), three steps are taken:

* ``v_p``: the parallel step (every rank, the composition drawn);
* ``v_1``: the single-device step in the same precision
  (:func:`distcheck.parallel.step.harness.device_step`): the same micro-batches (every dp rank's, one after the
  other, gradient accumulation on one device), the same recipe (a bf16 copy of the master weights under
  ``bf16-fsdp``, whose bf16 gradients are accumulated into the fp32 master gradients as FSDP2 does; autocast
  under ``bf16-autocast``), ``clip_grad_norm_`` and AdamW in the master dtype;
* ``v_64``: the float64 shadow of that step (:func:`~distcheck.parallel.step.harness.reference_step`): the same
  state in float64, the whole batch at once.

**The criterion.** Every compared value (each entry of every parameter, ``exp_avg`` and ``exp_avg_sq``; the
reported loss, grad norm and clipping factor) is held to::

    |v_p - v_64| <= |v_1 - v_64| + (c - 1) E_1 + f u_r (|v_64| + S_kind)

``|v_1 - v_64|`` is the single-device step's own error at that entry, measured (not estimated: the float64
shadow is exact to far below it), ``E_1`` the largest of them in the value's tensor (its parameter's, that
moment's; a scalar is its own tensor), ``S_kind`` the largest magnitude of that kind of value in the shadow's
step (:mod:`distcheck.parallel.step.bound`), ``u_r`` the unit roundoff of the arithmetic the composition
reorders, and ``c``, ``f`` the two constants below.

*Derived, c = 1: compositions that keep every micro-batch's arithmetic* (``tp = 1``: ``dp_replicate``,
``dp_shard``, ``pp``). FSDP2 casts each fp32 shard to bf16 and all-gathers it (the cast of the whole tensor),
each rank runs its micro-batches through the same modules on the same shapes as the single device does, so
every micro-batch's forward and backward is the single device's, bit for bit (deterministic kernels on equal
shapes), and its gradients are scaled by dp, a power of two, exactly. What differs is the order of the sums
after it: the gradients' reduction over the dp ranks (in ``reduce_dtype``, fp32) and over the micro-batches
(fp32), the norm's sum of squares (fp32), the loss's sum (float64). By the triangle inequality
``|v_p - v_64| <= |v_1 - v_64| + |v_p - v_1|``, and ``|v_p - v_1|`` is a reordering of those fp32 sums of n <= 12
terms, ``2 gamma_{n-1} sum |terms| <= 2^-19.5 sum |terms|`` (Higham, Lemma 3.1), carried through clipping and
AdamW's moments by one rounding each: :data:`FLOOR` u_fp32 = 2^-16 of the kind's scale. A bug whose error is
bf16's (a sum rounded to bf16, a master weight stored in bf16: 2^-9 relative) is 2^7 above that floor: it
fails wherever it does not happen to cancel the single device's own error, which for a tensor of many entries
is everywhere.

*Measured, c = C_TP: tensor parallelism* (``tp > 1``). A row-parallel matmul's partial sums are formed and
reduced in the compute dtype (DTensor reduces a bf16 ``Partial`` in bf16), and a sequence-parallel norm's
weight gradient is summed over the tp ranks in it too: new roundings of the same size as the single device's
own, carried through the rest of the network. ``|v_p - v_1|`` is then another draw of the noise the single
device has, not a reordering: no derivation bounds it by less than the noise itself. Its constants are measured
on torch's composition (``benchmarks/step_precision_margin.py``: 1,000 drawn cases per precision at 2 ranks,
300 at 4, every layout; docs/CERTIFY.md has the table): ``c`` = :data:`C_TP` times the tensor's largest
single-device error, plus :data:`FLOOR_TP` ``u_compute`` of the kind's scale for a tensor whose own errors happen
to be small (a norm weight of 8 entries). The runs needed at most 2^2 ``u_compute`` of floor at c = 8, and the
worst value sat at 2^-1.3 of its bound. A ``ci`` run at 4 ranks after them drew a float32 case that needed
2^5.4 (``dp_shard=2, tp=2``, seed 11504: the grad norm 2^-18.5 of itself from the float64 shadow where the single
device was 2^-24.5 away; gradients that cancel over tokens carry roundings of their terms, not of themselves),
so float32's floor is 2^6; bf16's stays 2^4, its worst seen 2^1.2. These are estimates of a tail, not bounds: a
case beyond them is a false flag, reported with the case.

*The parameters: derived from the moments, through AdamW exactly.* The parallel and single-device steps start
from the same parameter, so ``|p_p - p_1|`` is AdamW's update moved by ``|m_p - m_1| <= |m_p - m_64| + |m_1 -
m_64|`` (and the same for v), carried through ``m / (sqrt(v) + eps)`` without linearising
(:func:`~distcheck.parallel.step.bound.update_bound`), times lr, plus :data:`FLOOR` ``u_master`` of the
parameters' scale for the update's own roundings; ``|p_p - p_64| <= |p_1 - p_64| + |p_p - p_1|``.

**What the params property can claim in bf16.** Under AdamW the update of an entry is ``m_hat / (sqrt(v_hat) +
eps)``: at step 1 it is ``sign(g)``, whatever the size of g. Where a gradient is within the compute dtype's noise
of 0 (the gradients of a query projection when every sequence keeps one token, or an entry that cancels over
tokens), its sign is not determined by the computation, and the single device and the parallel run may step it
by ``+lr`` and ``-lr``: a difference of ``2 lr``, honest. There the bound above is the whole update (``v`` within
its allowed deviation of 0, so ``dm / eps``): the property claims nothing about that entry beyond the moments
(which are held on every entry). On every other entry (the gradient's sign is decided) it claims the parameter
to within the single device's error plus the moments' allowed deviations, carried through AdamW: far below a
bf16 rounding of the parameter, so fp32 master weights are checked on every such entry.

**What it cannot see.** A deviation smaller than the single device's own error in the same precision, where the
composition changes the low-precision arithmetic (tp): there a bf16 rounding more or less is noise, by
construction of the criterion, so a low-precision bug that only adds one rounding of that size shows on the
layouts that keep the micro-batch's arithmetic (each of ``examples/precision_mutants.py`` does: dp_shard = 2 at
2 ranks is drawn first). A
bug that the single device makes too (a loss formed in bf16 by the user's own ``loss`` hook: the single device
runs the same hook) is the precision's, not the composition's. Entries whose gradient sign is undetermined
(above). Kernels that are not deterministic on equal shapes would break c = 1's premise (CPU and the drawn sizes
are; the 1,000-case runs check it).

**The anchor: TTrace** (Jiang et al. 2025, arXiv 2506.09280) compares a distributed run's tensors with a
single-device reference in the same low precision, and sets each tensor's tolerance from the reference's own
sensitivity: the reference run again with its inputs perturbed at the dtype's roundoff, the difference scaled by
a margin. That estimates the single device's error at the scale of bf16 noise, so it cannot see a bug below it.
Here the float64 shadow measures that error exactly, per entry, and on compositions that keep the micro-batch's
arithmetic the tolerance above it is fp32's (2^-16 of the scale), not bf16's: a reduction in bf16 or bf16 master
weights, each within TTrace's tolerance by construction (one bf16 rounding), fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError

__all__ = ["Precision", "PRECISIONS", "MIXED_MODES", "UNIT_ROUNDOFF", "FLOOR", "C_TP", "FLOOR_TP",
           "get_precision", "precisions_for", "reordered", "precision_bounds", "autocast_for", "autocast_hooks",
           "floating_to"]

#: the unit roundoff of each dtype (round to nearest): 2^-p for p significand bits
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8}
#: the floor's factor on the reordered arithmetic's unit roundoff, compositions that keep the micro-batch's
#: arithmetic (module doc: 2 gamma_11 <= 2^-19.5 of the terms, carried by one rounding each, with 2^3 to spare)
FLOOR = 2.0**8
#: tensor parallelism: the factor c on the tensor's largest single-device error (measured, module doc)
C_TP = 8.0
#: tensor parallelism: the floor's factor on the compute dtype's unit roundoff, per compute dtype (measured, module
#: doc: float32's from a case the 4,500-case runs did not draw)
FLOOR_TP: dict[str, float] = {"float32": 2.0**6, "bfloat16": 2.0**4}


@dataclass(frozen=True)
class Precision:
    """A recipe (module doc's table): ``name``; ``dtype`` (the contract's ``--dtypes`` entry); ``master``
    (parameters and AdamW state), ``compute`` (forward and backward), ``reduce`` (the gradients' reductions
    over dp): dtype names; ``autocast`` (distcheck's step runs the forward and the loss under
    ``torch.autocast(compute)``); ``policy`` (the target's FSDP2 applies ``MixedPrecisionPolicy(param_dtype=compute,
    reduce_dtype=reduce)``); ``shown`` (how a counterexample names it)."""

    name: str
    dtype: str
    master: str
    compute: str
    reduce: str
    autocast: bool
    policy: bool
    shown: str

    @property
    def mixed(self) -> bool:
        """The compute dtype is narrower than the master weights'."""
        return self.compute != self.master


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("float64", "float64", "float64", "float64", "float64", False, False, "float64"),
    Precision("float32", "float32", "float32", "float32", "float32", False, False, "float32"),
    Precision("bf16-fsdp", "bfloat16", "float32", "bfloat16", "float32", False, True,
              "bf16 (FSDP2 MixedPrecisionPolicy, fp32 master and reduce)"),
    Precision("bf16-autocast", "bfloat16", "float32", "bfloat16", "float32", True, False,
              "bf16 (autocast, fp32 master and reduce)"),
)}
#: the ``mixed_precision`` option's names of the bf16 recipes
MIXED_MODES = {"fsdp": "bf16-fsdp", "autocast": "bf16-autocast"}


def get_precision(name: str) -> Precision:
    """The :class:`Precision` named ``name``; ConfigError naming the field otherwise."""
    if name not in PRECISIONS:
        raise ConfigError("precision", name, f"must be one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def precisions_for(dtype: str, modes: str = "fsdp,autocast") -> tuple[str, ...]:
    """The precisions certified for the contract dtype ``dtype``: itself for float64 and float32, the bf16
    recipes ``modes`` names (the ``mixed_precision`` option, comma-separated among ``fsdp``, ``autocast``) for
    bfloat16; () for another dtype. ConfigError naming the option for a mode that is not one, or none."""
    names = tuple(dict.fromkeys(filter(None, (m.strip() for m in modes.split(",")))))
    for m in names:
        if m not in MIXED_MODES:
            raise ConfigError("option mixed_precision", modes, f"mode {m!r} must be one of {', '.join(MIXED_MODES)}")
    if not names:
        raise ConfigError("option mixed_precision", modes, f"names no mode: give {' or '.join(MIXED_MODES)}")
    if dtype in ("float64", "float32"):
        return (dtype,)
    if dtype == "bfloat16":
        return tuple(MIXED_MODES[m] for m in names)
    return ()


def reordered(prec: Precision, tp: int) -> tuple[str, float, float]:
    """``(dtype, c, f)`` of the criterion (module doc) for a composition of ``tp`` tensor-parallel ranks: the
    dtype whose arithmetic the composition reorders (the reduce dtype when ``tp == 1``, the compute dtype
    otherwise), the factor c and the floor's factor f."""
    if tp == 1:
        return prec.reduce, 1.0, FLOOR
    return prec.compute, C_TP, FLOOR_TP[prec.compute]


def autocast_for(name: str, device: Any) -> Any:
    """The context the step's forward and loss run in: ``torch.autocast(device type, torch.bfloat16)`` under
    ``bf16-autocast``, ``contextlib.nullcontext()`` otherwise."""
    import contextlib

    import torch

    prec = get_precision(name)
    if not prec.autocast:
        return contextlib.nullcontext()
    kind = device.type if hasattr(device, "type") else str(device)
    return torch.autocast(device_type=kind, dtype=getattr(torch, prec.compute))


def autocast_hooks(module: Any, name: str, device: Any) -> list:
    """Under ``bf16-autocast``, ``module``'s forwards run under :func:`autocast_for` (entered by a forward pre-hook,
    left by a forward hook: a pipeline stage's, whose backwards the schedule runs outside it); the hooks' handles
    (remove them after), [] under another precision."""
    if not get_precision(name).autocast:
        return []
    cast = autocast_for(name, device)

    def enter(mod: Any, args: Any) -> None:
        cast.__enter__()

    def leave(mod: Any, args: Any, out: Any) -> None:
        cast.__exit__(None, None, None)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


def _floor(values: Any) -> float:
    from distcheck.parallel.step.bound import kind_floor

    return kind_floor(values)


def _held(shadow: Any, single: Any, c: float, f: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``(bound, own)``: the criterion's bound of one tensor (module doc) and the single device's own error."""
    ref = np.atleast_1d(np.asarray(shadow, dtype=np.float64))
    own = np.abs(np.atleast_1d(np.asarray(single, dtype=np.float64)) - ref)
    top = float(own.max()) if own.size else 0.0
    return own + (c - 1.0) * top + f * (np.abs(ref) + scale), own


def precision_bounds(shadow: Sequence[Mapping[str, Any]], single: Sequence[Mapping[str, Any]], prec: Precision,
                     tp: int, *, lr: float, betas: tuple[float, float], eps: float,
                     weight_decay: float) -> list[dict[str, Any]]:
    """The criterion's bounds (module doc) after each step.

    ``shadow[s]`` and ``single[s]`` are :func:`~distcheck.parallel.step.harness.reference_step`'s records of the
    float64 shadow and of the single-device step in ``prec`` (``params``, ``state``: name -> float64 arrays;
    ``loss``, ``norm``, ``scale``: floats), from the same state; ``tp`` the composition's tensor-parallel degree;
    ``lr``, ``betas``, ``eps``, ``weight_decay`` AdamW's. Returns, per step, ``params``: name -> ``(bound of p,
    bound of exp_avg, bound of exp_avg_sq)`` and ``own``: name -> the single device's errors of the same three,
    arrays of the parameter's shape (zeros where AdamW holds no moment); ``loss``, ``norm``, ``scale``: each
    ``(bound, own error)``."""
    from distcheck.parallel.step.bound import update_bound

    dtype, c, f = reordered(prec, tp)
    u = UNIT_ROUNDOFF[dtype] * f
    u_master = UNIT_ROUNDOFF[prec.master] * FLOOR
    b1, b2 = betas
    out: list[dict[str, Any]] = []
    for s, (ref, one) in enumerate(zip(shadow, single, strict=True), start=1):
        params, state = ref["params"], ref["state"]
        s_p = _floor(params)
        s_m = _floor([st[0] for st in state.values()])
        s_v = _floor([st[1] for st in state.values()])
        bounds, own = {}, {}
        for name, p in params.items():
            p = np.asarray(p, dtype=np.float64)
            e_p = np.abs(np.asarray(one["params"][name], dtype=np.float64) - p)
            m, v = state.get(name, (None, None))
            m1, v1 = one["state"].get(name, (None, None))
            if m is None or v is None or m1 is None or v1 is None:
                zeros = np.zeros_like(p)
                bounds[name] = (e_p + u_master * (np.abs(p) + s_p), zeros, zeros)
                own[name] = (e_p, zeros, zeros)
                continue
            bm, e_m = _held(m, m1, c, u, s_m)
            bv, e_v = _held(v, v1, c, u, s_v)
            bm, e_m, bv, e_v = (a.reshape(p.shape) for a in (bm, e_m, bv, e_v))
            c1, c2 = 1.0 - b1**s, 1.0 - b2**s
            m1, v1 = np.asarray(m1, dtype=np.float64), np.asarray(v1, dtype=np.float64)
            moved = update_bound(m1 / c1, v1 / c2, (e_m + bm) / c1, (e_v + bv) / c2, eps)
            bounds[name] = (e_p + lr * moved + u_master * (np.abs(p) + s_p), bm, bv)
            own[name] = (e_p, e_m, e_v)
        step: dict[str, Any] = {"params": bounds, "own": own}
        for key in ("loss", "norm", "scale"):
            b, e = _held(ref[key], one[key], c, u, 0.0)
            step[key] = (float(b[0]), float(e[0]))
        out.append(step)
    return out


def floating_to(model: Any, dtype: Any) -> Any:
    """``model`` with its floating-point parameters and buffers cast to ``dtype`` (a torch dtype), in place; a
    complex buffer (torchtitan's RoPE cache) keeps its dtype: ``Module.to(dtype)`` would cast it to a real one and
    drop its imaginary part. Returns ``model``."""
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)
