"""NVIDIA-NeMo/Automodel#763: "Optimizer state dict not correctly loaded after resume from checkpoint".

After a refactoring the checkpointer saved the optimizer but never loaded its state back: a resumed run
restarted Adam (moments and step count) from scratch, with nothing raised. Re-created in plain torch:
torch.distributed.checkpoint saves the whole state, and the loader restores the model's part only."""

from __future__ import annotations

from distcheck.zoo import Entry


class OptimizerNotLoaded:
    """DCP's save of the whole state; the load restores ``state["model"]`` only."""

    @staticmethod
    def save(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=path)

    @staticmethod
    def load(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.load({"model": state["model"]}, checkpoint_id=path)


ENTRY = Entry(
    reference="NVIDIA-NeMo/Automodel#763",
    url="https://github.com/NVIDIA-NeMo/Automodel/issues/763",
    library="NeMo Automodel", versions="main at 55aff83 (November 2025)",
    bug_class="checkpoint restore omission",
    contract="checkpoint", property="round_trip",
    bug=OptimizerNotLoaded, fixed="distcheck.parallel.checkpoint.plans:TORCH_DCP",
    summary="the optimizer's state is saved but never loaded on resume: Adam restarts from zero",
    reproduction="plain torch re-creation",
    dtypes=("float32",), examples=2,
)
