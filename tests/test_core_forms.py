"""Every closed form of the catalogue agrees with its numpy reference (small exhaustive grids).

One table, :data:`CHECKS`, maps every catalogue name to a function that yields
``(inputs, reference value)`` pairs computed by the reference modules
(distcheck/<strategy>.py); the test evaluates the closed form on the same
inputs and requires exact equality (ints and Fractions, no tolerance).
:func:`test_every_form_has_a_reference_check` fails when a form is added to the
catalogue without a row here, so "every quantity has a closed form and they
agree" stays true. The properties suite (properties/) checks the same pairs at
scale with Hypothesis; this file is the fast, exhaustive-on-a-grid version.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import numpy as np
import pytest

from distcheck.closed_form import catalogue
from distcheck.core.vocab import Collective
from distcheck.parallel import activations, comm, dp, layout, memory, params, tp, zero
from distcheck.parallel import pp as pipeline
from distcheck.parallel import tp as attention

F = Fraction


# ----------------------------------------------------------------------------- dp


def _dp_problem(n):
    """Linear model whose MSE gradient entry i is exactly the weight of example i.

    X = I (n x n), w = 0, y = -1/2: the per-example squared-error gradient of
    example i is 2 e_i (x_i w - y_i) = e_i, so every combination of shard
    gradients has example i's weight in entry i. Object arrays of Fractions:
    exact arithmetic through the reference code paths.
    """
    X = np.eye(n, dtype=int).astype(object)
    return np.zeros(n, dtype=object), X, np.full(n, F(-1, 2), dtype=object)


def _dp_weights():
    for n, k in product(range(1, 9), range(1, 9)):
        if k > n:
            continue
        w, X, y = _dp_problem(n)
        sizes = dp.shard_sizes(n, k)
        owner = np.repeat(np.arange(k), sizes)
        plain = dp.data_parallel_grad(dp.mse_grad, w, X, y, k, weighting="plain")
        for i in range(n):
            yield "dp.plain_mean_weight", dict(dp=k, n_k=int(sizes[owner[i]])), plain[i]
        weighted = dp.data_parallel_grad(dp.mse_grad, w, X, y, k, weighting="examples")
        full = dp.mse_grad(w, X, y)
        assert list(weighted) == list(full)
        yield "dp.exact_weight", dict(n=n), full[0]
        sums = [dp.mse_grad_sum(w, Xk, yk)
                for Xk, yk in zip(dp.split_batch(X, sizes), dp.split_batch(y, sizes), strict=True)]
        bias = dp.plain_mean_bias(sums, sizes)
        for i in range(n):
            yield "dp.plain_mean_error_coefficient", dict(dp=k, n_k=int(sizes[owner[i]]), n=n), bias[i]
        for r in range(k):
            yield "dp.shard_size", dict(n=n, dp=k, rank=r), int(sizes[r])


def _accumulation_weights():
    for split in ([1], [3], [1, 2], [2, 1, 3], [4, 1], [1, 1, 1, 1]):
        n = sum(split)
        w, X, y = _dp_problem(n)
        owner = np.repeat(np.arange(len(split)), split)
        res = dp.accumulate_grads(dp.mse_grad_sum, w, X, y, split, normalize="examples")
        for i in range(n):
            yield "dp.accumulation_weight.normalized", dict(total=n), res.grad[i]
        res = dp.accumulate_grads(dp.mse_grad_sum, w, X, y, split, normalize="per_microbatch_mean")
        for i in range(n):
            yield "dp.accumulation_weight.per_microbatch_mean", dict(m=len(split), count=split[owner[i]]), res.grad[i]
    # tokens: 3 sequences of 3 tokens, one feature per token; weights of the valid tokens
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    Xt = np.eye(9, dtype=int).astype(object).reshape(3, 3, 9)
    yt = np.full((3, 3), F(-1, 2), dtype=object)
    wt = np.zeros(9, dtype=object)
    for split in ([3], [1, 2], [2, 1], [1, 1, 1]):
        tot = dp.accumulate_grads(dp.token_mse_grad_sum, wt, Xt, yt, split, normalize="tokens", mask=mask)
        per = dp.accumulate_grads(dp.token_mse_grad_sum, wt, Xt, yt, split, normalize="per_microbatch_mean", mask=mask)
        seq_mb = np.repeat(np.arange(len(split)), split)
        for j in np.flatnonzero(mask.reshape(-1)):
            yield "dp.accumulation_weight.normalized", dict(total=int(mask.sum())), tot.grad[j]
            c = per.counts[seq_mb[j // 3]]
            yield "dp.accumulation_weight.per_microbatch_mean", dict(m=len(split), count=c), per.grad[j]


# ----------------------------------------------------------------------------- tp / attention


def _tp_checks():
    rng = np.random.default_rng(0)
    for n, t in product(range(1, 9), range(1, 9)):
        if t > n:
            continue
        x = rng.integers(-3, 4, size=(2, n)).astype(float)
        W = rng.integers(-3, 4, size=(n, n)).astype(float)
        for r, part in enumerate(tp.column_parallel_parts(x, W, t)):
            yield "tp.column.output_cols_per_shard", dict(output_cols=n, tp=t, rank=r), part.shape[-1]
        for r, size in enumerate(tp.split_sizes(n, t)):
            yield "tp.row.input_rows_per_shard", dict(input_rows=n, tp=t, rank=r), size
    x, W = np.ones((2, 4)), np.ones((4, 6))
    log: list = []
    tp.row_parallel(x, W, 2, log=log)
    yield "tp.row.allreduce_count", {}, len(log)
    mlp_log: list = []
    tp.megatron_mlp(x, np.ones((4, 8)), np.ones((8, 4)), 4, log=mlp_log)
    yield "tp.mlp.allreduce_per_forward", {}, len(mlp_log)
    attn_log: list = []
    Wq, Wk, Wv, Wo = np.ones((4, 8)), np.ones((4, 4)), np.ones((4, 4)), np.ones((8, 4))
    attention.tp_attention(np.ones((3, 4)), Wq, Wk, Wv, Wo, 4, 2, 2, log=attn_log)
    yield "tp.attention.allreduce_per_forward", {}, len(attn_log)
    # per layer: the attention and MLP all-reduces of the forward, mirrored in the backward,
    # each a ring all-reduce of the b*s*h activation (Narayanan et al. 2021 §3.2)
    per_layer = 2 * (len(attn_log) + len(mlp_log))
    for s, b, h, t in product((1, 3), (1, 2), (4, 6), (1, 2, 3, 4)):
        elems = per_layer * comm.volume("all_reduce", s * b * h, t)
        yield "tp.comm_elements_per_layer", dict(s=s, b=b, h=h, t=t), elems
        yield "tp.comm_bytes_per_layer", dict(s=s, b=b, h=h, t=t), 2 * elems
        yield "tp.comm_bytes_per_layer", dict(s=s, b=b, h=h, t=t, bytes_per_element=4), 4 * elems


def _attention_checks():
    for heads, kv, t in product((1, 2, 4, 8, 12), (1, 2, 4), (1, 2, 4)):
        if heads % kv or heads % t or kv % t:
            continue
        q_heads, kv_heads = attention.tp_head_ranges(t, heads, kv)[0]
        yield "attention.heads_per_rank", dict(num_heads=heads, tp=t), len(q_heads)
        yield "attention.kv_heads_per_rank", dict(num_kv_heads=kv, tp=t), len(kv_heads)


# ----------------------------------------------------------------------------- pipeline


def _pipeline_checks():
    cases = [(s, p, m, 1, tf, tb) for s in ("gpipe", "1f1b") for p in (1, 2, 3, 4) for m in (1, 2, 3, 5, 8)
             for tf, tb in ((1, 2), (2, 3))]
    cases += [("interleaved", p, m, v, tf, tb) for p in (1, 2, 3) for v in (2, 3) for m in (p, 2 * p)
              for tf, tb in ((1, 2), (3, 1))]
    for sched, p, m, v, tf, tb in cases:
        tl = pipeline.simulate(sched, p, m, v, t_f=tf, t_b=tb)
        base = dict(p=p, m=m, t_f=tf, t_b=tb)
        inp = dict(base, v=v) if sched == "interleaved" else base
        assert len(set(tl.busy_ticks)) == 1 and len(set(tl.idle_ticks)) == 1  # every rank alike
        yield f"pp.step_ticks.{sched}", inp, tl.step_ticks
        yield "pp.busy_ticks", dict(base, v=v), tl.busy_ticks[0]
        yield f"pp.idle_ticks.{sched}", inp, tl.idle_ticks[0]
        yield f"pp.bubble_fraction.{sched}", inp, tl.bubble_fraction
        yield f"pp.bubble_ratio.{sched}", inp, tl.bubble_ratio
        yield f"pp.peak_in_flight.{sched}", inp, max(tl.peak_in_flight)


def _looped_bfs_checks():
    for p, m, v, tf, tb in product((1, 2, 3, 4), (1, 2, 3, 5, 8), (1, 2, 3), (1, 2), (2, 3)):
        tl = pipeline.simulate("looped_bfs", p, m, v, t_f=tf, t_b=tb)
        inp = dict(p=p, m=m, v=v, t_f=tf, t_b=tb)
        assert len(set(tl.idle_ticks)) == 1  # every rank alike
        yield "pp.step_ticks.looped_bfs", inp, tl.step_ticks
        yield "pp.idle_ticks.looped_bfs", inp, tl.idle_ticks[0]
        yield "pp.bubble_fraction.looped_bfs", inp, tl.bubble_fraction
        yield "pp.bubble_ratio.looped_bfs", inp, tl.bubble_ratio
        yield "pp.peak_in_flight.looped_bfs", inp, max(tl.peak_in_flight)


def _zero_bubble_checks():
    """The split-backward forms against the simulator (t_i, t_w: the two parts of the backward)."""
    sim = pipeline.simulate
    for p, m, f, i, w in ((4, 8, 1, 1, 1), (3, 9, 2, 1, 1), (5, 12, 1, 3, 2), (2, 4, 1, 1, 3), (4, 8, 3, 1, 2)):
        t1 = sim("1f1b", p, m, t_f=f, t_b=i + w)
        yield "pp.bubble_ticks.1f1b", dict(p=p, t_f=f, t_i=i, t_w=w), t1.idle_ticks[0]
        yield "pp.bubble_ticks.1f1b.b_input", dict(p=p, t_f=f, b=i, t_w=w), t1.idle_ticks[0]
        yield "pp.bubble_ticks.1f1b.b_full", dict(p=p, t_f=f, b=i + w, t_w=w), t1.idle_ticks[0]
        vals = dict(p=p, m=m, t_f=f, t_i=i, t_w=w)
        for s in ("zb_h1", "zb_h2"):
            t = sim(s, p, m, t_f=f, t_i=i, t_w=w)
            yield f"pp.bubble_ticks.{s}", vals, max(t.idle_ticks)
            yield f"pp.bubble_fraction.{s}", vals, t.bubble_fraction
            yield f"pp.bubble_ratio.{s}", vals, t.bubble_ratio
            yield f"pp.peak_in_flight.{s}", dict(p=p, m=m), max(t.peak_in_flight)
        h1, h2 = sim("zb_h1", p, m, t_f=f, t_i=i, t_w=w), sim("zb_h2", p, m, t_f=f, t_i=i, t_w=w)
        yield "pp.bubble_ticks.zb_h1.b_input", dict(p=p, t_f=f, b=i, t_w=w), max(h1.idle_ticks)
        yield "pp.bubble_ticks.zb_h1.b_full", dict(p=p, t_f=f, b=i + w, t_w=w), max(h1.idle_ticks)
        yield "pp.bubble_ticks.zb_h2.steady", vals, max(h2.window_idle_ticks)
        yield "pp.bubble_ratio.zb_h2.steady", vals, Fraction(max(h2.window_idle_ticks), h2.busy_ticks[0])
        yield "pp.bubble_ticks.zb_h2.steady.b_input", dict(p=p, t_f=f, b=i, t_w=w), max(h2.window_idle_ticks)
        yield "pp.bubble_ticks.zb_h2.steady.b_full", dict(p=p, t_f=f, b=i + w, t_w=w), max(h2.window_idle_ticks)
        if w <= min(f, i):  # the published forms' regime
            yield "pp.bubble_ticks.zb_h1.published", dict(p=p, t_f=f, t_i=i, t_w=w), max(h1.idle_ticks)
        if w <= f and 2 * w <= f + i:
            yield "pp.bubble_ticks.zb_h2.published", dict(p=p, t_f=f, t_i=i, t_w=w), max(h2.window_idle_ticks)
        for v in (1, 2, 3):
            if m % max(1, m // p) == 0:
                t = sim("interleaved_zb", p, m, v, t_f=f, t_i=i, t_w=w)
                iv = dict(vals, v=v)
                yield "pp.bubble_ticks.interleaved_zb", iv, max(t.idle_ticks)
                yield "pp.bubble_fraction.interleaved_zb", iv, t.bubble_fraction
                yield "pp.bubble_ratio.interleaved_zb", iv, t.bubble_ratio
                yield "pp.peak_in_flight.interleaved_zb", dict(p=p, m=m, v=v), max(t.peak_in_flight)
    for p, m, tt, fb in ((4, 8, 1, 3), (3, 8, 2, 5), (4, 10, 1, 2), (2, 4, 1, 3), (6, 12, 1, 3)):
        t = sim("zb_v", p, m, t_f=tt, t_i=tt, t_w=tt)
        yield "pp.bubble_ticks.zb_v", dict(p=p, m=m, t=tt), max(t.idle_ticks)
        yield "pp.bubble_ticks.zb_v.steady", dict(p=p, m=m, t=tt), max(t.window_idle_ticks)
        yield "pp.bubble_ratio.zb_v.steady", dict(p=p, m=m, t=tt), Fraction(max(t.window_idle_ticks),
                                                                                  t.busy_ticks[0])
        yield "pp.bubble_fraction.zb_v", dict(p=p, m=m, t=tt), t.bubble_fraction
        yield "pp.bubble_ratio.zb_v", dict(p=p, m=m, t=tt), t.bubble_ratio
        yield "pp.peak_in_flight.zb_v", dict(p=p, m=m), max(t.peak_in_flight)
        t = sim("dualpipev", p, m, t_f=tt, t_i=tt, t_w=tt, t_fb=fb)
        yield "pp.bubble_ticks.dualpipev", dict(p=p, m=m, t=tt, t_fb=fb), max(t.idle_ticks)
        yield "pp.bubble_ticks.dualpipe.published", dict(pp=2 * p, t_fb=fb, b=2 * tt, t_w=tt), max(t.idle_ticks)
        yield "pp.peak_in_flight.dualpipev", dict(p=p, m=m), max(t.peak_in_flight)
        forwards = int((t.order.kind == 0).sum())
        yield "pp.parameter_copies.dualpipev", dict(p=p), t.num_stages * m // forwards
        yield "pp.params_per_device.dualpipev", dict(p=p), t.num_stages // t.num_ranks
        t1 = sim("zb_h1", p, m)
        yield "pp.parameter_copies.zb_h1", dict(p=p), t1.num_stages * m // int((t1.order.kind == 0).sum())
        if fb == 3 * tt:
            yield "pp.bubble_fraction.dualpipev", dict(p=p, m=m), t.bubble_fraction
            yield "pp.bubble_ratio.dualpipev", dict(p=p, m=m), t.bubble_ratio
        if p % 2 == 0:
            t = sim("dualpipe", p, m, t_f=tt, t_i=tt, t_w=tt, t_fb=fb)
            yield "pp.bubble_ticks.dualpipe", dict(p=p, m=m, t=tt, t_fb=fb), max(t.idle_ticks)
            yield "pp.peak_in_flight.dualpipe", dict(p=p, m=m), max(t.peak_in_flight)
            forwards = int((t.order.kind == 0).sum())
            yield "pp.parameter_copies.dualpipe", dict(p=p), t.num_stages * m // forwards
            yield "pp.params_per_device.dualpipe", dict(p=p), t.num_stages // t.num_ranks
            if fb == 3 * tt:
                yield "pp.bubble_fraction.dualpipe", dict(p=p, m=m), t.bubble_fraction
                yield "pp.bubble_ratio.dualpipe", dict(p=p, m=m), t.bubble_ratio


# ----------------------------------------------------------------------------- memory / zero / activations


def _memory_checks():
    for name, conv in memory.CONVENTIONS.items():
        yield f"memory.bytes_per_param.{name}", {}, conv.total
    custom = memory.BytesPerParam(2, 4, 4, 1, 1)
    for P, t, p in product((1, 7, 13 * 10**9, 6_738_149_376), (1, 2, 8), (1, 3, 16)):
        yield "memory.train_state_bytes", dict(params=P, tp=t, pp=p), memory.train_state_bytes(P, tp=t, pp=p)
        yield "memory.train_state_bytes", dict(params=P, bytes_per_param=F(21, 2), tp=t, pp=p), \
            memory.train_state_bytes(P, F(21, 2), tp=t, pp=p)
        yield "memory.weights_bytes", dict(params=P, tp=t, pp=p), memory.weights_bytes(P, tp=t, pp=p)
        yield "memory.grads_bytes", dict(params=P, grad_bytes=4, tp=t, pp=p), memory.grads_bytes(P, custom, tp=t, pp=p)
        yield "memory.optimizer_bytes", dict(params=P, optimizer_bytes_per_param=6, tp=t, pp=p), \
            memory.optimizer_bytes(P, custom, tp=t, pp=p)
    GB = 10**9
    for P, budget in product((1, 10**9, 13 * 10**9, 68_975_329_280, 405 * 10**9), (1, 24 * GB, 80 * GB, 2**30)):
        t = memory.min_tp(P, budget, max_tp=2**50)
        yield "memory.min_tp_pow2", dict(params=P, budget_bytes=budget), t
        q = -(-16 * P // budget)
        if q <= 256:  # the form's constraint: q <= max_pp (pp = q with tp = 1 is always a candidate)
            tp_pp = memory.min_tp_pp(P, budget, max_pp=q)
            yield "memory.min_tp_pp_product", dict(params=P, budget_bytes=budget), tp_pp[0] * tp_pp[1]
    for total, gpu in product((1, 870 * GB, 1_103_605_268_480), (80 * GB, 80 * 2**30, 7)):
        yield "memory.min_gpus", dict(total_bytes=total, gpu_bytes=gpu), memory.min_gpus(total, gpu)


def _zero_checks():
    for P, n, k in product((64, 7_500_000_000, 6_738_415_616), (1, 2, 8, 64), (12, 4)):
        for stage in range(4):
            # dp divides every P here, so the flat partition has no padding
            yield f"zero.bytes_per_gpu.stage{stage}", dict(params=P, dp=n, k=k), \
                zero.model_state_bytes_per_gpu(P, n, stage, k=k)
    for P, n in product((1, 1000, 7_500_000_000), (1, 2, 64)):
        for stage, key in enumerate(("ddp", "stage1", "stage2", "stage3")):
            yield f"zero.comm_elements_per_rank.{key}", dict(params=P), zero.comm_elements_per_rank(P, n, stage)


def _activation_checks():
    for s, b, h, a, t in product((1, 4, 16), (1, 3), (8, 12), (1, 2, 4), (1, 2, 3)):
        for row in activations.TABLE2_SETTINGS:
            yield f"activations.bytes_per_layer.{row}", dict(s=s, b=b, h=h, a=a, t=t), \
                activations.table2_bytes_per_layer(row, s, b, h, a, t)
        for ffn in (h, 4 * h, 7):
            yield "activations.bytes_per_layer.megatron", dict(s=s, b=b, h=h, ffn=ffn, t=t), \
                activations.megatron_bytes_per_layer(s, b, h, ffn, t)


# ----------------------------------------------------------------------------- params / layout / comm


def _params_checks():
    flags = list(product((True, False), (True, False), ("rms", "layer", None), (True, False), (True, False),
                         (False, True), (True, False), (None, 5)))
    configs = list(params.PRESETS.values()) + [
        params.TransformerConfig(hidden_size=12, num_layers=3, ffn_hidden_size=20, num_heads=6, num_kv_heads=2,
                                 vocab_size=50, swiglu=sw, tied_embeddings=ti, norm=no, qkv_bias=qb,
                                 mlp_bias=mb, out_bias=ob, final_norm=fn, head_dim=hd)
        for sw, ti, no, qb, mb, ob, fn, hd in flags[::7]  # 55 of the 384 combinations; 7 is prime to every factor
    ]
    for cfg in configs:
        v = cfg.closed_form_inputs()
        comp = params.component_counts(cfg)
        pick = lambda *names, v=v: {k: v[k] for k in names}  # noqa: E731
        yield "params.decoder_only", v, params.count_params(cfg)
        yield "params.attention_per_layer", pick("hidden_size", "num_heads", "num_kv_heads", "head_dim", "qkv_bias",
                                                 "out_bias"), comp["attention"] // cfg.num_layers
        yield "params.mlp_per_layer", pick("hidden_size", "ffn_hidden_size", "swiglu", "mlp_bias"), \
            comp["mlp"] // cfg.num_layers
        yield "params.embedding", pick("vocab_size", "hidden_size"), comp["embedding"]
        yield "params.lm_head", pick("vocab_size", "hidden_size", "tied"), comp["lm_head"]
        yield ("params.norms", pick("hidden_size", "num_layers", "norm_weights", "norm_biases", "final_norm"),
               comp["norms"])


def _layout_checks():
    for t, c, p, d in product((1, 2, 4), (1, 2), (1, 3), (1, 2)):
        cfg = layout.ParallelConfig(tp=t, cp=c, pp=p, dp=d)
        yield "layout.world_size", dict(tp=t, cp=c, pp=p, dp=d), cfg.world_size
        for e in (1, 2):
            out = layout.ParallelConfig(tp=t, cp=c, pp=p, dp=d, ep=e, ep_placement="outside")
            yield "layout.world_size.ep_outside_dp", dict(tp=t, cp=c, pp=p, dp=d, ep=e), out.world_size
        for axis in ("tp", "cp", "pp", "dp"):
            yield "layout.num_groups", dict(world_size=cfg.world_size, degree=cfg.degree(axis)), \
                len(layout.groups(cfg, axis))
        yield "layout.weights_fraction_per_gpu", dict(tp=t, pp=p), cfg.weights_fraction_per_gpu
        # ~6 ranks per config (tests/test_layout.py checks all)
        for rank in range(0, cfg.world_size, max(1, cfg.world_size // 6)):
            co = layout.coords(cfg, rank)
            yield "layout.rank", dict(tp=t, cp=c, pp=p, **{f"{a}_index": co[a] for a in co}), \
                layout.rank_of(cfg, **co)
            yield "layout.coordinate.tp", dict(rank=rank, tp=t), co["tp"]
            yield "layout.coordinate.cp", dict(rank=rank, tp=t, cp=c), co["cp"]
            yield "layout.coordinate.pp", dict(rank=rank, tp=t, cp=c, pp=p), co["pp"]
            yield "layout.coordinate.dp", dict(rank=rank, tp=t, cp=c, pp=p), co["dp"]
    for t, g in product(range(1, 11), (1, 2, 4, 6, 8)):
        # whole nodes: world_size = lcm-sized multiple of gpus_per_node, tp innermost
        cfg = layout.ParallelConfig(tp=t, dp=g, gpus_per_node=g)
        yield "layout.tp_groups_node_local", dict(tp=t, gpus_per_node=g), int(layout.tp_groups_node_local(cfg))


def _comm_checks():
    for coll in comm.COLLECTIVES:
        for n, count in product((1, 2, 3, 4, 8), (0, 24, 48)):
            if coll == "broadcast" and n == 1:
                continue  # a one-rank broadcast sends nothing (form constraint n >= 2)
            res = comm.simulate(coll, 8 * count, n)
            ref = res.max_sent_bytes if count % n == 0 else None
            if ref is not None:
                yield f"comm.bytes_per_rank.{coll}", dict(size_bytes=8 * count, n=n), ref
    for length, n, slice_bytes in product((1, 5, 7, 8, 12), (1, 2, 3, 4, 8), (0, 4, 24)):
        # numpy's split, every shard zero-padded to the longest, concatenated: an equal-shard all-gather's output
        shards = np.array_split(np.ones((length, max(slice_bytes, 1)), dtype=np.uint8), n)
        longest = max(len(x) for x in shards)
        gathered = np.concatenate([np.pad(x, ((0, longest - len(x)), (0, 0))) for x in shards])
        yield ("comm.size_bytes.all_gather_padded", dict(length=length, n=n, slice_bytes=slice_bytes),
               len(gathered) * slice_bytes)


def _sp_checks():
    """Sequence parallelism: the collectives its reference logs per block, the bytes the simulated ring
    reduce-scatter then all-gather send per rank, and the activation bytes the stored-tensor reference saves."""
    from distcheck.parallel.activations.reference import bytes_per_layer
    from distcheck.parallel.sp import reference as sp

    for t, s in ((1, 2), (2, 4), (3, 3)):
        log: list = []
        x = np.tile([[1.0, -1.0]], (s, 1))
        sp.sp_mlp_block(sp.sequence_shards(x, t), np.ones(2), np.zeros(2), np.ones((2, t)), np.ones((t, 2)), log=log)
        yield "sp.block.all_gathers_per_forward", {}, sum(c == "all_gather" for c, _ in log)
        yield "sp.block.reduce_scatters_per_forward", {}, sum(c == "reduce_scatter" for c, _ in log)
    for t, count in product((1, 2, 3, 4, 8), (0, 24, 48)):
        if count % t == 0:
            sent = (comm.simulate("reduce_scatter", 8 * count, t).max_sent_bytes
                    + comm.simulate("all_gather", 8 * count, t).max_sent_bytes)
            yield "sp.block.bytes_per_rank", dict(size_bytes=8 * count, t=t), sent
    for s, b, h, t in product((1, 512), (1, 3), (4, 96), (1, 2, 3, 8)):
        with_sp = bytes_per_layer(s, b, h, 8, t, sequence_parallel=True)
        saved = Fraction(bytes_per_layer(s, b, h, 8, t)) - Fraction(with_sp)
        yield "sp.activations.bytes_saved_per_layer", dict(s=s, b=b, h=h, t=t), saved


def _cp_checks():
    """Context parallelism: the bytes each variant's reference logs per rank (the ring's passes, the simulated
    collectives), the shards and buffers it holds, the causal work of each rank's positions, and Ulysses' head
    shards."""
    from distcheck.parallel.cp import reference as cpr
    from distcheck.parallel.cp import variants as cpv

    rng = np.random.default_rng(0)
    for cp_, s, H, Hkv, e in product((1, 2, 4), (8, 16), (4, 8), (4,), (1, 3)):
        pos = cpr.load_balanced_positions(s, cp_)
        q, do = rng.normal(size=(s, H, e)), rng.normal(size=(s, H, e))
        k, v = rng.normal(size=(s, Hkv, e)), rng.normal(size=(s, Hkv, e))
        shards = [cpr.shard(a, pos) for a in (q, k, v, do)]
        shape = dict(s=s, b=1, num_heads=H, num_kv_heads=Hkv, head_dim=e, bytes_per_element=8, cp=cp_)
        kv_shape = {n: shape[n] for n in ("s", "b", "num_kv_heads", "head_dim", "bytes_per_element", "cp")}
        for variant, step in (("ring", cpv.ring_step), ("all_gather", cpv.all_gather_step),
                              ("ulysses", cpv.ulysses_step)):
            log: list = []
            grad_log: list = []
            outs, _ = step(*shards, pos, log=log, grad_log=grad_log)
            inputs = shape if variant == "ulysses" else kv_shape
            yield f"cp.{variant}.bytes_per_rank.forward", inputs, cpv.sent_bytes(log, cp_)
            if variant != "ring" or cp_ > 1:
                yield f"cp.{variant}.bytes_per_rank.backward", inputs, cpv.sent_bytes(grad_log, cp_)
            held = sum(int(np.prod(sh)) * 8 for _, sh in log)
            if variant == "ring" and cp_ > 1:  # the current K, V blocks and the pair arriving (one pass's)
                yield "cp.ring.buffer_bytes_per_rank", kv_shape, 2 * sum(int(np.prod(sh)) * 8 for _, sh in log[:2])
            elif variant == "all_gather":
                yield "cp.all_gather.buffer_bytes_per_rank", {n: shape[n] for n in kv_shape if n != "cp"}, held
            elif variant == "ulysses":
                yield "cp.ulysses.buffer_bytes_per_rank", shape, held
            stored = sum(a[0].nbytes for a in shards[:3]) + outs[0].nbytes
            yield "cp.activations.attention_bytes_per_rank", shape, stored
        heads = cpv.to_head_shards(shards[0], cp_)[0].shape[1]
        yield "cp.ulysses.heads_per_rank", dict(num_heads=H, cp=cp_), heads
        kv_heads = cpv.to_head_shards(shards[1], cp_)[0].shape[1]
        yield "cp.ulysses.kv_heads_per_rank", dict(num_kv_heads=Hkv, cp=cp_), kv_heads
    for s, cp_ in product((2, 8, 24, 96), (1, 2, 4)):
        if s % (2 * cp_) == 0:
            work = cpr.causal_work(cpr.load_balanced_positions(s, cp_))
            mean = Fraction(sum(work), cp_)
            yield "cp.causal_work.balanced", dict(s=s, cp=cp_), work[0]
            yield "cp.causal_work.imbalance.balanced", {}, max(work) / mean
            contiguous = cpr.causal_work(cpr.contiguous_positions(s, cp_))
            for r, w in enumerate(contiguous):
                yield "cp.causal_work.contiguous", dict(s=s, cp=cp_, rank=r), w
            yield "cp.causal_work.contiguous.max", dict(s=s, cp=cp_), max(contiguous)
            yield "cp.causal_work.imbalance.contiguous", dict(s=s, cp=cp_), max(contiguous) / mean
            block = s // (2 * cp_)
            for n in cpr.blockwise_scores(cpr.load_balanced_positions(s, cp_), block):
                yield "cp.scores_per_rank.balanced", dict(s=s, cp=cp_), n
            for r, n in enumerate(cpr.blockwise_scores(cpr.contiguous_positions(s, cp_), block)):
                yield "cp.scores_per_rank.contiguous", dict(s=s, cp=cp_, rank=r), n


def _bandwidth_checks():
    """nccl-tests' algorithm and bus bandwidth from the simulated collectives (what the busiest rank sends, over
    the time); ZeRO bytes per rank from distcheck.parallel.zero's enumeration with the ring factor; degrees derived from
    the world size by distcheck.parallel.layout.derive_degree."""
    from distcheck.parallel.layout import derive_degree

    for coll in comm.COLLECTIVES:
        for n, count, t in product((2, 3, 4, 8), (24, 48), (Fraction(1, 100), Fraction(3))):
            if count % n == 0:
                sent = comm.simulate(coll, 8 * count, n).max_sent_bytes
                yield f"comm.busbw.{coll}", dict(size_bytes=8 * count, time_s=t, n=n), Fraction(sent) / t
                if coll == "broadcast":  # a reduce is a broadcast run backwards: the chain moves S per rank
                    yield "comm.busbw.reduce", dict(size_bytes=8 * count, time_s=t, n=n), Fraction(sent) / t
                yield "comm.algbw", dict(size_bytes=8 * count, time_s=t), Fraction(8 * count) / t
    for k, stage in (("ddp", 0), ("stage1", 1), ("stage2", 2), ("stage3", 3)):
        for psi, n, b in product((1, 7, 64), (1, 2, 8), (2, 4)):
            yield (f"zero.comm_bytes_per_rank.{k}", dict(params=psi, n=n, bytes_per_element=b),
                   zero.comm_elements_per_rank(psi, n, stage, exact_ring=True) * b)
    for w, tp_, pp_, cp_, ep_ in product((64, 96), (1, 2, 4), (1, 2), (1, 2), (1, 2)):
        yield ("layout.dp_from_world_size", dict(world_size=w, tp=tp_, pp=pp_, cp=cp_, ep=ep_),
               derive_degree(w, tp=tp_, pp=pp_, cp=cp_))
        yield ("layout.dp_from_world_size.ep_outside_dp", dict(world_size=w, tp=tp_, pp=pp_, cp=cp_, ep=ep_),
               derive_degree(w, tp=tp_, pp=pp_, cp=cp_, ep=ep_))


def _vocab_checks():
    """The vocab-parallel references' collective logs: count and size of each all-reduce, and the bytes
    each rank sends by the simulated ring all-reduce (distcheck.parallel.comm)."""
    from distcheck.parallel.tp import vocab

    rng = np.random.default_rng(0)
    for b, s, h, t, bpe in product((1, 2), (1, 3), (1, 4), (1, 2, 4), (2, 4)):
        V = 4 * t
        log: list = []
        vocab.vocab_parallel_embedding(rng.integers(0, V, (b, s)), np.ones((V, h)), t, log=log)
        yield "tp.vocab_embedding.allreduce_per_forward", {}, len(log)
        yield "tp.vocab_embedding.allreduce_elements", dict(b=b, s=s, h=h), int(np.prod(log[0][1]))
        dtype = {2: np.int16, 4: np.int32}[bpe]
        elements = int(np.prod(log[0][1]))
        if elements % t == 0:  # the simulated ring sends equal chunks (the closed form's case)
            sent = comm.simulate("all_reduce", elements * bpe, t, dtype=dtype).max_sent_bytes
            yield "tp.vocab_embedding.bytes_per_rank", dict(b=b, s=s, h=h, t=t, bytes_per_element=bpe), sent * len(log)
        log = []
        vocab.vocab_parallel_cross_entropy(rng.normal(size=(b, s, V)), rng.integers(0, V, (b, s)), t, log=log)
        yield "tp.vocab_cross_entropy.allreduce_per_forward", {}, len(log)
        yield "tp.vocab_cross_entropy.allreduce_elements", dict(b=b, s=s), int(np.prod(log[0][1]))
        if (b * s) % t == 0:
            sent = sum(comm.simulate("all_reduce", int(np.prod(shape)) * bpe, t, dtype=dtype).max_sent_bytes
                       for _, shape in log)
            yield "tp.vocab_cross_entropy.bytes_per_rank", dict(b=b, s=s, t=t, bytes_per_element=bpe), sent


def _step_checks():
    """The training step: token weights from the reference's loss on one-hot losses, the copies of a
    parameter from its simulated shards, torch's clipping factor on exact inputs, and the bytes of
    simulated ring collectives (distcheck.parallel.step.reference)."""
    from distcheck.parallel.step import reference as step

    for dp_, m, seq in product((1, 2, 4), (1, 2, 3), (1, 2, 4)):
        masks = [[np.arange(seq) < 1 + (d + k) % seq for k in range(m)] for d in range(dp_)]
        total = step.token_count(masks)
        one = [[np.where(np.arange(seq) == 0, 1.0, 0.0) if (d, k) == (0, 0) else np.zeros(seq)
                for k in range(m)] for d in range(dp_)]
        yield "step.loss.token_weight", dict(tokens=total), F(step.token_mean_loss(one, masks)).limit_denominator(10**6)
        n0 = int(np.count_nonzero(masks[0][0]))
        yield "step.loss.mean_of_means_weight", dict(dp=dp_, m=m, n_k=n0), F(1, dp_ * m * n0)
    for dr, t, sharded in product((1, 2, 4), (1, 2, 4), (0, 1)):
        lay = step.StepLayout(dp_replicate=dr, tp=t)
        pl = step.Placement(tp_dim=0 if sharded else None)
        g = np.ones((4, 2))
        held = sum(int(np.sum(step.local_shard(g, pl, lay, r))) for r in range(lay.world_size))
        yield "step.grad_norm.copies", dict(dp_replicate=dr, tp=t, tp_sharded=sharded), held // g.size
    for norm, max_norm in product((0, 1, 2**-10, 3), (2**-6, 1, 4)):
        got = step.clip_scale(norm, max_norm)
        if got == 1.0:
            yield "step.clip.scale", dict(norm=norm, max_norm=max_norm), 1
    for p_, n, r, m in product((8, 16), (1, 2, 4), (1, 2), (1, 2)):
        lay = step.StepLayout(dp_replicate=r, dp_shard=n)
        yield ("step.comm_bytes_per_rank.dp", dict(params=p_, dp_shard=n, dp_replicate=r, m=m, bytes_per_element=1),
               step.step_comm_bytes(lay, params=p_, microbatches=m, bytes_per_element=1))
    for t, m, layers, size in product((1, 2, 4), (1, 2), (1, 3), (8, 16)):
        lay = step.StepLayout(tp=t)
        yield ("step.comm_bytes_per_rank.tp", dict(m=m, layers=layers, tp=t, size_bytes=size),
               step.step_comm_bytes(lay, params=0, microbatches=m, bytes_per_element=1, layers=layers,
                                    activation_bytes=size))


def _ep_checks():
    """Expert parallelism: the capacity the reference routes with, the bytes of the all-to-alls the
    expert-parallel layer logs (a rank keeps its own block, sends the rest), the parameters counted tensor by
    tensor, and one GPU's share of them."""
    from distcheck.parallel.ep import models as epm
    from distcheck.parallel.ep import reference as epr

    rng = np.random.default_rng(0)
    for ep_, E, k, cf, n in product((1, 2, 4), (4, 8), (1, 2), (0.5, 1.0, 1.25), (2, 3)):
        h = 2
        x, wg = rng.normal(size=(ep_ * n, h)), rng.normal(size=(h, E))
        w1, w2 = rng.normal(size=(E, h, 3)), rng.normal(size=(E, 3, h))
        log: list = []
        grad_log: list = []
        args = (np.split(x, ep_), wg, epr.expert_shards(w1, ep_), epr.expert_shards(w2, ep_))
        epr.ep_moe_layer(*args, k=k, capacity_factor=cf, log=log)
        epr.ep_moe_layer_backward(*args, np.split(x, ep_), k=k, capacity_factor=cf, log=grad_log)
        _, _, routing = epr.moe_layer(x, wg, w1, w2, k=k, capacity_factor=cf, groups=ep_)
        yield "ep.capacity", dict(tokens=n, num_experts=E, k=k, capacity_factor=F(cf)), routing.capacity
        shape = dict(num_experts=E, capacity=routing.capacity, h=h, bytes_per_element=8, ep=ep_)
        sent = [comm.simulate(c, int(np.prod(sh)) * 8, ep_).max_sent_bytes for c, sh in log + grad_log
                if c == Collective.ALL_TO_ALL]
        for name, got in zip(("dispatch.bytes_per_rank.forward", "combine.bytes_per_rank.forward",
                              "combine.bytes_per_rank.backward", "dispatch.bytes_per_rank.backward"), sent,
                             strict=True):
            yield f"ep.{name}", shape, got
    small = epm.MoEConfig(vocab_size=10, h=4, num_layers=3, dense_layers=1, dense_ffn=6, num_experts=4,
                          shared_experts=1, k=2, expert_ffn=2, attention_shapes=((4, 4), (4,)))
    for cfg in (epm.MIXTRAL_8X7B, epm.DEEPSEEK_V3, small, epm.MoEConfig(**{**small.__dict__, "tied": True,
                                                                           "mlp_matrices": 2})):
        total, active = epm.param_counts(cfg)
        yield "ep.params.total", cfg.closed_form_inputs(), total
        yield "ep.params.active", dict(cfg.closed_form_inputs(), k=cfg.k), active
    for tp_, ep_, bpp in product((1, 2), (1, 2, 4), (2, 16)):
        dense, expert = epm.params_per_gpu(small, tp=tp_, ep=ep_)
        full_dense, full_expert = epm.params_per_gpu(small)
        yield ("ep.memory.bytes_per_gpu", dict(dense_params=full_dense, expert_params=full_expert, tp=tp_, ep=ep_,
                                               bytes_per_parameter=bpp), (dense + expert) * bpp)
