"""Targets of the ``context-parallel-attention`` contract in plain torch.distributed, and torch's own.

Every target is ``fn(q, k, v) -> out`` on this rank's head-tail shards (the contract's layout:
q (1, H, s/cp, e), k and v (1, Hkv, s/cp, e); rank r holds chunks r and 2 cp - 1 - r of 2 cp, "The
Llama 3 Herd of Models", §3.3.2), cp the world size. Attention is causal on the global positions,
scaled by 1/sqrt(e), query head h reading KV head h // (H / Hkv).

* ``ALL_GATHER_ATTENTION``: Llama 3's context parallelism (§3.3.2): K and V all-gathered
  (``all_gather_single``; ``all_gather_into_tensor`` where torch lacks it, deprecated in 2.13), the rank's
  queries attend the whole sequence with the mask on the gathered keys' global positions; the backward
  reduce-scatters dK and dV (``reduce_scatter_single``, or ``reduce_scatter_tensor``; an
  ``autograd.Function``: the collectives are not differentiable).
* ``ULYSSES_ATTENTION``: DeepSpeed-Ulysses (Jacobs et al. 2023, §3.1): ``all_to_all_single`` of q, k, v
  from sequence shards to head shards (rank r: query heads [r H/cp, (r+1) H/cp) and KV heads
  [r Hkv/cp, (r+1) Hkv/cp)), attention on the whole sequence, and the output's all-to-all back; the
  backward is the inverse all-to-all of each gradient. cp must divide H and Hkv (the contract's cases do).
* ``RING_ATTENTION``: distcheck's ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers for
  Near-Infinite Context"): the K/V blocks passed round the ranks of a group (default the world; the
  ``training-step`` contract's context-parallel compositions pass their cp group) and merged by the online softmax,
  autograd's backward through the merge (:func:`ring_attention`).
* ``TORCH_CONTEXT_PARALLEL``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)``
  inside ``torch.distributed.tensor.experimental.context_parallel`` on a one-axis mesh of the world:
  torch replaces the attention by its ring over the mesh, on each rank's head-tail shard (its load
  balancer's layout is the contract's). Without a GPU, torch 2.13 registers no sharding strategy for the
  CPU attention op, and every rank raises :data:`CPU_REFUSAL_ERROR` (reproduced at world size 2 on gloo by
  ``tests/test_cp.py``); the contract records its properties ``skip`` with :data:`CPU_REFUSAL` only then
  (:func:`cpu_refusal`), and runs it otherwise (any other error is a FAIL).

The all-gather and Ulysses targets are ``distcheck check``'s cp rows on gloo (:mod:`distcheck.parallel.cp.
checks`); the ring of ``examples/my_ring_attention.py`` is certified by ``distcheck certify``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["all_gather_attention", "ulysses_attention", "ring_attention", "torch_context_parallel", "cpu_refusal",
           "ALL_GATHER_ATTENTION", "ULYSSES_ATTENTION", "RING_ATTENTION", "TORCH_CONTEXT_PARALLEL", "CPU_OP",
           "CPU_REFUSAL_ERROR", "CPU_REFUSAL"]

#: the op CPU scaled_dot_product_attention dispatches to (torch 2.13)
CPU_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"
#: what every rank raises under context_parallel without a GPU (torch 2.13, DTensor's sharding propagation)
CPU_REFUSAL_ERROR = f"NotImplementedError: Operator {CPU_OP} does not have a sharding strategy registered."
#: why the row is a skip without a GPU
CPU_REFUSAL = (f"torch's context_parallel refuses the CPU attention op on every rank ({CPU_REFUSAL_ERROR}); it runs "
               "where a GPU is present")


def _positions(rank: int, cp: int, length: int, device: Any) -> Any:
    """Rank ``rank``'s global positions: chunks ``rank`` and ``2 cp - 1 - rank`` of ``length // 2`` tokens."""
    import torch

    c = length // 2
    return torch.cat([torch.arange(rank * c, (rank + 1) * c, device=device),
                      torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)])


