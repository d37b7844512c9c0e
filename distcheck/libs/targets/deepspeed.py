"""DeepSpeed's ZeRO model-state memory estimators (memory-estimator contracts).

Targets: ``estimate_zero2_model_states_mem_needs`` (``deepspeed/runtime/zero/stage_1_and_2.py``)
and ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``), GPU
bytes without offload, N = ``num_gpus_per_node`` on one node; ZeRO-3 takes the largest layer's
parameter count as an option (drawn in [1, P]). Their printed tables come from the ``*_all_cold``
functions (the ``*_all_live`` ones count a model's parameters and call them): the row without
offload is the printed figure checked.

    distcheck certify distcheck.libs.targets.deepspeed:ZERO2 --contract memory-estimator
    distcheck certify distcheck.libs.targets.deepspeed:STAGES --contract memory-estimator-stages

``ULYSSES`` (context-parallel-attention contract, on gloo worlds): DeepSpeed-Ulysses'
``deepspeed.sequence.layer.DistributedAttention(local_attention, group)`` with its defaults
(``scatter_idx=2``, ``gather_idx=0``: the sequence-first layout ``[s/cp, b, heads, head_dim]``, batch
dimension 1) on the world's group. The contract hands each rank its head-tail shard ``(1, H, s/cp, e)``;
the adapter transposes it to ``(s/cp, 1, H, e)``, DeepSpeed all-to-alls q, k and v to head shards over the
whole sequence (in rank order: rank 0's shard, then rank 1's, ...), the local attention (written here:
causal on the gathered tokens' global positions, query head h reading KV head h // (H / Hkv)) attends, and
DeepSpeed's all-to-all brings the output back to the rank's sequence shard; the backward is DeepSpeed's
autograd (``_SeqAllToAll``). ``deepspeed.comm`` wraps the pool's process group
(``deepspeed.comm.init_distributed("gloo")``), with the CPU shared-memory all-reduce extension marked
unavailable (it would be compiled on first use, and no all-to-all uses it). The contract draws cp dividing H and Hkv::

    distcheck certify distcheck.libs.targets.deepspeed:ULYSSES --contract context-parallel-attention --world-sizes 2

``MOE`` (moe-layer contract, on a gloo world of two): ``deepspeed.moe.layer.MoE`` with ``k=2``, the adapter and
its conventions in :mod:`distcheck.libs.targets.deepspeed_moe`, certified with one or two experts per rank.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from distcheck.libs.targets import WorldRun
from distcheck.libs.targets.deepspeed_moe import (
    DEEPSPEED_OPTIONS,
    MOE,  # noqa: F401 - WORLD_CERTIFY's target deepspeed:MOE is read here
)
from distcheck.parallel.memory.estimators import Estimator, EstimatorFamily

__all__ = ["DIST", "TITLE", "CERTIFY", "WORLD_CERTIFY", "ZERO2", "ZERO3", "STAGES", "ULYSSES", "ulysses_attention"]

DIST = "deepspeed"
TITLE = "DeepSpeed ZeRO-2 and ZeRO-3 model-state estimators"


def _zero_modules() -> tuple[ModuleType, ModuleType]:
    """DeepSpeed's ZeRO modules, imported without the log line its accelerator detection prints to
    stdout (which would mix into ``distcheck libs --format markdown``)."""
    import logging
    import sys

    if "deepspeed.runtime.zero.stage3" not in sys.modules:
        with contextlib.redirect_stdout(io.StringIO()):
            import deepspeed.runtime.zero.stage3
            import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    return sys.modules["deepspeed.runtime.zero.stage_1_and_2"], sys.modules["deepspeed.runtime.zero.stage3"]


def _zero2(p: int, n: int, o: Mapping[str, Any]) -> int:
    z2, _ = _zero_modules()
    return z2.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, num_nodes=1, cpu_offload=False)[1]


def _zero3(p: int, n: int, o: Mapping[str, Any]) -> int:
    _, z3 = _zero_modules()
    return z3.estimate_zero3_model_states_mem_needs(p, o["largest_layer_params"], num_gpus_per_node=n, num_nodes=1,
                                                    cpu_offload=False, cpu_offload_params=False, zero_init=True)[1]


def _printed_row(text: str, ending: str) -> str:
    for line in text.splitlines():
        if line.rstrip().endswith(ending):
            return line.split("|")[1].strip()
    raise ValueError(f"no printed row ends with {ending!r}: {text!r}")


def _zero2_printed(p: int, n: int, o: Mapping[str, Any]) -> str:
    z2, _ = _zero_modules()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        z2.estimate_zero2_model_states_mem_needs_all_cold(p, num_gpus_per_node=n, num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_optimizer=none")


def _zero3_printed(p: int, n: int, o: Mapping[str, Any]) -> str:
    _, z3 = _zero_modules()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        z3.estimate_zero3_model_states_mem_needs_all_cold(p, o["largest_layer_params"], num_gpus_per_node=n,
                                                          num_nodes=1)
    return _printed_row(buf.getvalue(), "offload_param=none, offload_optimizer=none, zero_init=1")


def _largest_layer(p: int) -> Any:
    from hypothesis import strategies as st

    return st.integers(1, p).map(_layer_options)


def _layer_options(n: int) -> dict[str, int]:
    return {"largest_layer_params": n}


ZERO2 = Estimator("deepspeed.zero2", DIST, 2, _zero2, printed=_zero2_printed)
ZERO3 = Estimator("deepspeed.zero3", DIST, 3, _zero3, options=_largest_layer, fit_options={"largest_layer_params": 1},
                  printed=_zero3_printed)
STAGES = EstimatorFamily("deepspeed.zero", (ZERO2, ZERO3))

#: the targets of this module and the contract each is certified under
CERTIFY = (("ZERO2", "memory-estimator"), ("ZERO3", "memory-estimator"), ("STAGES", "memory-estimator-stages"))

_ULYSSES: dict[Any, Any] = {}


def _gathered_positions(cp: int, length: int, device: Any) -> Any:
    """The global positions of the sequence DeepSpeed's all-to-all gathers: every rank's head-tail shard of
    ``length`` tokens, in rank order (:func:`distcheck.parallel.cp.reference.load_balanced_positions`)."""
    import numpy as np
    import torch

    from distcheck.parallel.cp.reference import load_balanced_positions

    return torch.as_tensor(np.concatenate(load_balanced_positions(cp * length, cp)), device=device)


def _local_attention(q: Any, k: Any, v: Any, positions: Any) -> Any:
    """The local attention DeepSpeed calls on head shards ``(S, 1, h, e)`` (sequence first): causal on the
    global ``positions`` of the gathered tokens, scaled by 1/sqrt(e), grouped-query heads."""
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # (1, h, S, e)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    return (scores.softmax(-1) @ v).permute(2, 0, 1, 3)  # back to (S, 1, h, e)


def _distributed_attention(cp: int, length: int, device: Any) -> Any:
    """DeepSpeed's ``DistributedAttention`` over the default group, built once per world, rank and length."""
    import torch
    import torch.distributed as dist

    key = (id(dist.group.WORLD), dist.get_rank(), cp, length, str(device))
    if key not in _ULYSSES:
        with contextlib.redirect_stdout(io.StringIO()):
            import deepspeed.comm as ds_dist
            from deepspeed.sequence.layer import DistributedAttention
        # the CPU accelerator's shared-memory all-reduce is a C++ extension compiled on first use (minutes on
        # two cores); the all-to-alls under test never use it, so it is marked unavailable before deepspeed.comm
        # wraps the process group (TorchBackend then keeps shm_comm_op = None)
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        ds_dist.init_distributed(dist_backend="gloo")
        positions = _gathered_positions(cp, length, device)

        class Local(torch.nn.Module):
            def forward(self, q: Any, k: Any, v: Any) -> Any:
                return _local_attention(q, k, v, positions)

        _ULYSSES[key] = DistributedAttention(Local(), dist.group.WORLD)
    return _ULYSSES[key]