def _checkpoint_checks():
    """Checkpoints: the reference's bytes held per rank and written in total (its saved items' bytes for the
    model alone) under replicated, FSDP2 and tensor-parallel layouts, with and without Adam's state; a 70B
    model's mixed-precision Adam checkpoint counted per parameter (2 bytes of weights, 4 of each fp32 state)."""
    from distcheck.parallel import checkpoint as ck

    for shapes, n, b in product(([(4, 2)], [(8, 3), (8,)], [(6, 6), (12,), (2, 3)]), (1, 2), (2, 4, 8)):
        P, T = sum(int(np.prod(s)) for s in shapes), len(shapes)
        state = {f"t{i}": np.zeros(s, dtype={2: np.float16, 4: np.float32, 8: np.float64}[b])
                 for i, s in enumerate(shapes)}
        for kind in ck.LAYOUTS:
            dims = ck.layout_dims(kind, shapes)
            yield "checkpoint.bytes_total.model", dict(params=P, param_bytes=b), \
                ck.data_bytes(ck.save(state, dims, n))
            per, total = ck.checkpoint_bytes(shapes, dims, n, param_bytes=b, moment_bytes=4, step_bytes=4)
            yield "checkpoint.bytes_total.adam", dict(params=P, tensors=T, param_bytes=b), total
            name = "replicated" if kind == "replicated" else "sharded"
            extra = {} if kind == "replicated" else {"world_size": n}
            yield f"checkpoint.bytes_per_rank.{name}", dict(params=P, tensors=T, param_bytes=b, **extra), per[-1]
    for P in (1, 1000, 70_000_000_000):
        _, weights = ck.checkpoint_bytes([(P,)], [None], 1, param_bytes=2)
        _, state = ck.checkpoint_bytes([(P,)], [None], 1, param_bytes=4, moment_bytes=4)
        yield "checkpoint.bytes_total.mixed_adam", dict(params=P), weights + state
        yield "checkpoint.bytes_per_param.mixed_adam", {}, Fraction(weights + state, P)


