"""torch's own vocab-parallel pieces, as ``distcheck certify`` targets.

* :data:`embedding_style`: ``RowwiseParallel(input_layouts=Replicate())``, the style torch's
  tensor-parallel tutorial applies to ``nn.Embedding`` (the table sharded by vocabulary rows, the
  ids replicated, the output all-reduced). The class default ``RowwiseParallel()`` takes its input
  as sharded along the last dim (``Shard(-1)``): right for a linear, wrong for token ids.
* The cross-entropy needs no object of ours: ``torch.distributed.tensor.parallel:loss_parallel``
  is certified directly (the contract wraps each rank's logit columns as the ``Shard(1)`` DTensor a
  ``ColwiseParallel(use_local_output=False)`` lm head produces).

    distcheck certify examples.torch_vocab:embedding_style --contract vocab-parallel-embedding
    distcheck certify torch.distributed.tensor.parallel:loss_parallel --contract vocab-parallel-cross-entropy \
        --option reduction=mean --option ignore_index=-100
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import RowwiseParallel

embedding_style = RowwiseParallel(input_layouts=Replicate())

__all__ = ["embedding_style"]
