"""deepspeedai/DeepSpeed#2071: "[BUG] FP16 used for all reduce even if BFLOAT16 is enabled" (a fix proposed in
deepspeedai/DeepSpeed#2145; the default revisited in deepspeedai/DeepSpeed#3370).

With ``bf16`` enabled and no explicit ``communication_data_type``, DeepSpeed's engine (and ZeRO's
``stage_1_and_2.py``) still cast the gradients to fp16 for the data-parallel all-reduce: a reduction in a
precision (and an exponent range) the run never asked for, silently. Re-created in plain torch: the gradients of
a float64 DDP run (the contract's precision) all-reduced in fp16 by torch's own ``fp16_compress_hook``, under
dp = 2 on equal shards (DDP's mean); the twin is torch's ``allreduce_hook``, the reduction in the gradients' own
dtype."""

from __future__ import annotations

from distcheck.zoo import Entry

ENTRY = Entry(
    reference="deepspeedai/DeepSpeed#2071",
    url="https://github.com/deepspeedai/DeepSpeed/issues/2071",
    library="DeepSpeed (engine, ZeRO stage 1 and 2)", versions="as reported (July 2022)",
    bug_class="mixed-precision reduction: the dp all-reduce in fp16",
    contract="data-parallel-reducer", property="grads",
    bug="torch.distributed.algorithms.ddp_comm_hooks.default_hooks:fp16_compress_hook",
    fixed="torch.distributed.algorithms.ddp_comm_hooks.default_hooks:allreduce_hook",
    summary="gradients all-reduced in fp16 though the run asks for another precision: rounding the run never chose",
    reproduction="plain torch re-creation",
    options={"hook_state": "none", "expect": "plain_mean", "shards": "equal"},
    dtypes=("float64",),
)
