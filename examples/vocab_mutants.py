"""Known-wrong vocab-parallel layers: each must fail its contract with a shrunk counterexample.

* :class:`EmbeddingNoAllReduce`: the masked lookup is returned without the all-reduce, so rank r
  holds only the rows of its own block (zeros for the other ids).
* :class:`EmbeddingNoMask`: out-of-block ids are clamped into the block and NOT zeroed, so the
  all-reduce adds tp - 1 wrong rows to the right one.
* :class:`LMHeadNoInputAllReduce`: an lm head and loss whose head skips Megatron's f: the hidden
  states' gradient is never all-reduced, so each rank keeps its own vocab rows' share.
* :func:`cross_entropy_local_max`: every rank shifts its logits by its own max (no all-reduce of the
  max): the sum of exponentials then adds terms shifted by different amounts.
* :func:`cross_entropy_local_softmax`: the sum of exponentials is not all-reduced: each rank takes
  the softmax over its own columns.

    distcheck certify examples.vocab_mutants:EmbeddingNoMask --contract vocab-parallel-embedding
    distcheck certify examples.vocab_mutants:cross_entropy_local_max --contract vocab-parallel-cross-entropy
"""

from __future__ import annotations

from torch import nn

from examples.my_vocab_layers import (
    ParallelLMHeadLoss,
    VocabParallelEmbedding,
    _CrossEntropy,
    vocab_parallel_cross_entropy,
)


class EmbeddingNoAllReduce(VocabParallelEmbedding):
    """Broken: the partial lookup is never all-reduced."""

    def forward(self, ids):
        return self.lookup(ids)  # BUG: no all-reduce


class EmbeddingNoMask(VocabParallelEmbedding):
    """Broken: ids outside this rank's block are clamped into it and not zeroed before the all-reduce."""

    def lookup(self, ids):
        local = (ids - self.lo).clamp(0, self.hi - self.lo - 1)  # BUG: no mask
        return nn.functional.embedding(local, self.weight)


class LMHeadNoInputAllReduce(ParallelLMHeadLoss):
    """Broken: the head uses the replicated input without Megatron's f, so the input gradient is never
    all-reduced: each rank keeps the part its own vocab rows contribute."""

    def forward(self, x, target):
        logits = nn.functional.linear(x, self.head.weight)  # BUG: no all-reduce of the input gradient
        return vocab_parallel_cross_entropy(logits, target)


def cross_entropy_local_max(logits_shard, target):
    """Broken: the max is not all-reduced (each rank shifts by its own)."""
    return _CrossEntropy.apply(logits_shard, target, True, False)


def cross_entropy_local_softmax(logits_shard, target):
    """Broken: the sum of exponentials is not all-reduced (a softmax over the local shard)."""
    return _CrossEntropy.apply(logits_shard, target, False, True)


__all__ = ["EmbeddingNoAllReduce", "EmbeddingNoMask", "LMHeadNoInputAllReduce", "cross_entropy_local_max",
           "cross_entropy_local_softmax"]