def _time_checks():
    """Ring times from the simulated collectives: nccl-tests' bytes (the busiest rank's) over the bus bandwidth,
    plus NCCL's latencies (src/graph/tuning.cc) per collective and per simulated ring step, of which
    2(nodes-1) (all-reduce) or nodes-1 cross the network; a send is one step."""
    base, intra, inter = F(84, 10**7), F(34, 10**7), F(14, 10**6)
    for coll in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        for n, nodes, count, bw in product((2, 4, 8), (1, 2), (24, 48), (F(450 * 10**9), F(50 * 10**9))):
            if nodes > n:
                continue
            res = comm.simulate(coll, 8 * count, n)
            crossing = (2 if coll == Collective.ALL_REDUCE else 1) * (nodes - 1)
            expected = base + (res.steps - crossing) * intra + crossing * inter + F(res.max_sent_bytes) / bw
            yield f"comm.time_s.ring.{coll}", dict(size_bytes=8 * count, n=n, nodes=nodes, busbw=bw), expected
            yield (f"comm.time_s.ring.{coll}", dict(size_bytes=8 * count, n=n, nodes=nodes, busbw=bw, latency_base=0,
                                                      latency_intra=0, latency_inter=0), F(res.max_sent_bytes) / bw)
    for size, bw in product((0, 10**6, 3 * 10**8), (F(50 * 10**9), F(450 * 10**9))):
        yield "comm.time_s.send_recv", dict(size_bytes=size, bandwidth=bw), base + intra + F(size) / bw
        yield "comm.time_s.send_recv", dict(size_bytes=size, bandwidth=bw, latency_link=inter), base + inter + size / bw


