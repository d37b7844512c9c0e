"""numpy references of a whole training step under composed parallelism (float64, no torch, no sympy).

The layout is torchtitan's device mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` (``StepLayout``; torchtitan's
``ParallelDims``): ``dp_replicate`` replicas (HSDP's replicate axis, DDP), each fully sharded over
``dp_shard`` ranks (FSDP2's ``fully_shard``: dim-0 shards, ``torch.chunk``), ``tp`` tensor-parallel ranks
(Megatron-style column/row shards, replicated norms), ``pp`` pipeline stages, ``cp`` context-parallel ranks
(each the head-tail chunks of every sequence), and ``ep`` expert-parallel ranks borrowed from the ``dp x cp``
ones (``ep_placement``: torchtitan's or Megatron's; the experts' mesh ``expert_shape``). The data-parallel
degree is ``dp = dp_replicate * dp_shard``; tp and pp ranks see the same data, cp ranks parts of it.

What a step must compute, whatever the layout:

* **the loss** (:func:`token_mean_loss`): the sum of every non-ignored token's loss over the global batch
  (all dp ranks, all micro-batches) divided by the global token count T: each token weighs ``1/T``
  (closed form ``step.loss.token_weight``). The mean of per-micro-batch means weighs a token of a
  micro-batch with ``n_k`` tokens ``1/(dp m n_k)`` (``step.loss.mean_of_means_weight``): equal only when
  every micro-batch of every rank has the same count. This is the gradient-accumulation bug fixed in
  transformers in 2024 (the ``num_items_in_batch`` argument; Hugging Face blog, "Fixing Gradient
  Accumulation", October 2024).
* **the gradient norm** (:func:`global_grad_norm`, :func:`sharded_grad_norm`): the 2-norm of the
  gradient over the unique parameters, ``sqrt(sum_p ||g_p||^2)``; a parameter held by several ranks
  (replicated over dp_replicate, and over tp when the tensor-parallel plan replicates it) counts once.
  From the ranks' local shards: ``||g||^2 = sum_r sum_{p on r} ||g_{p,r}||^2 / c_p`` with ``c_p`` the number
  of ranks holding each element of p (closed form ``step.grad_norm.copies``).
* **clipping** (:func:`clip_scale`): ``torch.nn.utils.clip_grad_norm_``'s coefficient
  ``min(1, max_norm / (norm + 1e-6))`` (torch's ``_clip_grads_with_norm_``: ``clip_coef = max_norm /
  (total_norm + 1e-6)``, clamped to at most 1; closed form ``step.clip.scale``).
* **the bytes communicated** (:func:`step_comm_bytes`): FSDP2's per-micro-batch all-gathers and
  reduce-scatter, HSDP's all-reduce of the shard, the tensor-parallel blocks' all-gathers and
  reduce-scatters, each from the ring collectives of :mod:`distcheck.parallel.comm.reference`.

Exactness: every function here is float64 numpy with a fixed summation order; the tests compare the
closed forms with them on inputs where the arithmetic is exact (integers and dyadic rationals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_choice, check_float, check_positive_int
from distcheck.core.vocab import Axis, Collective, ExpertPlacement, names

__all__ = ["CLIP_EPS", "StepLayout", "Placement", "token_mean_loss", "token_count", "global_grad_norm",
           "copies", "local_shard", "sharded_grad_norm", "clip_scale", "step_comm_bytes"]

#: the epsilon torch.nn.utils.clip_grad_norm_ adds to the norm before dividing (torch/nn/utils/clip_grad.py)
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class StepLayout:
    """A composition: ``dp_replicate``, ``dp_shard``, ``tp``, ``pp`` and ``cp`` degrees (each >= 1), torchtitan's
    mesh axes (mesh order ``pp, dp_replicate, dp_shard, cp, tp``, tp innermost), ``ep`` experts' ranks
    borrowed from the data-parallel ones by ``ep_placement`` (:class:`~distcheck.core.vocab.ExpertPlacement`:
    ``torchtitan``, ep from ``dp_shard x cp``; ``megatron``, ep from ``dp x cp``; ``""`` when ep = 1), and the
    ``precision`` the step is certified in (a name of :data:`distcheck.parallel.step.precision.PRECISIONS`:
    ``float64``, ``float32``, ``bf16-fsdp``, ``bf16-autocast``; a target's ``parallelize`` reads it to choose
    FSDP2's ``MixedPrecisionPolicy``; not part of ``str``, which shows the degrees). ep is no axis of the dense
    mesh: the experts' mesh is :attr:`expert_shape`.

    Raises ConfigError on a degree that is not a positive int, an unknown precision, an ep > 1 without a
    placement (or a placement named with ep = 1), an unknown placement, an ep that the ranks it borrows do not
    hold (torchtitan: a multiple of cp dividing dp_shard cp; Megatron: a divisor of dp cp)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    ep_placement: str = ""
    precision: str = "float64"

    def __post_init__(self) -> None:
        from distcheck.parallel.step.precision import get_precision

        for axis in (Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP, Axis.PP, Axis.CP, Axis.EP):
            check_positive_int(str(axis), getattr(self, axis))
        get_precision(self.precision)
        if self.ep == 1:
            if self.ep_placement:
                raise ConfigError("ep_placement", self.ep_placement, "must be empty when ep = 1 (no experts' ranks to "
                                                                     "place)")
            return
        check_choice("ep_placement", self.ep_placement, names(ExpertPlacement))
        if self.ep_placement == ExpertPlacement.TORCHTITAN:
            host = self.dp_shard * self.cp
            if host % self.ep or self.ep % self.cp:
                raise ConfigError("ep", self.ep, f"must be a multiple of cp = {self.cp} dividing dp_shard*cp = "
                                                 f"{self.dp_shard}*{self.cp} = {host} (torchtitan borrows ep from "
                                                 "dp_shard x cp)")
        elif self.dp_cp % self.ep:
            raise ConfigError("ep", self.ep, f"must divide dp*cp = {self.dp}*{self.cp} = {self.dp_cp} (Megatron "
                                             "borrows ep from the data-parallel ranks)")

    @property
    def dp(self) -> int:
        """The data-parallel degree, ``dp_replicate * dp_shard``."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """The ranks that hold different tokens, ``dp * cp`` (torchtitan's ``dp_cp`` mesh): FSDP2 averages the
        gradients over them, and the loss and tokens are summed over them."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """The experts' data-parallel degree, ``dp * cp / ep``: the ranks holding the same experts."""
        return self.dp_cp // self.ep

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """The mesh shape, ``(pp, dp_replicate, dp_shard, cp, tp)``."""
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    @property
    def expert_shape(self) -> tuple[int, int, int, int, int]:
        """The experts' mesh shape, ``(pp, dp_replicate, efsdp, ep, tp)``, over the same ranks in the same order:
        ``ep`` consecutive data-parallel ranks (cp innermost) share their experts out, ``efsdp`` shards each
        expert. torchtitan: ``(pp, dp_replicate, dp_shard cp / ep, ep, tp)`` (the experts HSDP over dp_replicate);
        Megatron: ``(pp, 1, dp cp / ep, ep, tp)`` (the experts' data parallelism across the replicas too)."""
        if self.ep_placement == ExpertPlacement.MEGATRON:
            return (self.pp, 1, self.dp_cp // self.ep, self.ep, self.tp)
        return (self.pp, self.dp_replicate, self.dp_shard * self.cp // self.ep, self.ep, self.tp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank's coordinate on each mesh axis (row-major over :attr:`shape`, tp innermost)."""
        pp, dr, ds, cp, tp = np.unravel_index(rank, self.shape)
        return {Axis.PP: int(pp), Axis.DP_REPLICATE: int(dr), Axis.DP_SHARD: int(ds), Axis.CP: int(cp),
                Axis.TP: int(tp)}

    def dp_index(self, rank: int) -> int:
        """Rank's data-parallel index, ``dp_replicate_coord * dp_shard + dp_shard_coord`` (0..dp-1)."""
        c = self.coordinates(rank)
        return c[Axis.DP_REPLICATE] * self.dp_shard + c[Axis.DP_SHARD]

    def ep_index(self, rank: int) -> int:
        """Rank's coordinate on the experts' ``ep`` axis (0..ep-1): it holds experts ``ep_index E/ep ..``."""
        return int(np.unravel_index(rank, self.expert_shape)[3])

    def __str__(self) -> str:
        text = ", ".join(f"{axis}={getattr(self, axis)}" for axis in (Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP,
                                                                        Axis.PP))
        if self.cp > 1:
            text += f", cp={self.cp}"
        if self.ep > 1:
            text += f", ep={self.ep} ({self.ep_placement})"
        return text


@dataclass(frozen=True)
class Placement:
    """How one parameter is laid out: ``tp_dim`` (the dimension tensor parallelism shards, None when tp
    replicates it, as a norm weight), ``stage`` (its pipeline stage). FSDP2 shards dim 0 over dp_shard
    (after tp, ``torch.chunk``), dp_replicate replicates it."""

    tp_dim: int | None = None
    stage: int = 0


def token_count(masks: Sequence[Sequence[np.ndarray]]) -> int:
    """The number of non-ignored tokens: ``masks[d][k]`` is the boolean mask of dp rank d's micro-batch k."""
    return int(sum(int(np.count_nonzero(m)) for rank in masks for m in rank))


def token_mean_loss(losses: Sequence[Sequence[np.ndarray]], masks: Sequence[Sequence[np.ndarray]]) -> float:
    """The global step loss: ``sum of losses[d][k][i] over masks[d][k][i]`` / the global token count.

    ``losses[d][k]`` (any shape) holds dp rank d's per-token losses of micro-batch k, ``masks[d][k]`` (the
    same shape, bool) which tokens count. Raises ConfigError when no token counts (the mean is undefined)."""
    total = token_count(masks)
    if total == 0:
        raise ConfigError("masks", 0, "must keep at least one token (the token mean of nothing is undefined)")
    s = 0.0
    for rank_l, rank_m in zip(losses, masks, strict=True):
        for lk, mk in zip(rank_l, rank_m, strict=True):
            s += float(np.sum(np.asarray(lk, dtype=np.float64)[np.asarray(mk, dtype=bool)]))
    return s / total


def global_grad_norm(grads: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> float:
    """``sqrt(sum_p sum_i g_{p,i}^2)`` over the unique parameters' full gradients (float64)."""
    values = grads.values() if isinstance(grads, Mapping) else grads
    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(g, dtype=np.float64)))) for g in values)))


