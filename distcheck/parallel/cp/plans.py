"""torch's own context parallelism as a target of ``context-parallel-attention``.

``TORCH_CONTEXT_PARALLEL(q, k, v)``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True,
enable_gqa=True)`` inside ``torch.distributed.tensor.experimental.context_parallel`` on a one-axis mesh
of the world: torch replaces the attention by its ring over the mesh, on each rank's head-tail shard
(its load balancer's layout is the contract's). On CPU torch 2.13 refuses the CPU SDPA op ("does not
have a sharding strategy registered"), so the contract records its properties ``skip`` with that
reason where no GPU is present (:meth:`~distcheck.parallel.cp.contracts.ContextParallelAttention.skipped`).
"""

from __future__ import annotations

__all__ = ["torch_context_parallel", "TORCH_CONTEXT_PARALLEL", "CPU_REFUSAL"]

#: why the row is a skip without a GPU
CPU_REFUSAL = ("torch 2.13's context_parallel refuses the CPU scaled_dot_product_attention op ('does not have a "
               "sharding strategy registered'); it runs where a GPU is present")


def torch_context_parallel(q, k, v):
    """torch's ring attention on this rank's shards (module doc)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(q.device.type, (torch.distributed.get_world_size(),), mesh_dim_names=("cp",))
    with context_parallel(mesh):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


TORCH_CONTEXT_PARALLEL = torch_context_parallel
