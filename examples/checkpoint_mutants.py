"""Wrong checkpoints for the ``checkpoint`` contract, each failing its properties (``tests/test_checkpoint.py``)::

    distcheck certify examples.checkpoint_mutants:StepNotRestored --contract checkpoint --world-sizes 2
    distcheck certify examples.checkpoint_mutants:ModelOnly --contract checkpoint --world-sizes 2
    distcheck certify examples.checkpoint_mutants:EveryRankWritesAll --contract checkpoint --world-sizes 2

* ``StepNotRestored``: torch.distributed.checkpoint, then Adam's step counts set back to 0 (a loader that
  rebuilds the optimizer and forgets its step): fails ``round_trip`` and ``next_step``.
* ``ModelOnly``: saves and loads ``state["model"]`` alone: the moments are lost (``round_trip``) and the
  folder holds less than the closed form (``bytes``).
* ``EveryRankWritesAll``: every rank writes the whole state (``full_tensor()``) to its own file and loads
  rank 0's: right values, but N copies (``bytes``).
"""

from __future__ import annotations

import os


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
