"""ZeRO properties: model-state bytes per GPU against ZeRO's Figure 1, monotonicity,
the DDP baseline at N = 1, and communication per rank (section 7). All exact (ints).

Implementation slots: ``model_state_bytes_per_gpu(params, dp, stage, k=12) -> int``
(:func:`distcheck.parallel.zero.model_state_bytes_per_gpu`) and
``comm_elements_per_rank(params, dp, stage) -> int`` (:func:`distcheck.parallel.zero.comm_elements_per_rank`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from distcheck.core.errors import PropertyFailure
from distcheck.engine.catalogue import form_value as _form
from distcheck.engine.registry import Property, register
from distcheck.engine.runner import call_impl
from distcheck.parallel.zero import strategies as ds
from distcheck.parallel.zero.strategies import ZeroCase

__all__ = ["bytes_match_figure1", "bytes_monotone", "bytes_padded", "comm_matches_section7"]


def _bytes(*args: Any, **kwargs: Any) -> int:
    from distcheck.parallel.zero.reference import model_state_bytes_per_gpu

    return model_state_bytes_per_gpu(*args, **kwargs)


def _comm(*args: Any, **kwargs: Any) -> int | Fraction:
    from distcheck.parallel.zero.reference import comm_elements_per_rank

    return comm_elements_per_rank(*args, **kwargs)


def _divisible(case: ZeroCase) -> ZeroCase:
    """Psi a multiple of N_d (no padding), so Figure 1 holds exactly."""
    return ds.ZeroCase(params=case.params * case.dp, dp=case.dp, k=case.k)


def bytes_match_figure1(case: ZeroCase, *, impl: Callable[..., int] = _bytes) -> None:
    """For dp | params: bytes per GPU of every stage == zero.bytes_per_gpu.stage<s>."""
    c = _divisible(case)
    for stage in range(4):
        got = call_impl("model_state_bytes_per_gpu", impl, c.params, c.dp, stage, c.k)
        expected = _form(f"zero.bytes_per_gpu.stage{stage}", params=c.params, dp=c.dp, k=c.k)
        if Fraction(got) != expected:
            raise PropertyFailure(f"stage {stage} bytes per GPU for {c}", expected=expected, got=got)


#: the state each stage shards on top of the one before (ZeRO paper, Figure 1): optimizer state, gradients,
#: parameters
_SHARDS_MORE = {1: "the optimizer state", 2: "the gradients", 3: "the parameters"}


def bytes_monotone(case: ZeroCase, *, impl: Callable[..., int] = _bytes) -> None:
    """Any params (padding allowed): non-increasing in stage and in dp; all stages equal the
    DDP baseline (2 + 2 + K) Psi at dp = 1. Strictly decreasing where a stage shards one more
    state and the sharding can show: dp >= 2 and params >= 2 (so a rank's chunk ceil(Psi / N_d)
    is smaller than Psi), for stage 1 only when K > 0 (it shards the K Psi optimizer bytes);
    a stage that holds as much as the one before has not sharded its state (ZeRO Figure 1)."""
    per_stage = [call_impl("model_state_bytes_per_gpu", impl, case.params, case.dp, s, case.k) for s in range(4)]
    for s in range(3):
        if per_stage[s + 1] > per_stage[s]:
            raise PropertyFailure(f"stage {s + 1} holds more than stage {s} for {case}", expected=f"<= {per_stage[s]}",
                                  got=per_stage[s + 1])
        strict = case.dp >= 2 and case.params >= 2 and (s + 1 > 1 or case.k > 0)
        if strict and per_stage[s + 1] == per_stage[s]:
            raise PropertyFailure(f"stage {s + 1} holds as much as stage {s} for {case}: "
                                  f"{_SHARDS_MORE[s + 1]} not sharded", expected=f"< {per_stage[s]}",
                                  got=per_stage[s + 1])
    for s in range(4):
        more = call_impl("model_state_bytes_per_gpu", impl, case.params, case.dp + 1, s, case.k)
        if more > per_stage[s]:
            raise PropertyFailure(f"stage {s}: dp={case.dp + 1} holds more than dp={case.dp} for {case}",
                                  expected=f"<= {per_stage[s]}", got=more)
        at_one = call_impl("model_state_bytes_per_gpu", impl, case.params, 1, s, case.k)
        baseline = _form("zero.bytes_per_gpu.stage0", params=case.params, dp=1, k=case.k)
        if Fraction(at_one) != baseline:
            raise PropertyFailure(f"stage {s} at dp=1 must equal the DDP baseline for {case}", expected=baseline,
                                  got=at_one)


def bytes_padded(case: ZeroCase, *, impl: Callable[..., int] = _bytes) -> None:
    """Any params (dp need not divide them): for every stage,
    ``stage<s>(params) <= bytes <= stage<s>(dp * ceil(params / dp))`` (Figure 1 forms): each
    rank holds at least its exact share Psi / N_d of every partitioned state, and at most
    the padded chunk ceil(Psi / N_d). Exact (Fractions)."""
    padded = -(-case.params // case.dp) * case.dp
    for stage in range(4):
        got = Fraction(call_impl("model_state_bytes_per_gpu", impl, case.params, case.dp, stage, case.k))
        low = _form(f"zero.bytes_per_gpu.stage{stage}", params=case.params, dp=case.dp, k=case.k)
        high = _form(f"zero.bytes_per_gpu.stage{stage}", params=padded, dp=case.dp, k=case.k)
        if not low <= got <= high:
            raise PropertyFailure(f"stage {stage} bytes per GPU for {case} outside [exact share, padded chunk]",
                                  expected=f"[{low}, {high}]", got=got)


def comm_matches_section7(case: ZeroCase, *, impl: Callable[..., int | Fraction] = _comm) -> None:
    """Elements sent per rank == zero.comm_elements_per_rank.{ddp,stage1,stage2,stage3}; stage 3 == 1.5 x DDP."""
    names = {0: "ddp", 1: "stage1", 2: "stage2", 3: "stage3"}
    got = {s: Fraction(call_impl("comm_elements_per_rank", impl, case.params, case.dp, s)) for s in range(4)}
    for s, name in names.items():
        expected = _form(f"zero.comm_elements_per_rank.{name}", params=case.params)
        if got[s] != expected:
            raise PropertyFailure(f"comm elements per rank, {name}, for {case}", expected=expected, got=got[s])
    if got[3] != Fraction(3, 2) * got[0]:
        raise PropertyFailure(f"ZeRO-3 must move 1.5x DDP for {case}", expected=Fraction(3, 2) * got[0], got=got[3])


def _edges() -> tuple[ZeroCase, ...]:
    """dp = 1 (the DDP baseline); more ranks than parameters (params = 1, dp = 2); dp not
    dividing params (10 over 4, K = 12); the ZeRO paper's 7.5B parameters over 64 ranks."""
    Z = ds.ZeroCase
    return (Z(params=8, dp=1, k=12), Z(params=1, dp=2, k=12), Z(params=10, dp=4, k=12),
            Z(params=7_500_000_000, dp=64, k=12))