def _flops_checks():
    """FLOPs counted matmul by matmul (distcheck.parallel.flops.reference) on small shapes, dense (MHA and GQA, SwiGLU
    or not, tied or not) and the GPT shape of the published per-iteration formulas; MFU and HFU from those."""
    from distcheck.parallel import flops
    from distcheck.parallel.params import TransformerConfig

    shapes = [TransformerConfig(hidden_size=h, num_layers=L, ffn_hidden_size=f, num_heads=a, num_kv_heads=kv,
                                vocab_size=V, swiglu=sw, tied_embeddings=tied)
              for h, L, f, a, kv, V, sw, tied in ((64, 2, 96, 4, 4, 50, True, False),
                                                   (96, 3, 384, 6, 2, 77, True, True),
                                                   (32, 1, 128, 2, 1, 10, False, False))]
    for cfg, s in product(shapes, (1, 16, 128)):
        layers, head = flops.matmul_params(cfg)
        shape = dict(num_layers=cfg.num_layers, seq_len=s, attention_width=cfg.num_heads * cfg.head_dim)
        model = flops.training_flops_per_token(cfg, s).model
        yield "flops.model_per_token", dict(params=layers + head, **shape), model
        for mode in ("selective", "full"):
            t = flops.training_flops_per_token(cfg, s, mode)
            extra = dict(layer_params=layers) if mode == "full" else {}
            yield f"flops.recompute_per_token.{mode}", dict(**extra, **shape), t.recompute
            yield f"flops.hardware_per_token.{mode}", dict(params=layers + head, **extra, **shape), t.hardware
            yield ("flops.hfu", dict(hardware_flops_per_token=t.hardware, tokens_per_second=1000, gpus=8,
                                     peak_flops=10**12), flops.hfu(t.hardware, 1000, 8, 10**12))
        for tps, gpus, peak in ((1000, 8, 10**12), (F(2383, 10), 3, F(989, 2) * 10**12)):
            yield ("flops.mfu", dict(flops_per_token=model, tokens_per_second=tps, gpus=gpus, peak_flops=peak),
                   flops.mfu(model, tps, gpus, peak))
            palm = dict(params=layers + head, num_layers=cfg.num_layers, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                        seq_len=s, tokens_per_second=tps, gpus=gpus, peak_flops=peak)
            yield "flops.mfu.palm", palm, flops.mfu(model, tps, gpus, peak)
            fwd = flops.forward_flops_per_token(cfg, s)
            no_core = 3 * (sum(fwd.values()) - fwd["scores"] - fwd["context"])
            yield "flops.mfu.palm", dict(palm, attention=0), flops.mfu(no_core, tps, gpus, peak)
            # the whole forward again, head included (PaLM's 2N): an HFU under full recomputation
            yield "flops.mfu.palm", dict(palm, recompute=1), flops.hfu(model + sum(fwd.values()), tps, gpus, peak)
            yield ("flops.mfu.palm", dict(palm, recompute=1, attention=0),
                   flops.hfu(no_core + sum(fwd.values()) - fwd["scores"] - fwd["context"], tps, gpus, peak))
            yield ("flops.achieved_per_gpu", dict(flops_per_token=model, tokens_per_second=tps, gpus=gpus),
                   flops.mfu(model, tps, gpus, peak) * peak)
            yield ("flops.utilization", dict(achieved_flops_per_gpu=F(model) * tps / gpus, peak_flops=peak),
                   flops.mfu(model, tps, gpus, peak))
            yield ("flops.gpu_hours", dict(tokens=10**9, flops_per_token=model, peak_flops=peak, mfu=F(2, 5)),
                   F(10**9 * model) / (peak * F(2, 5)) / 3600)
            yield ("flops.compute_time_s", dict(flops=model, peak_flops=peak, efficiency=F(3, 5)),
                   F(model) / (peak * F(3, 5)))
        for tokens, step in ((2048, F(1, 3)), (10**6, F(27, 10))):
            yield "flops.tokens_per_second", dict(tokens_per_step=tokens, step_time_s=step), tokens / step
    from distcheck.parallel import ep

    for moe, (heads, qk, v) in flops.MOE_ATTENTION.items():  # P the active matmul weights; W the mean head width
        layers, head = flops.moe_matmul_params(moe)
        for s in (1, 4096):
            yield ("flops.model_per_token", dict(params=layers + head, num_layers=moe.num_layers, seq_len=s,
                                                 attention_width=F(heads * (qk + v), 2)),
                   flops.moe_training_flops_per_token(moe, s).model)
    small = ep.MoEConfig(vocab_size=40, h=16, num_layers=3, dense_layers=1, dense_ffn=24, num_experts=4, k=2,
                         shared_experts=1, expert_ffn=8, attention_shapes=((16, 16), (16, 8), (16, 8), (16, 16)))
    layers, head = flops.moe_matmul_params(small)
    yield ("flops.recompute_per_token.full", dict(layer_params=layers, num_layers=3, seq_len=32, attention_width=16),
           flops.moe_training_flops_per_token(small, 32, "full", attention=(4, 4, 4)).recompute)
    for h, L, a, V, s, batch in product((32, 48), (1, 3), (2, 4), (10, 64), (16, 64), (1, 3)):
        gpt = TransformerConfig(hidden_size=h, num_layers=L, ffn_hidden_size=4 * h, num_heads=a, vocab_size=V,
                                swiglu=False, norm="layer")
        shape = dict(batch=batch, seq_len=s, num_layers=L, hidden_size=h, vocab_size=V)
        yield "flops.gpt_model_per_iteration", shape, batch * s * flops.training_flops_per_token(gpt, s).model
        yield "flops.megatron_per_iteration", shape, batch * s * flops.training_flops_per_token(gpt, s, "full").hardware


