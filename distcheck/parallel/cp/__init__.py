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

Public path: :mod:`distcheck.parallel.cp`. Importing it imports nothing: the names of ``__all__`` are
the reference's and the variants' functions, loaded (numpy only, never torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_balanced_positions", "contiguous_positions", "shard", "causal_work", "full_attention",
           "full_attention_backward", "merge_partials", "ring_attention", "ring_attention_backward",
           "all_gather_attention", "all_gather_attention_backward", "ulysses_attention",
           "ulysses_attention_backward", "check_ulysses"]

_HOME = {name: "reference" for name in __all__[:7]} | {name: "variants" for name in __all__[7:]}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