_small = lambda: ds.zero_cases(max_params=10**9, max_dp=512, ks=(12, 14, 8, 0))  # noqa: E731

register(Property("zero.bytes.figure1", _small, bytes_match_figure1,
                  "bytes per GPU of stages 0..3 == ZeRO Figure 1 closed forms (dp | params), exactly",
                  _bytes, "model_state_bytes_per_gpu(params, dp, stage, k=12) -> int", _edges))
register(Property("zero.bytes.padded", _small, bytes_padded,
                  "any params: Figure 1 bytes of params <= bytes per GPU <= Figure 1 bytes of the padded params",
                  _bytes, "model_state_bytes_per_gpu(params, dp, stage, k=12) -> int", _edges))
register(Property("zero.bytes.monotone", _small, bytes_monotone,
                  "bytes per GPU non-increasing in stage and in dp, strictly where a stage shards one more state "
                  "(dp >= 2, params >= 2); == DDP baseline at dp = 1",
                  _bytes, "model_state_bytes_per_gpu(params, dp, stage, k=12) -> int", _edges))
register(Property("zero.comm.section7", lambda: ds.zero_cases(max_params=10**9), comm_matches_section7,
                  "comm elements per rank == closed forms; ZeRO-3 moves 1.5x DDP",
                  _comm, "comm_elements_per_rank(params, dp, stage) -> int", _edges))