def copies(placement: Placement, layout: StepLayout) -> int:
    """How many ranks hold each element of a parameter: dp_replicate, times tp when tp replicates it."""
    return layout.dp_replicate * (layout.tp if placement.tp_dim is None else 1)


def _chunk(a: np.ndarray, n: int, i: int, dim: int) -> np.ndarray:
    """``torch.chunk(a, n, dim)[i]`` (empty when the chunks run out)."""
    size = -(-a.shape[dim] // n) if a.shape[dim] else 0
    lo, hi = min(i * size, a.shape[dim]), min((i + 1) * size, a.shape[dim])
    return np.take(a, np.arange(lo, hi), axis=dim)


def local_shard(full: np.ndarray, placement: Placement, layout: StepLayout, rank: int) -> np.ndarray | None:
    """The part of a parameter (or its gradient) that ``rank`` holds, or None when its pipeline stage
    is another: the tp shard (``torch.chunk`` along ``tp_dim``, DTensor's ``Shard``), then FSDP2's dim-0
    chunk over dp_shard (``torch.chunk``)."""
    c = layout.coordinates(rank)
    if placement.stage != c[Axis.PP]:
        return None
    a = np.asarray(full, dtype=np.float64)
    if placement.tp_dim is not None:
        a = _chunk(a, layout.tp, c[Axis.TP], placement.tp_dim)
    return _chunk(a, layout.dp_shard, c[Axis.DP_SHARD], 0)


def sharded_grad_norm(shards: Sequence[Sequence[np.ndarray | None]], placements: Sequence[Placement],
                      layout: StepLayout) -> float:
    """The global norm from every rank's local shards: ``shards[r][p]`` is rank r's part of parameter p
    (None off its stage); each element counted once (``sum / copies``), summed over the ranks in order."""
    total = 0.0
    for rank_shards in shards:
        for g, pl in zip(rank_shards, placements, strict=True):
            if g is not None:
                total += float(np.sum(np.square(g))) / copies(pl, layout)
    return float(np.sqrt(total))


def clip_scale(norm: float, max_norm: float, eps: float = CLIP_EPS) -> float:
    """``min(1, max_norm / (norm + eps))``: the factor ``torch.nn.utils.clip_grad_norm_`` multiplies every
    gradient by. ``norm`` >= 0, ``max_norm`` > 0 (ConfigError otherwise)."""
    if check_float("norm", norm) < 0:
        raise ConfigError("norm", norm, "must be >= 0 (a norm)")
    check_float("max_norm", max_norm, gt=0.0)
    return min(1.0, max_norm / (norm + eps))


def step_comm_bytes(layout: StepLayout, *, params: int, microbatches: int, bytes_per_element: int,
                    layers: int = 0, activation_bytes: int = 0) -> int | float:
    """Bytes each rank sends in one step, from simulated ring collectives
    (:func:`distcheck.parallel.comm.reference.simulate`).

    ``params``: the parameters of this rank's model-parallel share (after tp and pp), FSDP2-sharded over
    dp_shard; per micro-batch FSDP2 all-gathers them for the forward and again for the backward
    (``reshard_after_forward=True``) and reduce-scatters their gradients (ZeRO-3, Rajbhandari et al.
    2020, §7), and HSDP all-reduces each rank's gradient shard over dp_replicate. ``layers`` sequence-
    parallel blocks' worth of pairs (attention, MLP; Korthikanti et al. 2022, §4.2.2) each all-gather
    and reduce-scatter ``activation_bytes`` (b s h times the element size) over tp in the forward and
    again in the backward. Collectives of one rank are not simulated (0 bytes)."""
    from distcheck.parallel.comm.reference import simulate

    def sent(coll: str, size: int, n: int) -> int:
        return 0 if n == 1 or size == 0 else simulate(coll, size, n, dtype=np.int8).max_sent_bytes

    n, r = layout.dp_shard, layout.dp_replicate
    full = params * bytes_per_element
    ag, rs, ar = Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE
    dp_bytes = 2 * sent(ag, full, n) + sent(rs, full, n) + sent(ar, full // n, r)
    tp_bytes = layers * 2 * 2 * (sent(ag, activation_bytes, layout.tp) + sent(rs, activation_bytes, layout.tp))
    return microbatches * (dp_bytes + tp_bytes)
