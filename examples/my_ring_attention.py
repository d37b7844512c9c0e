"""Ring attention in plain torch.distributed (Liu et al. 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context"), for the ``context-parallel-attention`` contract.

Every rank holds the head-tail shard of the sequence (chunks r and 2 cp - 1 - r of 2 cp; Llama 3,
§3.3.2) of q (1, H, s/cp, e), k and v (1, Hkv, s/cp, e). The forward passes the K/V blocks round the
ring with ``batch_isend_irecv`` (send to rank + 1, receive from rank - 1) and merges the blocks'
partials by the online softmax; the backward (an ``autograd.Function``: send/recv are not
differentiable) passes the blocks round again with their dK, dV accumulators, which one last pass
brings home.

Send/recv need a backend with point-to-point: gloo or NCCL (the threaded backend has none)::

    distcheck certify examples.my_ring_attention:ring_attention --contract context-parallel-attention \\
        --backend gloo --world-sizes 2,4                                        # certified
    distcheck certify examples.my_ring_attention:ring_attention_local_mask --contract \\
        context-parallel-attention --backend gloo --world-sizes 2               # fails forward and grads
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _positions(rank: int, cp: int, length: int, device) -> torch.Tensor:
    c = length // 2
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    last = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, device=device)
    return torch.cat([first, last])


def _pass(t: torch.Tensor, group) -> torch.Tensor:
    """Send ``t`` to the next rank of ``group``, return the previous rank's."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    t = t.contiguous()
    got = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(group, (rank + 1) % n), group),
           dist.P2POp(dist.irecv, got, dist.get_global_rank(group, (rank - 1) % n), group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return got


def _scores(q, k, q_pos, k_pos, causal):
    rep = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return s


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, local_mask, group):
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        L = q.shape[2]
        pos = [_positions(j, n, L, q.device) for j in range(n)]
        q_pos = torch.arange(L, device=q.device) if local_mask else pos[rank]
        rep = q.shape[1] // k.shape[1]
        m = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
        l_sum = torch.zeros_like(m)
        acc = torch.zeros_like(q)
        kb, vb = k, v
        for t in range(n):
            j = (rank - t) % n
            k_pos = torch.arange(j * L, (j + 1) * L, device=q.device) if local_mask else pos[j]
            s = _scores(q, kb, q_pos, k_pos, True)
            m_new = torch.maximum(m, s.amax(dim=-1))
            safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            scale = torch.where(torch.isfinite(m), torch.exp(m - safe), torch.zeros_like(m))
            p = torch.exp(s - safe[..., None])
            l_sum = l_sum * scale + p.sum(-1)
            acc = acc * scale[..., None] + p @ vb.repeat_interleave(rep, dim=1)
            m = m_new
            if t < n - 1:
                kb, vb = _pass(kb, group), _pass(vb, group)
        out = acc / l_sum[..., None]
        lse = m + torch.log(l_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.local_mask, ctx.group = local_mask, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        L, e = q.shape[2], q.shape[3]
        pos = [_positions(j, n, L, q.device) for j in range(n)]
        q_pos = torch.arange(L, device=q.device) if ctx.local_mask else pos[rank]
        rep = q.shape[1] // k.shape[1]
        D = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kb, vb = k, v
        dkb, dvb = torch.zeros_like(k), torch.zeros_like(v)
        for t in range(n):
            j = (rank - t) % n
            k_pos = torch.arange(j * L, (j + 1) * L, device=q.device) if ctx.local_mask else pos[j]
            p = torch.exp(_scores(q, kb, q_pos, k_pos, True) - lse[..., None])
            kk, vv = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
            ds = p * (dout @ vv.transpose(-1, -2) - D)
            dq = dq + ds @ kk / math.sqrt(e)
            dk_h = ds.transpose(-1, -2) @ q / math.sqrt(e)
            dv_h = p.transpose(-1, -2) @ dout
            b, hkv = k.shape[0], k.shape[1]
            dkb = dkb + dk_h.reshape(b, hkv, rep, L, e).sum(2)
            dvb = dvb + dv_h.reshape(b, hkv, rep, L, e).sum(2)
            if t < n - 1:
                kb, vb = _pass(kb, group), _pass(vb, group)
            if n > 1:
                dkb, dvb = _pass(dkb, group), _pass(dvb, group)
        return dq, dkb, dvb, None, None


def ring_attention(q, k, v, group=None):
    """Causal ring attention on this rank's head-tail shard (module doc) over the ranks of ``group`` (default:
    the world; the training step's cp group under ``examples.my_step:parallelize_own_ring``): certified."""
    return _Ring.apply(q, k, v, False, group if group is not None else dist.group.WORLD)


def ring_attention_local_mask(q, k, v, group=None):
    """The same ring with the causal mask on local positions (the shard's own indices): fails."""
    return _Ring.apply(q, k, v, True, group if group is not None else dist.group.WORLD)