def _attend(q: Any, k: Any, v: Any, q_pos: Any, k_pos: Any) -> Any:
    """Causal attention of q (1, H, Lq, e) over k, v (1, Hkv, Lk, e) on global positions (autograd's)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return s.softmax(-1) @ v


def _function() -> tuple[Any, Any, Any]:
    """The autograd Functions, built on first use (``import distcheck`` stays free of torch)."""
    import torch
    import torch.distributed as dist

    class GatherSequence(torch.autograd.Function):
        """(1, h, L, e) shards -> (1, h, cp L, e) in rank order; backward: the reduce-scatter of the gradient."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            n = dist.get_world_size()
            out = x.new_empty((n * x.shape[0], *x.shape[1:]))  # the shards stacked on dim 0, rank order
            # torch 2.13 renames all_gather_into_tensor (deprecated, a FutureWarning) to all_gather_single
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x.contiguous())
            return out.reshape(n, *x.shape).movedim(0, 2).reshape(x.shape[0], x.shape[1], n * x.shape[2], x.shape[3])

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            n = dist.get_world_size()
            b, h, nl, e = g.shape
            got = g.new_empty((b, h, nl // n, e))
            reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            reduce_scatter(got, g.reshape(b, h, n, nl // n, e).movedim(2, 0).reshape(n * b, h, nl // n, e))
            return got

    def seq_to_heads(x: Any) -> Any:
        """(1, h, L, e) sequence shard -> (1, h/cp, cp L, e) head shard over the whole sequence."""
        n = dist.get_world_size()
        b, h, L, e = x.shape
        send = x.reshape(b, n, h // n, L, e).movedim(1, 0).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.movedim(0, 2).reshape(b, h // n, n * L, e)

    def heads_to_seq(x: Any) -> Any:
        """The inverse of :func:`seq_to_heads`."""
        n = dist.get_world_size()
        b, hn, nl, e = x.shape
        send = x.reshape(b, hn, n, nl // n, e).movedim(2, 0).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.movedim(0, 1).reshape(b, n * hn, nl // n, e)

    class ToHeads(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return seq_to_heads(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return heads_to_seq(g)

    class ToSequence(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return heads_to_seq(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return seq_to_heads(g)

    return GatherSequence, ToHeads, ToSequence


_FUNCTIONS: list[Any] = []


def _functions() -> list[Any]:
    if not _FUNCTIONS:
        _FUNCTIONS.extend(_function())
    return _FUNCTIONS


def all_gather_attention(q: Any, k: Any, v: Any) -> Any:
    """Llama 3's all-gather of K and V on this rank's head-tail shards (module doc)."""
    import torch
    import torch.distributed as dist

    gather = _functions()[0]
    rank, n, L = dist.get_rank(), dist.get_world_size(), q.shape[2]
    k_pos = torch.cat([_positions(j, n, L, q.device) for j in range(n)])
    return _attend(q, gather.apply(k), gather.apply(v), _positions(rank, n, L, q.device), k_pos)


def ulysses_attention(q: Any, k: Any, v: Any) -> Any:
    """DeepSpeed-Ulysses' all-to-alls on this rank's head-tail shards (module doc)."""
    import torch
    import torch.distributed as dist

    _, to_heads, to_seq = _functions()
    n, L = dist.get_world_size(), q.shape[2]
    pos = torch.cat([_positions(j, n, L, q.device) for j in range(n)])
    return to_seq.apply(_attend(to_heads.apply(q), to_heads.apply(k), to_heads.apply(v), pos, pos))


_RING: list[Any] = []


def _ring_pass() -> Any:
    """The autograd Function that hands a tensor to the next rank of a group (and its gradient back to the
    previous one), built on first use."""
    if _RING:
        return _RING[0]
    import torch
    import torch.distributed as dist

    def exchange(t: Any, group: Any, step: int) -> Any:
        n, r = dist.get_world_size(group), dist.get_rank(group)
        to, frm = dist.get_global_rank(group, (r + step) % n), dist.get_global_rank(group, (r - step) % n)
        t = t.contiguous()
        got = torch.empty_like(t)
        ops = [dist.P2POp(dist.isend, t, to, group), dist.P2POp(dist.irecv, got, frm, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return got

    class RingPass(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: Any, group: Any) -> Any:
            ctx.group = group
            return exchange(t, group, 1)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return exchange(g, ctx.group, -1), None

    _RING.append(RingPass)
    return RingPass


def ring_attention(q: Any, k: Any, v: Any, group: Any = None) -> Any:
    """distcheck's ring attention (Liu et al. 2023) on this rank's head-tail shards over the ranks of ``group``
    (default: the world), ``q`` (b, H, L, e), ``k`` and ``v`` (b, Hkv, L, e), L = s / cp: the K/V blocks go round
    the ring by ``batch_isend_irecv`` (to the next rank of the group, from the previous), each block's scores
    masked on the global positions of :func:`~distcheck.parallel.cp.reference.load_balanced_positions` and merged
    into the running ``(m, l, acc)`` by the online softmax (Milakov and Gimelshein 2018; the ``Partial`` merge of
    :mod:`distcheck.parallel.cp.reference`), the running max detached (the output does not depend on it). The
    backward is autograd's through the merge, each pass's gradient handed back to the previous rank. Returns
    the rank's output shard (b, H, L, e)."""
    import torch
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    n, r = dist.get_world_size(group), dist.get_rank(group)
    rep = q.shape[1] // k.shape[1]
    L = q.shape[2]
    q_pos = _positions(r, n, L, q.device)
    m = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
    l_sum = torch.zeros(q.shape[:3], dtype=q.dtype, device=q.device)
    acc = torch.zeros_like(q)
    kb, vb = k, v
    for t in range(n):
        scores = q @ kb.repeat_interleave(rep, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(_positions((r - t) % n, n, L, q.device)[None, :] > q_pos[:, None],
                                    float("-inf"))
        m_new = torch.maximum(m, scores.amax(dim=-1)).detach()
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        shift = torch.where(torch.isfinite(m), torch.exp(m - safe), torch.zeros_like(m))
        p = torch.exp(scores - safe[..., None])
        l_sum = l_sum * shift + p.sum(-1)
        acc = acc * shift[..., None] + p @ vb.repeat_interleave(rep, dim=1)
        m = m_new
        if t < n - 1:
            kb, vb = _ring_pass().apply(kb, group), _ring_pass().apply(vb, group)
    return acc / l_sum[..., None]


def cpu_refusal(device_type: str) -> str | None:
    """:data:`CPU_REFUSAL` when torch's context_parallel refuses attention on ``device_type`` ("cpu"
    without a GPU): DTensor's sharding propagation has no strategy, rule or single-dimension strategy
    for :data:`CPU_OP`, the condition under which it raises :data:`CPU_REFUSAL_ERROR`; else None."""
    import torch
    from torch.distributed.tensor import DTensor

    if device_type != "cpu":
        return None
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    prop = DTensor._op_dispatcher.sharding_propagator
    tables = (prop.op_strategy_funcs, prop.op_to_rules, getattr(prop, "op_single_dim_strategy_funcs", {}))
    return None if any(op in t for t in tables) else CPU_REFUSAL


def torch_context_parallel(q: Any, k: Any, v: Any) -> Any:
    """torch's ring attention on this rank's shards (module doc)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(q.device.type, (torch.distributed.get_world_size(),), mesh_dim_names=("cp",))
    # torch shards its ``buffers`` itself and sizes its load balancer from the first; the contract hands
    # this rank its shards already, so a throwaway buffer of the whole sequence's length stands in
    whole = torch.empty(1, 1, q.shape[2] * mesh.size(), device=q.device)
    with context_parallel(mesh, buffers=[whole], buffer_seq_dims=[2], no_restore_buffers={whole}):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


ALL_GATHER_ATTENTION = all_gather_attention
ULYSSES_ATTENTION = ulysses_attention
RING_ATTENTION = ring_attention
TORCH_CONTEXT_PARALLEL = torch_context_parallel
