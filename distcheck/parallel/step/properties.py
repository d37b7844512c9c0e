"""Properties of the step's reductions on simulated worlds (numpy; each rank's values laid out by the
references): what a training step under dp_replicate x dp_shard x tp x pp x gradient accumulation must
reduce, and how. Every case holds integers and power-of-two degrees, so each comparison is bitwise.

Implementation slots (the step's reductions, seen over the whole simulated world):

* ``reduce_loss(losses, masks) -> float``: the reported loss from every dp rank's micro-batches;
* ``grad_norm(shards, placements, layout) -> float``: the global norm from every rank's local shards;
* ``loss_scale(layout) -> float``: the factor on ``sum of token losses / global tokens`` that makes the dp
  average of the gradients (FSDP2, DDP) the global token-mean gradient;
* ``norm_weight_grad(partials, layout) -> array``: a replicated norm weight's gradient from the tp ranks'
  partial gradients (sequence parallelism: each rank's tokens);
* ``clip_scale(norm, max_norm) -> float``: the clipping factor;
* ``token_count(masks) -> int``: the step's non-ignored tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from distcheck.core.errors import PropertyFailure
from distcheck.engine.catalogue import form_value
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.step import reference as ref
from distcheck.parallel.step import strategies as ss

__all__ = ["loss_is_token_mean", "grad_norm_counts_once", "loss_scale_is_dp", "norm_weight_summed",
           "clip_scale_is_torch", "tokens_add_up"]


def _tokens(case: ss.StepReductionCase) -> int:
    return ref.token_count(case.masks)


def loss_is_token_mean(case: ss.StepReductionCase, *, impl: Callable[..., float] = ref.token_mean_loss) -> None:
    """The reported loss == sum of every kept token's loss times ``step.loss.token_weight`` = 1/T, bitwise."""
    weight = form_value("step.loss.token_weight", tokens=_tokens(case))
    kept = sum(Fraction(float(v)) for rank_l, rank_m in zip(case.losses, case.masks, strict=True)
               for lk, mk in zip(rank_l, rank_m, strict=True) for v in lk[mk])
    want = float(kept * weight)
    got = call_impl("reduce_loss", impl, case.losses, case.masks)
    if got != want:
        raise PropertyFailure(f"reported loss for {case}", expected=want, got=got)


def _shards(case: ss.StepReductionCase) -> list[list[np.ndarray | None]]:
    lay = case.layout
    return [[ref.local_shard(g, p, lay, r) for g, p in zip(case.grads, case.placements, strict=True)]
            for r in range(lay.world_size)]


def grad_norm_counts_once(case: ss.StepReductionCase, *, impl: Callable[..., float] = ref.sharded_grad_norm) -> None:
    """The norm from the local shards == sqrt of the sum of squares over the unique parameters, every stage's
    included and each element once (``step.grad_norm.copies``), bitwise."""
    lay = case.layout
    shards = _shards(case)
    want = float(np.sqrt(float(sum(int(np.sum(g.astype(np.int64) ** 2)) for g in case.grads))))
    got = call_impl("grad_norm", impl, shards, list(case.placements), lay)
    if got != want:
        raise PropertyFailure(f"global grad norm for {case}", expected=want, got=got)


def loss_scale_is_dp(case: ss.StepReductionCase, *, impl: Callable[..., Any] | None = None) -> None:
    """FSDP2 and DDP average the gradients over the dp ranks, so the factor on ``sum / T`` must be dp: the
    averaged gradient is then the global token-mean gradient, bitwise."""
    impl = impl or (lambda layout: layout.dp)
    lay = case.layout
    per_rank = [case.grads[0] * (d + 1) for d in range(lay.dp)]  # dp rank d's sum of token-loss gradients
    T = _tokens(case)
    total = [Fraction(float(v)) for v in np.ravel(sum(per_rank[1:], per_rank[0]))]
    factor = Fraction(call_impl("loss_scale", impl, lay))
    got = [factor * v / (T * lay.dp) for v in total]  # each rank's loss x factor / T, then FSDP2's mean over dp
    want = [v / T for v in total]
    if got != want:
        raise PropertyFailure(f"dp-averaged gradient with loss factor {factor} for {case}",
                              expected=[str(v) for v in want], got=[str(v) for v in got])


