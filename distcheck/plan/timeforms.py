"""Exact evaluators (Fractions, no sympy) of the closed forms a step-time plan evaluates: FLOPs per token,
recomputation, compute time, MFU, HFU and tokens per second (``flops.*``, :mod:`distcheck.parallel.flops`),
and the times of ring collectives and sends (``comm.time_s.*``, :mod:`distcheck.parallel.comm`).

Each evaluator takes the form's inputs, defaults included, and is the form's own expression in
Fractions; :data:`distcheck.plan.estimate.EXACT_FORMS` holds them with the memory plan's, and
``tests/plan/test_plan_forms_exact.py`` holds each equal to the catalogue's form on drawn inputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from fractions import Fraction

from distcheck.core.vocab import Collective
from distcheck.parallel.comm.ideal import NCCL_LATENCY_S

__all__ = ["TIME_FORMS"]

Q = Fraction
_LAT = NCCL_LATENCY_S


def _ring(collective: str, size_bytes: int | Q, n: int, busbw: int | Q, nodes: int = 1,
          latency_base: int | Q = _LAT["base"], latency_intra: int | Q = _LAT["intra"],
          latency_inter: int | Q = _LAT["inter"]) -> Q:  # comm.time_s.ring.<collective>
    k = 2 if collective == Collective.ALL_REDUCE else 1
    steps, across = k * (n - 1), k * (nodes - 1)
    return (Q(latency_base) + (steps - across) * Q(latency_intra) + across * Q(latency_inter)
            + Q(k * (n - 1), n) * Q(size_bytes) / Q(busbw))


def _send(size_bytes: int | Q, bandwidth: int | Q, latency_base: int | Q = _LAT["base"],
          latency_link: int | Q = _LAT["intra"]) -> Q:  # comm.time_s.send_recv
    return Q(latency_base) + Q(latency_link) + Q(size_bytes) / Q(bandwidth)


def _model(params: int, num_layers: int, seq_len: int, attention_width: int | Q) -> Q:  # flops.model_per_token
    return Q(6 * params) + 12 * num_layers * seq_len * Q(attention_width)


def _selective(num_layers: int, seq_len: int, attention_width: int | Q) -> Q:  # flops.recompute_per_token.selective
    return 4 * num_layers * seq_len * Q(attention_width)


def _full(layer_params: int, num_layers: int, seq_len: int, attention_width: int | Q) -> Q:
    return Q(2 * layer_params) + 4 * num_layers * seq_len * Q(attention_width)  # flops.recompute_per_token.full


def _utilization(flops_per_token: int | Q, tokens_per_second: int | Q, gpus: int, peak_flops: int | Q) -> Q:
    return Q(flops_per_token) * Q(tokens_per_second) / (gpus * Q(peak_flops))  # flops.mfu


TIME_FORMS: dict[str, Callable[..., int | Fraction]] = {
    **{f"comm.time_s.ring.{c.value}": functools.partial(_ring, c.value)
       for c in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)},
    "comm.time_s.send_recv": _send,
    "flops.model_per_token": _model,
    "flops.recompute_per_token.selective": _selective,
    "flops.recompute_per_token.full": _full,
    "flops.hardware_per_token.selective": lambda params, num_layers, seq_len, attention_width: (
        _model(params, num_layers, seq_len, attention_width) + _selective(num_layers, seq_len, attention_width)),
    "flops.hardware_per_token.full": lambda params, layer_params, num_layers, seq_len, attention_width: (
        _model(params, num_layers, seq_len, attention_width)
        + _full(layer_params, num_layers, seq_len, attention_width)),
    "flops.compute_time_s": lambda flops, peak_flops, efficiency: Q(flops) / (Q(peak_flops) * Q(efficiency)),
    "flops.mfu": _utilization,
    "flops.hfu": lambda hardware_flops_per_token, tokens_per_second, gpus, peak_flops: _utilization(
        hardware_flops_per_token, tokens_per_second, gpus, peak_flops),
    "flops.tokens_per_second": lambda tokens_per_step, step_time_s: Q(tokens_per_step) / Q(step_time_s),
}
