"""Ring attention in plain torch.distributed (Liu et al. 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context"), for the ``context-parallel-attention`` contract.

Every rank holds the head-tail shard of the sequence (chunks r and 2 cp - 1 - r of 2 cp; Llama 3,
§3.3.2) of q (1, H, s/cp, e), k and v (1, Hkv, s/cp, e). The forward passes the K/V blocks round the
ring with ``batch_isend_irecv`` (send to rank + 1, receive from rank - 1) and merges the partials by
the online softmax; the backward (an ``autograd.Function``: send/recv are not differentiable) passes
the blocks round again with their dK, dV accumulators, which one last pass brings home.

Each step splits the rank's queries and the block's keys into their two chunks and computes the score
block of every pair of chunks, skipping a pair whose keys all come after its queries (fully masked):
under the head-tail split every rank then computes 2 cp + 1 blocks of (s / 2 cp)^2 scores per pass, the
same on every rank (the contract's ``balance``). The causal mask of each block comes from the contract's
``causal_mask(q_pos, k_pos)`` when it is given (it counts the blocks), else it is built here.

Send/recv need a backend with point-to-point: gloo or NCCL (the threaded backend has none)::

    distcheck certify examples.my_ring_attention:ring_attention --contract context-parallel-attention \\
        --backend gloo --world-sizes 2,4                                        # certified
    distcheck certify examples.my_ring_attention:ring_attention_local_mask --contract \\
        context-parallel-attention --backend gloo --world-sizes 2               # fails forward and grads
    distcheck certify examples.my_ring_attention:ring_attention_uneven_skip --contract \\
        context-parallel-attention --backend gloo --world-sizes 2               # fails balance only
    distcheck certify examples.my_ring_attention:ring_attention_contiguous --contract \\
        context-parallel-attention --option load_balance=false --world-sizes 2  # fails balance only
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _positions(rank: int, cp: int, length: int, layout: str, device) -> torch.Tensor:
    if layout == "contiguous":
        return torch.arange(rank * length, (rank + 1) * length, device=device)
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


def _own_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    return k_pos[None, :] > q_pos[:, None]


def _tiles(q_pos: torch.Tensor, k_pos: torch.Tensor, skip: bool):
    """The (query rows, key rows) slices of the pairs of chunks computed: every pair, or, with ``skip``, those
    with a key at or before a query."""
    c = q_pos.shape[0] // 2
    for a in range(2):
        rows = slice(a * c, (a + 1) * c)
        for b in range(2):
            cols = slice(b * c, (b + 1) * c)
            if skip and bool(k_pos[cols].min() > q_pos[rows].max()):
                continue                                     # fully masked: no score computed
            yield rows, cols


def _scores(q, k, q_pos, k_pos, mask):
    rep = q.shape[1] // k.shape[1]
    s = q @ k.repeat_interleave(rep, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    return s.masked_fill(mask(q_pos, k_pos), float("-inf"))


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, skip, mask, group):
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        L = q.shape[2]
        pos = [_positions(j, n, L, "contiguous" if layout == "local" else layout, q.device) for j in range(n)]
        q_pos = torch.arange(L, device=q.device) if layout == "local" else pos[rank]
        rep = q.shape[1] // k.shape[1]
        m = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype, device=q.device)
        l_sum = torch.zeros_like(m)
        acc = torch.zeros_like(q)
        kb, vb = k, v
        for t in range(n):
            j = (rank - t) % n
            k_pos = pos[j]
            for rows, cols in _tiles(q_pos, k_pos, skip):
                s = _scores(q[:, :, rows], kb[:, :, cols], q_pos[rows], k_pos[cols], mask)
                m_old = m[..., rows]
                m_new = torch.maximum(m_old, s.amax(dim=-1))
                safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                scale = torch.where(torch.isfinite(m_old), torch.exp(m_old - safe), torch.zeros_like(m_old))
                p = torch.exp(s - safe[..., None])
                l_sum[..., rows] = l_sum[..., rows] * scale + p.sum(-1)
                acc[:, :, rows] = acc[:, :, rows] * scale[..., None] + p @ vb[:, :, cols].repeat_interleave(rep,
                                                                                                           dim=1)
                m[..., rows] = m_new
            if t < n - 1:
                kb, vb = _pass(kb, group), _pass(vb, group)
        out = acc / l_sum[..., None]
        lse = m + torch.log(l_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.skip, ctx.mask, ctx.group = layout, skip, mask, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        L, e = q.shape[2], q.shape[3]
        layout = ctx.layout
        pos = [_positions(j, n, L, "contiguous" if layout == "local" else layout, q.device) for j in range(n)]
        q_pos = torch.arange(L, device=q.device) if layout == "local" else pos[rank]
        rep = q.shape[1] // k.shape[1]
        b, hkv = k.shape[0], k.shape[1]
        D = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        kb, vb = k, v
        dkb, dvb = torch.zeros_like(k), torch.zeros_like(v)
        for t in range(n):
            j = (rank - t) % n
            k_pos = pos[j]
            for rows, cols in _tiles(q_pos, k_pos, ctx.skip):
                c = cols.stop - cols.start
                qr, do = q[:, :, rows], dout[:, :, rows]
                p = torch.exp(_scores(qr, kb[:, :, cols], q_pos[rows], k_pos[cols], ctx.mask) - lse[..., rows, None])
                kk = kb[:, :, cols].repeat_interleave(rep, dim=1)
                vv = vb[:, :, cols].repeat_interleave(rep, dim=1)
                ds = p * (do @ vv.transpose(-1, -2) - D[:, :, rows])
                dq[:, :, rows] = dq[:, :, rows] + ds @ kk / math.sqrt(e)
                dk_h = ds.transpose(-1, -2) @ qr / math.sqrt(e)
                dv_h = p.transpose(-1, -2) @ do
                dkb[:, :, cols] = dkb[:, :, cols] + dk_h.reshape(b, hkv, rep, c, e).sum(2)
                dvb[:, :, cols] = dvb[:, :, cols] + dv_h.reshape(b, hkv, rep, c, e).sum(2)
            if t < n - 1:
                kb, vb = _pass(kb, group), _pass(vb, group)
            if n > 1:
                dkb, dvb = _pass(dkb, group), _pass(dvb, group)
        return dq, dkb, dvb, None, None, None, None


def _world(group):
    return group if group is not None else dist.group.WORLD


def ring_attention(q, k, v, causal_mask=None, group=None):
    """Causal ring attention on this rank's head-tail shard, fully masked blocks skipped (module doc), over the
    ranks of ``group`` (default: the world; the training step's cp group under
    ``examples.my_step:parallelize_own_ring``): certified."""
    return _Ring.apply(q, k, v, "head_tail", True, causal_mask or _own_mask, _world(group))


def ring_attention_local_mask(q, k, v, causal_mask=None, group=None):
    """The same ring with the causal mask on local positions (the shard's own indices): fails."""
    return _Ring.apply(q, k, v, "local", True, causal_mask or _own_mask, _world(group))


def ring_attention_uneven_skip(q, k, v, causal_mask=None):
    """Right values, uneven work: even ranks skip the fully masked blocks, odd ranks compute them all (at cp = 2,
    chunks of one token: 5 scores on rank 0, 8 on rank 1): fails ``balance`` only."""
    return _Ring.apply(q, k, v, "head_tail", dist.get_rank() % 2 == 0, causal_mask or _own_mask, dist.group.WORLD)


def ring_attention_contiguous(q, k, v, causal_mask=None):
    """The ring on contiguous shards (``--option load_balance=false``), fully masked blocks skipped: right values,
    rank r computes 4 r + 3 blocks, not 2 cp + 1: fails ``balance`` only."""
    return _Ring.apply(q, k, v, "contiguous", True, causal_mask or _own_mask, dist.group.WORLD)
