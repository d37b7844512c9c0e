"""Context parallelism: attention with the sequence split over cp ranks.

- ``reference`` (numpy, float64): head-tail (zig-zag) load balancing into 2 cp chunks, the causal work
  of each rank, full attention (tensor parallelism's single-device reference) and its backward, the
  online-softmax partials and their merge; ``variants``: ring attention, the all-gather of K and V,
  and Ulysses' all-to-alls, forward and backward, with the communication they log;
- ``forms``: bytes per rank per layer of each variant, forward and backward; the K/V (or head-shard)
  buffers a rank holds; the causal work per rank with and without load balancing, and its imbalance;
  Ulysses' constraint (cp divides the heads and the kv heads);
- ``proofs``: the ring sends what the all-gather sends in the forward; balanced work is the mean;
- ``strategies``, ``properties``, ``mutants``: each variant equals full attention, forward and
  backward, within a derived bound, and logs the closed forms' bytes; the merge is commutative bit
  for bit, exact on equal maxima, bounded otherwise; balanced causal work is equal on every rank;
- ``contracts``: ``context-parallel-attention``, a user's attention on sequence-sharded q, k, v
  certified on a real world; ``checks``: its rows of ``distcheck check``.

Sources: "The Llama 3 Herd of Models" (arXiv:2407.21783), §3.3.2 (all-gather of K and V, 2 cp
chunks); Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context"
(arXiv:2310.01889); Jacobs et al. 2023, "DeepSpeed Ulysses" (arXiv:2309.14509); Milakov and
Gimelshein 2018, "Online normalizer calculation for softmax" (arXiv:1805.02867); Dao 2023,
"FlashAttention-2" (arXiv:2307.08691), Algorithms 1 and 2.

Public API: this package, ``distcheck.parallel.cp``: the names of ``__all__``, served on first access
from its internal modules (``reference``, ``variants``; numpy only, never torch); importing it imports
nothing more. Its closed forms are served by :mod:`distcheck.closed_form`, its strategies by
:mod:`distcheck.strategies`, its properties by :mod:`distcheck.props` and its mutants by
:mod:`distcheck.mutants`.
"""

from distcheck.core.face import face

__all__ = [
    "Partial", "load_balanced_positions", "contiguous_positions", "shard", "causal_work", "blockwise_scores",
    "full_attention",
    "full_attention_backward", "block_partial", "scores_partial", "merge_partials", "finalize",
    "empty_partial", "check_qkv", "RING_PASS", "VARIANTS", "check_ulysses", "check_shards", "ring_attention",
    "ring_attention_backward", "all_gather_attention", "all_gather_attention_backward", "ulysses_attention",
    "ulysses_attention_backward", "ring_step", "all_gather_step", "ulysses_step", "sent_bytes",
    "to_head_shards",
]

__getattr__, __dir__ = face(__name__, __all__, sources=("reference", "variants"))
