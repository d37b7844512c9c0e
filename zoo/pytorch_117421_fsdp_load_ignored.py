"""pytorch/pytorch#117421: "FSDP silently ignores a state_dict loaded between forward and backward".

A run resumed under FSDP (FULL_SHARD) that ran a forward before loading its checkpoint kept computing with the
parameters it had unsharded for that forward: the load reported nothing and had no effect on the model, so the
resumed run continued from its fresh weights. Re-created in plain torch: torch.distributed.checkpoint saves the
whole state; the load restores the optimizer's part and leaves the model's parameters as they were (the live
copies the loaded shards never reach). The twin is torch.distributed.checkpoint's save and load of the whole
state."""

from __future__ import annotations

from distcheck.zoo import Entry


class ModelLoadIgnored:
    """DCP's save of the whole state; the load reaches the optimizer's state only."""

    @staticmethod
    def save(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state, checkpoint_id=path)

    @staticmethod
    def load(state, path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.load({"optim": state["optim"]}, checkpoint_id=path)


ENTRY = Entry(
    reference="pytorch/pytorch#117421",
    url="https://github.com/pytorch/pytorch/issues/117421",
    library="torch (FSDP, FULL_SHARD)", versions="as reported (January 2024)",
    bug_class="checkpoint restore omission: the model's parameters",
    contract="checkpoint", property="round_trip",
    bug=ModelLoadIgnored, fixed="distcheck.parallel.checkpoint.plans:TORCH_DCP",
    summary="the load leaves the model's live parameters as they were: the run resumes from fresh weights",
    reproduction="plain torch re-creation",
    dtypes=("float32",), examples=2,
)
