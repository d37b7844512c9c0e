"""A hand-written sharded checkpoint: each rank saves its own shards with ``torch.save``, and a loader that
assumes equal shards. It passes while every shard has the same size, and fails on the first uneven one::

    distcheck certify examples.my_checkpoint:EqualShardsCheckpoint --contract checkpoint --world-sizes 2

``save`` writes ``rank<r>.pt`` per rank: every tensor's local part (a DTensor's ``to_local()``, a plain
tensor whole) with its shard dimension. ``load`` concatenates the saved parts of each tensor along that
dimension (right: torch.chunk's shards are contiguous, in rank order), then takes rank r's part as rows
``[r * k, (r + 1) * k)`` with k its own local size: the offset of equal shards. With 3 rows over 2 ranks
(shards of 2 and 1) rank 1 reads row 1, not row 2.
"""

from __future__ import annotations

import os


def _walk(state, prefix=""):
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _walk(value, f"{name}/")
        elif hasattr(value, "shape"):
            yield name, state, key


class EqualShardsCheckpoint:
    """``save(state, path)`` / ``load(state, path)`` (module doc)."""

    @staticmethod
    def save(state, path) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor, Shard

        parts = {}
        for name, holder, key in _walk(state):
            t = holder[key]
            if isinstance(t, DTensor):
                dim = next((p.dim for p in t.placements if isinstance(p, Shard)), None)
                parts[name] = (dim, t.to_local().detach().clone())
            else:
                parts[name] = (None, t.detach().clone())
        torch.save(parts, os.path.join(path, f"rank{dist.get_rank()}.pt"))
        dist.barrier()

    @staticmethod
    def load(state, path) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        saved = [torch.load(os.path.join(path, f), weights_only=True)
                 for f in sorted(os.listdir(path), key=lambda f: int(f[4:-3])) if f.startswith("rank")]
        rank = dist.get_rank()
        for name, holder, key in _walk(state):
            dim = saved[0][name][0]
            pieces = [s[name][1] for s in saved] if dim is not None else [saved[0][name][1]]
            full = torch.cat(pieces, dim=dim) if dim is not None else pieces[0]
            t = holder[key]
            local = t.to_local() if isinstance(t, DTensor) else t
            mine_dim = next((p.dim for p in t.placements if hasattr(p, "dim")), None) if isinstance(t, DTensor) \
                else None
            if mine_dim is None:
                part = full
            else:
                k = local.shape[mine_dim]
                part = full.narrow(mine_dim, rank * k, k)  # equal shards assumed: rank r starts at r * k
            with torch.no_grad():
                local.copy_(part.reshape(local.shape))
