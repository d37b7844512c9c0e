"""Closed forms of context parallelism (sympy only), per rank and per attention layer.

Inputs: the sequence length s (tokens, the whole sequence), the micro-batch size b, num_heads (H),
num_kv_heads (Hkv), head_dim (e), bytes_per_element (B) and cp. One K (or V) tensor of the whole
sequence is ``s b Hkv e B`` bytes; a rank holds 1/cp of the sequence.

* Bytes each rank sends (nccl-tests doc/PERFORMANCE.md's conventions: an all-gather or reduce-scatter
  of a full tensor S sends (cp-1)/cp S per rank, an all-to-all of a per-rank buffer S sends (cp-1)/cp S):
  - ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context", §3):
    forward, cp - 1 passes of a K and a V block of s/cp tokens; backward, the cp - 1 passes again and
    cp passes of their gradients' accumulators, the last bringing them home (cp >= 2; cp = 1 sends
    nothing);
  - all-gather ("The Llama 3 Herd of Models", §3.3.2): forward, all-gathers of K and V; backward,
    reduce-scatters of dK and dV;
  - Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses", §3.1): forward, all-to-alls of q, k, v and the
    output; backward, of the output gradient and of dq, dk, dv.
* Memory per rank: the attention's stored q, k, v and output shards (Llama 3, §3.3.2: context
  parallelism splits the activations over cp); and the buffers each variant adds: the ring's current
  and incoming K/V blocks (double-buffered, so the pass overlaps the block's attention: Liu et al. §3),
  the all-gathered K and V, Ulysses' head shards of q, k, v and the output on the whole sequence.
* Causal work per rank: the (query, key) pairs its causal attention computes; contiguous shards give
  rank r ``r L^2 + L (L + 1) / 2`` with L = s / cp, the head-tail split ``s (s + 1) / (2 cp)`` on every
  rank, the mean (Llama 3, §3.3.2); the imbalance ratio is the busiest rank's work over the mean.
* Scores computed per rank, blockwise: cut the sequence into 2 cp chunks of c = s / (2 cp) and skip every
  block of c x c scores whose keys all come after its queries (Liu et al. 2023, §3: blockwise attention).
  Under the head-tail split rank r's query chunks r and 2 cp - 1 - r see r + 1 and 2 cp - r key chunks:
  ``(2 cp + 1) c^2`` scores on every rank (Llama 3, §3.3.2); contiguous shards give rank r ``(4 r + 3) c^2``.
* Ulysses' constraint: each rank takes whole heads, num_heads / cp and num_kv_heads / cp.
"""

from __future__ import annotations

import sympy as sp

from distcheck.core.closed_form import ClosedForm, Input, register

__all__ = ["FORMS"]

_s = Input("s", "sequence length (the whole sequence)", "tokens")
_b = Input("b", "micro-batch size", "sequences")
_H = Input("num_heads", "query heads", "heads")
_Hkv = Input("num_kv_heads", "key/value heads (grouped-query attention)", "heads")
_e = Input("head_dim", "head dimension", "elements")
_B = Input("bytes_per_element", "bytes of one element", "bytes")
_cp = Input("cp", "context-parallel size (ranks the sequence is split over)", "GPUs")
_r = Input("rank", "rank in the context-parallel group, 0 .. cp-1", "rank", kind="nonnegative_integer")
s, b, H, Hkv, e, B, cp, r = (i.symbol for i in (_s, _b, _H, _Hkv, _e, _B, _cp, _r))
_SHAPE = (_s, _b, _H, _Hkv, _e, _B, _cp)
_KV = (_s, _b, _Hkv, _e, _B, _cp)

_RING = "Liu et al. 2023, Ring Attention with Blockwise Transformers (arXiv:2310.01889) §3"
_LLAMA = "The Llama 3 Herd of Models (arXiv:2407.21783) §3.3.2"
_ULYSSES = "Jacobs et al. 2023, DeepSpeed Ulysses (arXiv:2309.14509) §3.1"
_NCCL = "nccl-tests doc/PERFORMANCE.md"
kv = s * b * Hkv * e * B  # one K or V tensor of the whole sequence
qo = s * b * H * e * B    # one q or output tensor of the whole sequence
L = s / cp


def _form(name: str, expr: sp.Expr, inputs: tuple[Input, ...], unit: str, source: str, description: str,
          constraints: tuple[str, ...] = ()) -> ClosedForm:
    return register(ClosedForm(name=name, expr=expr, inputs=inputs, unit=unit, source=source,
                               description=description, constraints=constraints))


