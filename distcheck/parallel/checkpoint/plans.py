"""torch.distributed.checkpoint as a target of the ``checkpoint`` contract.

``TORCH_DCP.save(state, path)`` is ``dcp.save(state, checkpoint_id=path)`` and ``TORCH_DCP.load(state,
path)`` is ``dcp.load(state, checkpoint_id=path)``, in place, with torch's default planners and its
``FileSystemWriter`` / ``FileSystemReader`` (one ``__<rank>_0.distcp`` file per rank that writes, and the
``.metadata`` file, written to ``.metadata.tmp`` and renamed last).

``TRAINING_STATE`` is a target of the ``checkpoint-restart`` contract: the whole training state as one DCP
``Stateful`` (:class:`distcheck.parallel.checkpoint.stateful.TrainingState`: model, optimizer, LR scheduler,
data-loader position, RNG state and step counter).
"""

from __future__ import annotations

from distcheck.parallel.checkpoint.stateful import TrainingState

__all__ = ["TorchDCP", "TORCH_DCP", "TRAINING_STATE"]


class TorchDCP:
    """torch.distributed.checkpoint's save and load (module doc)."""

    @staticmethod
    def save(state: dict, path: str) -> None:
        """``dcp.save(state, checkpoint_id=path)``."""
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=path)

    @staticmethod
    def load(state: dict, path: str) -> None:
        """``dcp.load(state, checkpoint_id=path)``: fills ``state``'s tensors in place."""
        import torch.distributed.checkpoint as dcp

        dcp.load(state, checkpoint_id=path)


#: the target ``distcheck.parallel.checkpoint.plans:TORCH_DCP``
TORCH_DCP = TorchDCP

#: the target ``distcheck.parallel.checkpoint.plans:TRAINING_STATE`` of the ``checkpoint-restart`` contract
TRAINING_STATE = TrainingState
