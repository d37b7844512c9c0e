"""Wrong checkpoints for the ``checkpoint`` and ``checkpoint-restart`` contracts, each failing its properties
(``tests/test_checkpoint.py``)::

    distcheck certify examples.checkpoint_mutants:StepNotRestored --contract checkpoint --world-sizes 2
    distcheck certify examples.checkpoint_mutants:ModelOnly --contract checkpoint --world-sizes 2
    distcheck certify examples.checkpoint_mutants:EveryRankWritesAll --contract checkpoint --world-sizes 2
    distcheck certify examples.checkpoint_mutants:CurrentWorldFiles --contract checkpoint --world-sizes 4
    distcheck certify examples.checkpoint_mutants:SchedulerNotRestored --contract checkpoint-restart --world-sizes 2
    distcheck certify examples.checkpoint_mutants:RngNotRestored --contract checkpoint-restart --world-sizes 2

* ``StepNotRestored``: torch.distributed.checkpoint, then Adam's step counts set back to 0 (a loader that
  rebuilds the optimizer and forgets its step): fails ``round_trip`` and ``next_step``.
* ``ModelOnly``: saves and loads ``state["model"]`` alone: the moments are lost (``round_trip``) and the
  folder holds less than the closed form (``bytes``).
* ``EveryRankWritesAll``: every rank writes the whole state (``full_tensor()``) to its own file and loads
  rank 0's: right values, but N copies (``bytes``).
* ``CurrentWorldFiles``: every rank writes its own shards with their offsets to ``rank<r>.pt`` (a shard held
  by several ranks once), and a load reads ``rank0.pt`` .. ``rank<M-1>.pt``, M the *loading* world's size,
  never recording how many ranks saved. Right on the world that saved (it certifies with ``--option
  reshard=false``), wrong on any other: at 4 -> 3 rank 3's shards are never read and load as zeros
  (``round_trip``, ``next_step``); at 2 -> 4 ``rank2.pt`` does not exist.

Whole training states (``checkpoint-restart``), each torch's ``TrainingState`` with one part left out:

* ``SchedulerNotRestored``: the LR scheduler's state is neither saved nor loaded: the restarted run's
  scheduler starts its warmup again (``resume``: ``lr_scheduler.last_epoch``; ``restart``: the LR and the
  weight from the second step after the load).
* ``RngNotRestored``: the RNG state is neither saved nor loaded: the restarted run draws the dropout masks of
  a fresh job (fails ``resume`` and ``restart`` with dropout; certifies with ``--option dropout=false``,
  when no step draws from the generator).
"""

from __future__ import annotations

import os

from distcheck.parallel.checkpoint.stateful import TrainingState


class StepNotRestored:
    """DCP's save and load, then every step count set to 0."""

    @staticmethod
    def save(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=path)

    @staticmethod
    def load(state, path) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        dcp.load(state, checkpoint_id=path)
        for s in state["optim"]["state"].values():
            s["step"] = torch.zeros_like(s["step"])


class ModelOnly:
    """DCP's save and load of the model's state alone."""

    @staticmethod
    def save(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": state["model"]}, checkpoint_id=path)

    @staticmethod
    def load(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.load({"model": state["model"]}, checkpoint_id=path)


class EveryRankWritesAll:
    """Every rank saves the whole state; every rank loads rank 0's copy."""

    @staticmethod
    def save(state, path) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        def whole(x):
            if isinstance(x, dict):
                return {k: whole(v) for k, v in x.items()}
            if isinstance(x, list):
                return [whole(v) for v in x]
            return x.full_tensor() if isinstance(x, DTensor) else x

        torch.save(whole(state), os.path.join(path, f"rank{dist.get_rank()}.pt"))
        dist.barrier()

    @staticmethod
    def load(state, path) -> None:
        import torch
        from torch.distributed.tensor import DTensor, distribute_tensor

        saved = torch.load(os.path.join(path, "rank0.pt"), weights_only=False)

        def into(target, source):
            for k, v in target.items():
                if isinstance(v, dict):
                    into(v, source[k])
                elif isinstance(v, DTensor):
                    v.to_local().copy_(distribute_tensor(source[k], v.device_mesh, v.placements).to_local())
                elif isinstance(v, torch.Tensor):
                    v.copy_(source[k])

        with torch.no_grad():
            into(state, saved)


def _leaves(state, prefix=""):
    """``(name, holder, key)`` of every tensor of a nested state dict."""
    for key, value in state.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        elif hasattr(value, "shape"):
            yield f"{prefix}{key}", state, key


def _box(t):
    """``(local tensor, global offset, global shape)`` of a DTensor's shard or a plain tensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if isinstance(t, DTensor):
        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return t.to_local(), tuple(offset), tuple(t.shape)
    return t, (0,) * t.dim(), tuple(t.shape)


class CurrentWorldFiles:
    """One file per saving rank; a load reads one file per loading rank (module doc)."""

    @staticmethod
    def save(state, path) -> None:
        import torch
        import torch.distributed as dist

        rank = dist.get_rank()
        mine = {name: _box(holder[key]) for name, holder, key in _leaves(state)}
        boxes = [None] * dist.get_world_size()
        dist.all_gather_object(boxes, {n: (off, tuple(t.shape)) for n, (t, off, _) in mine.items()})
        pieces = {}
        for name, (t, offset, shape) in mine.items():
            box = (offset, tuple(t.shape))
            held_lower = any(boxes[r][name] == box for r in range(rank))  # written once, by its lowest rank
            if t.numel() and not held_lower:
                pieces[name] = (t.detach().cpu().clone(), offset, shape)
        torch.save(pieces, os.path.join(path, f"rank{rank}.pt"))
        dist.barrier()

    @staticmethod
    def load(state, path) -> None:
        import torch
        import torch.distributed as dist

        files = [torch.load(os.path.join(path, f"rank{r}.pt"), weights_only=True)
                 for r in range(dist.get_world_size())]  # the loading world's files: the mistake
        for name, holder, key in _leaves(state):
            local, offset, shape = _box(holder[key])
            full = torch.zeros(shape, dtype=local.dtype)
            for pieces in files:
                if name in pieces:
                    t, at, _ = pieces[name]
                    full[tuple(slice(o, o + n) for o, n in zip(at, t.shape, strict=True))] = t
            with torch.no_grad():
                local.copy_(full[tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))])


class SchedulerNotRestored(TrainingState):
    """The whole training state but the LR scheduler's."""

    def state_dict(self):
        state = super().state_dict()
        del state["lr_scheduler"]
        return state

    def load_state_dict(self, state) -> None:
        state = {**state, "lr_scheduler": self.parts.lr_scheduler.state_dict()}  # the fresh scheduler's own
        super().load_state_dict(state)


class RngNotRestored(TrainingState):
    """The whole training state but the RNG's."""

    def state_dict(self):
        state = super().state_dict()
        del state["rng"]
        return state

    def load_state_dict(self, state) -> None:
        import torch

        super().load_state_dict({**state, "rng": torch.get_rng_state()})  # the fresh job's generator, as it is