FORMS = (
    _form("cp.ring.bytes_per_rank.forward", 2 * (cp - 1) * kv / cp, _KV, "bytes", _RING,
          "bytes a rank sends in the forward: cp - 1 passes of its K and V blocks (s/cp tokens each)",
          ("cp divides s",)),
    _form("cp.ring.bytes_per_rank.backward", 2 * (2 * cp - 1) * kv / cp, _KV, "bytes", _RING,
          "bytes a rank sends in the backward: cp - 1 passes of the K and V blocks and cp of dK and dV, the last "
          "bringing them to their owner", ("cp divides s", "cp >= 2 (one rank sends nothing)")),
    _form("cp.all_gather.bytes_per_rank.forward", 2 * (cp - 1) / cp * kv, _KV, "bytes", f"{_LLAMA}; {_NCCL}",
          "bytes a rank sends in the forward: ring all-gathers of K and of V (S = s b Hkv e B each)",
          ("cp divides s",)),
    _form("cp.all_gather.bytes_per_rank.backward", 2 * (cp - 1) / cp * kv, _KV, "bytes", f"{_LLAMA}; {_NCCL}",
          "bytes a rank sends in the backward: ring reduce-scatters of dK and dV", ("cp divides s",)),
    _form("cp.ulysses.bytes_per_rank.forward", (cp - 1) / cp * (2 * qo + 2 * kv) / cp, _SHAPE, "bytes",
          f"{_ULYSSES}; {_NCCL}",
          "bytes a rank sends in the forward: all-to-alls of its q, k, v shards (sequence to heads) and of the "
          "output (heads to sequence), (cp-1)/cp of each rank's buffer", ("cp divides s, num_heads, num_kv_heads",)),
    _form("cp.ulysses.bytes_per_rank.backward", (cp - 1) / cp * (2 * qo + 2 * kv) / cp, _SHAPE, "bytes",
          f"{_ULYSSES}; {_NCCL}",
          "bytes a rank sends in the backward: all-to-alls of the output gradient and of dq, dk, dv",
          ("cp divides s, num_heads, num_kv_heads",)),
    _form("cp.activations.attention_bytes_per_rank", (2 * qo + 2 * kv) / cp, _SHAPE, "bytes", _LLAMA,
          "the q, k, v and output shards a rank stores for the backward: 1/cp of the whole sequence's",
          ("cp divides s",)),
    _form("cp.ring.buffer_bytes_per_rank", 2 * 2 * kv / cp, _KV, "bytes", _RING,
          "K and V blocks a ring rank holds at once: its current pair and the pair arriving (double-buffered)",
          ("cp divides s",)),
    _form("cp.all_gather.buffer_bytes_per_rank", 2 * kv, (_s, _b, _Hkv, _e, _B), "bytes", _LLAMA,
          "the all-gathered K and V of the whole sequence a rank holds"),
    _form("cp.ulysses.buffer_bytes_per_rank", (2 * qo + 2 * kv) / cp, _SHAPE, "bytes", _ULYSSES,
          "Ulysses' head shards on the whole sequence: q, k, v and the output of H/cp and Hkv/cp heads",
          ("cp divides num_heads, num_kv_heads",)),
    _form("cp.causal_work.contiguous", r * L**2 + L * (L + 1) / 2, (_s, _cp, _r), "count", _LLAMA,
          "(query, key) pairs of rank r's causal attention when it holds positions [r s/cp, (r+1) s/cp)",
          ("cp divides s", "rank < cp")),
    _form("cp.causal_work.contiguous.max", (cp - 1) * L**2 + L * (L + 1) / 2, (_s, _cp), "count", _LLAMA,
          "the busiest rank's pairs under contiguous shards (the last rank)", ("cp divides s",)),
    _form("cp.causal_work.balanced", s * (s + 1) / (2 * cp), (_s, _cp), "count", _LLAMA,
          "pairs of every rank under the head-tail split into 2 cp chunks (chunks r and 2cp-1-r): the mean",
          ("2 cp divides s",)),
    _form("cp.causal_work.imbalance.contiguous", ((cp - 1) * L**2 + L * (L + 1) / 2) / (s * (s + 1) / (2 * cp)),
          (_s, _cp), "ratio", _LLAMA, "the busiest rank's causal work over the mean, contiguous shards "
          "(-> (2 cp - 1) / cp for long sequences)", ("cp divides s",)),
    _form("cp.causal_work.imbalance.balanced", sp.Integer(1), (), "ratio", _LLAMA,
          "the busiest rank's causal work over the mean under the head-tail split"),
    _form("cp.scores_per_rank.balanced", (2 * cp + 1) * (s / (2 * cp))**2, (_s, _cp), "count", f"{_LLAMA}; {_RING}",
          "scores (query, key pairs) a rank computes in one pass under the head-tail split, blocks of (s / 2 cp)^2 "
          "scores whose keys all follow their queries skipped: 2 cp + 1 blocks on every rank", ("2 cp divides s",)),
    _form("cp.scores_per_rank.contiguous", (4 * r + 3) * (s / (2 * cp))**2, (_s, _cp, _r), "count",
          f"{_LLAMA}; {_RING}", "scores rank r computes in one pass under contiguous shards, in blocks of "
          "(s / 2 cp)^2 with the fully masked ones skipped: 4 r + 3 blocks", ("2 cp divides s", "rank < cp")),
    _form("cp.ulysses.heads_per_rank", H / cp, (_H, _cp), "heads", _ULYSSES,
          "query heads per rank after the all-to-all", ("cp divides num_heads",)),
    _form("cp.ulysses.kv_heads_per_rank", Hkv / cp, (_Hkv, _cp), "heads", _ULYSSES,
          "key/value heads per rank after the all-to-all (no replication of kv heads)", ("cp divides num_kv_heads",)),
)