def ulysses_attention(q: Any, k: Any, v: Any) -> Any:
    """The contract's ``fn(q, k, v) -> out`` on this rank's head-tail shards ``(1, heads, s/cp, e)``: DeepSpeed's
    ``DistributedAttention`` on the sequence-first layout (module doc)."""
    import torch.distributed as dist

    attn = _distributed_attention(dist.get_world_size(), q.shape[2], q.device)
    out = attn(*(t.permute(2, 0, 1, 3) for t in (q, k, v)), 1)  # (s/cp, 1, heads, e), batch dim 1
    return out.permute(1, 2, 0, 3)


#: DeepSpeed-Ulysses' DistributedAttention (context-parallel-attention contract)
ULYSSES = ulysses_attention
#: the targets certified on gloo worlds: Ulysses at 2 and 4 ranks, float32; MoE at 2 ranks, one or two experts each
#: (drawn), float32
WORLD_CERTIFY = (
    WorldRun("ULYSSES", "context-parallel-attention", "deepspeed.ulysses", world_sizes=(2, 4), max_examples=5,
             dtypes=("float32",), timeout_s=120.0, preload=("deepspeed.sequence.layer",)),
    WorldRun("MOE", "moe-layer", "deepspeed.moe", world_sizes=(2,), max_examples=5,
             options={**DEEPSPEED_OPTIONS, "local_experts": 0}, dtypes=("float32",), timeout_s=120.0,
             preload=("deepspeed.moe.layer",)),
)
