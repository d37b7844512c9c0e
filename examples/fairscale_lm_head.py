"""fairscale's output layer and loss, as a fairscale user writes them (needs the ``fairscale`` extra):
``ColumnParallelLinear(hidden_size, vocab_size, bias=False, gather_output=False)`` then
``vocab_parallel_cross_entropy`` on the split logits.

    distcheck certify examples.fairscale_lm_head:FairscaleLMHeadLoss --contract vocab-parallel-lm-head-loss
"""

from __future__ import annotations

from fairscale.nn.model_parallel.cross_entropy import vocab_parallel_cross_entropy
from fairscale.nn.model_parallel.layers import ColumnParallelLinear
from torch import nn


class FairscaleLMHeadLoss(nn.Module):
    """fairscale's column-parallel head (logits kept split) and its vocab-parallel cross-entropy."""

    def __init__(self, hidden_size: int, vocab_size: int):
        super().__init__()
        self.head = ColumnParallelLinear(hidden_size, vocab_size, bias=False, gather_output=False)

    def forward(self, x, target):
        return vocab_parallel_cross_entropy(self.head(x), target)


__all__ = ["FairscaleLMHeadLoss"]