def norm_weight_summed(case: ss.StepReductionCase, *, impl: Callable[..., Any] | None = None) -> None:
    """A tp-replicated norm weight under sequence parallelism: its gradient is the sum of the tp ranks'
    partial gradients (each from its own tokens), bitwise."""
    impl = impl or (lambda partials, layout: sum(partials[1:], partials[0]))
    want = sum(case.norm_partials[1:], case.norm_partials[0])
    got = np.asarray(call_impl("norm_weight_grad", impl, list(case.norm_partials), case.layout))
    if not np.array_equal(got, want):
        raise PropertyFailure(f"norm weight gradient for {case}", expected=want.tolist(), got=got.tolist())


def clip_scale_is_torch(case: ss.StepReductionCase, *, impl: Callable[..., float] = ref.clip_scale) -> None:
    """The clipping factor == ``step.clip.scale`` = min(1, max_norm / (norm + 1e-6)), within 2 roundings
    (float64's ``norm + 1e-6`` and the division: relative 2^-52)."""
    want = form_value("step.clip.scale", norm=Fraction(case.norm), max_norm=Fraction(case.max_norm))
    got = call_impl("clip_scale", impl, case.norm, case.max_norm)
    if abs(Fraction(got) - want) > want * Fraction(1, 2**52):
        raise PropertyFailure(f"clipping factor for {case}", expected=float(want), got=got)


def tokens_add_up(case: ss.StepReductionCase, *, impl: Callable[..., int] = ref.token_count) -> None:
    """The step's tokens == the kept tokens over every dp rank and micro-batch (exact)."""
    want = sum(int(np.count_nonzero(m)) for rank in case.masks for m in rank)
    got = call_impl("token_count", impl, case.masks)
    if got != want:
        raise PropertyFailure(f"tokens of the step for {case}", expected=want, got=got)


def _edges() -> tuple[ss.StepReductionCase, ...]:
    """dp_shard=2 with unequal micro-batches (the mean of means is off); tp=2 with a tp-replicated norm;
    pp=2 with a parameter on stage 1; dp_replicate=2; clipping that does not bind."""
    R, L, P = ss.StepReductionCase, ref.StepLayout, ref.Placement
    one = np.array([1.0, 2.0])
    mask = (np.array([True, False]), np.array([True, True]))
    return (R(L(dp_shard=2, tp=2, pp=2), ((one, one), (one, 2 * one)), (mask, mask),
              (np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0], [2.0]]), np.array([[2.0, 1.0]])),
              (P(None, 0), P(0, 0), P(None, 1)), (one, 2 * one), 1.0, 8.0),
            R(L(dp_replicate=2), ((one,), (one,)), ((mask[0],), (mask[1],)), (np.array([[3.0]]),), (P(None, 0),),
              (one,), 64.0, 8.0))


_cases = lambda: ss.step_reduction_cases()  # noqa: E731

register(Property("step.loss.token_mean", _cases, loss_is_token_mean,
                  "the reported loss is the global token mean over dp ranks and micro-batches (bitwise)",
                  ref.token_mean_loss, "reduce_loss(losses, masks) -> float", _edges))
register(Property("step.grad_norm.global", _cases, grad_norm_counts_once,
                  "the norm from local shards counts every parameter of every stage once (bitwise)",
                  ref.sharded_grad_norm, "grad_norm(shards, placements, layout) -> float", _edges))
register(Property("step.grads.dp_scale", _cases, loss_scale_is_dp,
                  "the loss factor under a dp-averaging reducer is dp: the global token-mean gradient (bitwise)",
                  None, "loss_scale(layout) -> float", _edges))
register(Property("step.grads.norm_weight_tp", _cases, norm_weight_summed,
                  "a tp-replicated norm weight's gradient sums the tp ranks' partials (bitwise)",
                  None, "norm_weight_grad(partials, layout) -> array", _edges))
register(Property("step.clip.scale", _cases, clip_scale_is_torch,
                  "the clipping factor is min(1, max_norm / (norm + 1e-6)) (2 roundings)",
                  ref.clip_scale, "clip_scale(norm, max_norm) -> float", _edges))
register(Property("step.tokens.total", _cases, tokens_add_up,
                  "the step's tokens are the kept tokens of every dp rank and micro-batch (exact)",
                  ref.token_count, "token_count(masks) -> int", _edges))
