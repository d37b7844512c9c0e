"""Closed forms of a training step under composed parallelism (sympy only).

* ``step.loss.token_weight`` = 1/T: the weight of one non-ignored token's loss in the global step loss,
  T the global count (``F.cross_entropy``'s ``reduction="mean"`` with ``ignore_index`` over the whole
  batch; the gradient-accumulation fix of transformers, ``num_items_in_batch``, Hugging Face blog
  "Fixing Gradient Accumulation", October 2024).
* ``step.loss.mean_of_means_weight`` = 1/(dp m n_k): its weight under the mean of per-micro-batch means
  (m micro-batches per dp rank, n_k tokens in its micro-batch): the bug.
* ``step.grad_norm.copies`` = dp_replicate tp^(1 - tp_sharded): the ranks holding each element of a
  parameter, which a norm from local shards must divide its squares by (replicated parameters counted
  once; torch's DTensor keeps ``Replicate`` dimensions out of the norm's reduction).
* ``step.clip.scale`` = min(1, max_norm / (norm + eps)), eps = 1e-6: ``torch.nn.utils.clip_grad_norm_``
  (``torch/nn/utils/clip_grad.py``, ``_clip_grads_with_norm_``).
* ``step.comm_bytes_per_rank.dp`` = m (3 (n-1)/n P b + 2 (r-1)/r P b / n): FSDP2 over n = dp_shard ranks
  (ZeRO-3: two all-gathers and a reduce-scatter of the P parameters of b bytes, Rajbhandari et al. 2020,
  "ZeRO", §7) and HSDP's all-reduce of the shard over r = dp_replicate, per micro-batch, on rings
  (nccl-tests ``doc/PERFORMANCE.md``). Proof ``proof.step.dp_bytes`` shows it is ZeRO-3's
  ``zero.comm_bytes_per_rank.stage3`` plus ``comm.bytes_per_rank.all_reduce`` of the shard.
* ``step.comm_bytes_per_rank.tp`` = m L 8 (t-1)/t S: L layers of two sequence-parallel blocks, each an
  all-gather and a reduce-scatter of S bytes in the forward and again in the backward (Korthikanti et
  al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.2.2); proof
  ``proof.step.tp_bytes``: 4 m L times ``sp.block.bytes_per_rank`` (two blocks, forward and backward).
"""

from __future__ import annotations

from fractions import Fraction

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["TOKEN_WEIGHT", "MEAN_OF_MEANS_WEIGHT", "COPIES", "CLIP_SCALE", "DP_BYTES", "TP_BYTES", "CLIP_EPS"]

#: torch's epsilon in clip_grad_norm_, as an exact rational
CLIP_EPS = Fraction(1, 10**6)

_T = Input("tokens", "global non-ignored tokens T of the step", "count")
_dp = Input("dp", "data-parallel ranks (dp_replicate x dp_shard)", "count")
_m = Input("m", "micro-batches per dp rank (gradient-accumulation steps)", "count")
_nk = Input("n_k", "non-ignored tokens of the token's micro-batch", "count")
_r = Input("dp_replicate", "replicas (HSDP's replicate axis)", "count")
_t = Input("tp", "tensor-parallel ranks", "count")
_sh = Input("tp_sharded", "1 when tensor parallelism shards the parameter, 0 when it replicates it", "flag",
            kind="flag")
_norm = Input("norm", "the gradient's global 2-norm", "", kind="nonnegative")
_max = Input("max_norm", "the clipping threshold", "", kind="positive")
_eps = Input("eps", "added to the norm before dividing", "", kind="positive", default=CLIP_EPS)
_P = Input("params", "parameters of the rank's model-parallel share P (after tp and pp)", "params")
_n = Input("dp_shard", "ranks FSDP2 shards over", "GPUs")
_b = Input("bytes_per_element", "bytes of one communicated element", "bytes", default=2)
_L = Input("layers", "transformer layers on the rank", "count")
_S = Input("size_bytes", "bytes of one block's activation b s h (the full tensor)", "bytes",
           kind="nonnegative_integer")

_STEP = "the global token-mean step loss"

TOKEN_WEIGHT = register(ClosedForm(
    name="step.loss.token_weight", expr=1 / _T.symbol, inputs=(_T,), unit="fraction",
    source="torch.nn.functional.cross_entropy (reduction='mean', ignore_index) over the global batch; Hugging "
           "Face blog 'Fixing Gradient Accumulation' (2024), num_items_in_batch",
    description=f"weight of one non-ignored token's loss in {_STEP}: 1/T"))

MEAN_OF_MEANS_WEIGHT = register(ClosedForm(
    name="step.loss.mean_of_means_weight", expr=1 / (_dp.symbol * _m.symbol * _nk.symbol),
    inputs=(_dp, _m, _nk), unit="fraction",
    source="Hugging Face blog 'Fixing Gradient Accumulation' (2024): the per-micro-batch mean loss averaged over "
           "accumulation steps and ranks",
    description="weight of a token under the mean of per-micro-batch means: 1/(dp m n_k); equals 1/T only when "
                "every micro-batch holds T/(dp m) tokens"))

COPIES = register(ClosedForm(
    name="step.grad_norm.copies", expr=_r.symbol * _t.symbol ** (1 - _sh.symbol), inputs=(_r, _t, _sh),
    unit="count",
    source="torch.distributed.tensor (DTensor): a norm over Replicate dimensions is not reduced; torchtitan "
           "dist_utils.clip_grad_norm_; pytorch/torchtitan#596, meta-pytorch/torchtune#2420",
    description="ranks holding each element of a parameter (dp_replicate, times tp when tp replicates it): the "
                "divisor of its local squares in a norm from shards"))

CLIP_SCALE = register(ClosedForm(
    name="step.clip.scale", expr=sp.Min(1, _max.symbol / (_norm.symbol + _eps.symbol)), inputs=(_norm, _max, _eps),
    unit="fraction",
    source="torch.nn.utils.clip_grad_norm_ (torch/nn/utils/clip_grad.py, _clip_grads_with_norm_: clip_coef = "
           "max_norm / (total_norm + 1e-6), clamped to 1)",
    description="the factor every gradient is multiplied by: min(1, max_norm / (norm + eps))"))

_ring = lambda n: (n.symbol - 1) / n.symbol  # noqa: E731

DP_BYTES = register(ClosedForm(
    name="step.comm_bytes_per_rank.dp",
    expr=_m.symbol * (3 * _ring(_n) * _P.symbol * _b.symbol + 2 * _ring(_r) * _P.symbol * _b.symbol / _n.symbol),
    inputs=(_P, _n, _r, _m, _b), unit="bytes",
    source="ZeRO paper (Rajbhandari et al. 2020) section 7 (ZeRO-3: 3 collectives of Psi), FSDP2 fully_shard with "
           "reshard_after_forward=True and HSDP; ring factors of nccl-tests doc/PERFORMANCE.md",
    description="bytes each rank sends per step for data parallelism: per micro-batch two all-gathers and a "
                "reduce-scatter over dp_shard, and an all-reduce of the gradient shard over dp_replicate"))

TP_BYTES = register(ClosedForm(
    name="step.comm_bytes_per_rank.tp",
    expr=_m.symbol * _L.symbol * 8 * _ring(_t) * _S.symbol, inputs=(_m, _L, _t, _S), unit="bytes",
    source="Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models', section "
           "4.2.2 and Figure 5; ring factors of nccl-tests doc/PERFORMANCE.md",
    description="bytes each rank sends per step for sequence-parallel tensor parallelism: per micro-batch and layer "
                "two blocks, each an all-gather and a reduce-scatter of S in the forward and in the backward"))