CHECKS = {
    "step": _step_checks,
    "bandwidth": _bandwidth_checks,
    "vocab": _vocab_checks,
    "dp": _dp_weights, "accumulation": _accumulation_weights, "tp": _tp_checks, "attention": _attention_checks,
    "pipeline": _pipeline_checks, "looped_bfs": _looped_bfs_checks, "zero_bubble": _zero_bubble_checks,
    "memory": _memory_checks, "zero": _zero_checks,
    "activations": _activation_checks, "params": _params_checks, "layout": _layout_checks, "comm": _comm_checks,
    "sp": _sp_checks,
    "cp": _cp_checks,
    "ep": _ep_checks,
    "checkpoint": _checkpoint_checks,
    "time": _time_checks,
    "flops": _flops_checks,
}


@pytest.mark.parametrize("family", sorted(CHECKS))
def test_forms_agree_with_references(family):
    forms = catalogue()
    n = 0
    for name, inputs, expected in CHECKS[family]():
        got = forms[name].evaluate(**inputs)
        assert got == expected, f"{name}{inputs}: closed form {got} != reference {expected}"
        n += 1
    assert n > 0


def test_every_form_has_a_reference_check():
    covered = {name for gen in CHECKS.values() for name, _, _ in gen()}
    missing = sorted(set(catalogue()) - covered)
    assert not missing, f"closed forms with no reference check in tests/test_core_forms.py: {missing}"
