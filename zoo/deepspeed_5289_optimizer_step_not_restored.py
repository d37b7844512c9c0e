"""deepspeedai/DeepSpeed#5289: "Improve universal checkpoint" (restoring the step).

A universal checkpoint saves the training step count, but loading it did not restore the optimizer's
per-parameter ``step`` (``optimizer_state['state'][param]['step']``, the one torch's Adam reads) as it was saved
(#5263 then #5289): the resumed Adam applies the bias correction of another step. Re-created in plain torch:
torch.distributed.checkpoint's save and load, then every Adam step count set back to 0, as an optimizer rebuilt
without its step."""

from __future__ import annotations

from distcheck.zoo import Entry


class StepNotRestored:
    """DCP's save and load, then every Adam step count set to 0."""

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


ENTRY = Entry(
    reference="deepspeedai/DeepSpeed#5289",
    url="https://github.com/deepspeedai/DeepSpeed/pull/5289",
    library="DeepSpeed (universal checkpoint)", versions="before 0.14.1 (March 2024)",
    bug_class="checkpoint restore omission: optimizer step count",
    contract="checkpoint", property="next_step",
    bug=StepNotRestored, fixed="distcheck.parallel.checkpoint.plans:TORCH_DCP",
    summary="the optimizer's per-parameter step count is not restored as saved: Adam's bias correction restarts",
    reproduction="plain torch re-creation",
    dtypes=("float32",), examples=2,
)
