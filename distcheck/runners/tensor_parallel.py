"""Tensor parallelism on a real world: ``torch.distributed.tensor.parallel.parallelize_module``.

Rank function :func:`tp_rank`; driver :func:`run_tp_checks`. Two blocks:

* **MLP** ``down(relu(up(x)))``: ``up`` with ``ColwiseParallel``, ``down`` with
  ``RowwiseParallel`` (Megatron-LM's layout; the lesson's "Tensor parallelism").
* **Attention** (grouped-query when ``num_kv_heads < num_heads``): ``q_proj``,
  ``k_proj``, ``v_proj`` with ``ColwiseParallel`` (each rank gets whole heads:
  ``num_heads/tp`` query heads and ``num_kv_heads/tp`` key/value heads, and
  query head ``h`` still reads kv head ``h // (num_heads/num_kv_heads)``),
  ``o_proj`` with ``RowwiseParallel``. tp must divide num_kv_heads (and, for
  the MLP, ffn); the default examples (:func:`default_tp_examples`) are sized
  from the world so that it does at every world size, and an example that
  cannot shard at a world's tp gives ``skip`` rows naming the rule.

Properties (per block):

``tp.<block>.output`` and ``tp.<block>.grads``
    Output and parameter gradients (loss ``sum(out * g)`` with a fixed ``g``)
    equal the unsharded module's. MLP: inputs, weights and ``g`` are small
    integers / 8, so every sum is exact and the claim is **bitwise** (bound 0)
    when tp is a power of two. ``RowwiseParallel`` adds ``down``'s replicated
    bias to a ``Partial`` (sum) output by giving each rank ``b / tp``
    (``Partial._partition_value``), then all-reduces; ``b / tp`` is exact only
    for tp = 2**j, so for other tp (3, 5, 6, ...) the output is held to the
    same :func:`distcheck.tp.row_parallel_error_bound` as attention's, with
    ``a = relu(up(x))`` of the unsharded run (the bias term: one division, one
    addition and tp - 1 additions of partials, within the bound's k; the tp
    copies of ``|b|/tp`` add up to ``|b|``). Seen at tp = 3: 2**-54.
    The MLP gradients stay bitwise at every tp (``g`` is exact and no bias is
    divided in the backward).
    Attention: softmax leaves the dyadic grid; the per-head work is the same
    arithmetic sharded or not, so the heads' outputs ``a`` (the input of
    ``o_proj``) must be bitwise equal, and the output differs only by the
    order of ``o_proj``'s sum, which is split across ranks; it is held to
    :func:`distcheck.tp.row_parallel_error_bound` (Higham, Lemma 3.3:
    ``2 gamma_k (|a||W| + |b|)``, k = the longest summation path), elementwise.
    Attention gradients: ``dW = dY^T X`` and ``db = sum_tokens dY`` are sums
    over the ``n = b*s`` tokens that the sharded run may order differently
    (seen: the k/v bias gradients differ in the last bit, the weight gradients
    do not); each is held elementwise to ``2 gamma_n (|dY|^T |X|) / (1 -
    gamma_{n+2})`` (bias: ``|X| = 1``), with ``dY`` and ``X`` from the
    unsharded run.

``tp.<block>.allreduce_per_forward``
    The collectives of one forward, counted by
    :class:`~distcheck.runners.collectives.ByteCounter` (a per-thread dispatch
    mode that sees the same c10d/functional ops as ``CommDebugMode``) and, on
    process backends, cross-checked against ``CommDebugMode`` (its module
    tracker uses process-global hooks and fails with "Module hierarchy
    tracking is wrong" when ranks are threads): exactly
    ``tp.mlp.allreduce_per_forward`` (= 1) all-reduce for the MLP and
    ``tp.attention.allreduce_per_forward`` (= 1) for attention, and no other
    collective (the lesson; Shoeybi et al. 2019, section 3). At tp = 1 there is
    nothing to reduce and DTensor issues no collective, so 0 is expected there.

Plans can be mis-set on purpose (``plan="colwise_down"``: ``down`` made
column-parallel with a gathered input) to show the count check fails while the
output check still passes.

Runs on gloo, NCCL and threaded (DTensor on CPU is supported).
"""

from __future__ import annotations

from typing import Sequence

from distcheck.errors import ConfigError, check_choice, check_divides, check_positive_int
from distcheck.report import CheckResult
from distcheck.runners.collectives import iter_pools, result_row, run_guarded, skip_row

__all__ = ["BLOCKS", "PLANS", "tp_rank", "default_tp_examples", "tp_unmet_rule", "run_tp_checks"]

BLOCKS = ("mlp", "attention")
PLANS = ("megatron", "colwise_down")


def _modules():
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, d: int, ffn: int):
            super().__init__()
            self.up = nn.Linear(d, ffn, dtype=torch.float64)
            self.down = nn.Linear(ffn, d, dtype=torch.float64)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    class Attention(nn.Module):
        def __init__(self, d: int, num_heads: int, num_kv_heads: int, head_dim: int):
            super().__init__()
            self.head_dim = head_dim
            self.q_proj = nn.Linear(d, num_heads * head_dim, dtype=torch.float64)
            self.k_proj = nn.Linear(d, num_kv_heads * head_dim, dtype=torch.float64)
            self.v_proj = nn.Linear(d, num_kv_heads * head_dim, dtype=torch.float64)
            self.o_proj = nn.Linear(num_heads * head_dim, d, dtype=torch.float64)
            self.heads_out = None
            self.out_grads = None  # set to a dict to record d(loss)/d(projection output)

        def _proj(self, name: str, inp):
            y = getattr(self, name)(inp)
            if self.out_grads is not None:
                y.register_hook(lambda gy: self.out_grads.__setitem__(name, gy.detach()))
            return y

        def forward(self, x):
            b, s, _ = x.shape
            hd = self.head_dim
            q = self._proj("q_proj", x).view(b, s, -1, hd).transpose(1, 2)  # local heads when sharded
            k = self._proj("k_proj", x).view(b, s, -1, hd).transpose(1, 2)
            v = self._proj("v_proj", x).view(b, s, -1, hd).transpose(1, 2)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            att = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5, dim=-1)
            a = (att @ v).transpose(1, 2).reshape(b, s, -1)
            self.heads_out = a.detach()
            return self._proj("o_proj", a)

    return MLP, Attention


def _dyadic_(module, gen) -> None:
    import torch

    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randint(-4, 5, p.shape, generator=gen).double() / 8)


def tp_rank(ctx, example: dict) -> dict:
    """Rank function for the tensor-parallel properties of one block.

    ``example``: ``{"block": "mlp", "d": int, "ffn": int, "tokens": (b, s),
    "plan": "megatron"|"colwise_down", "seed": int}`` or ``{"block":
    "attention", "d", "num_heads", "num_kv_heads", "head_dim", "tokens",
    "seed"}``. The tp degree is the world size.

    Returns (plain Python): ``out_error`` (max |sharded - unsharded| of the
    output), ``out_excess`` (max of error - bound, <= 0 when within the
    bound), ``out_bound`` (largest elementwise bound; 0 where bitwise is
    claimed), ``grad_error`` (max over parameters), ``heads_equal``
    (attention only), ``counts`` (collective name -> count in one forward).
    """
    import numpy as np
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from distcheck import tp as tpref
    from distcheck.engine.collectives import ByteCounter

    block = check_choice("block", example["block"], BLOCKS)
    plan_name = check_choice("plan", example.get("plan", "megatron"), PLANS)
    tp = ctx.world_size
    MLP, Attention = _modules()
    gen = torch.Generator().manual_seed(int(example.get("seed", 0)))
    d = check_positive_int("d", example["d"])
    if block == "mlp":
        ffn = check_positive_int("ffn", example["ffn"])
        check_divides("tp", tp, "ffn", ffn)
        full, sharded = MLP(d, ffn), MLP(d, ffn)
        down = (RowwiseParallel() if plan_name == "megatron"
                else ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()))
        plan = {"up": ColwiseParallel(), "down": down}
    else:
        if plan_name != "megatron":
            raise ConfigError("plan", plan_name, "is only defined for block='mlp'")
        h, kvh, hd = (check_positive_int(k, example[k]) for k in ("num_heads", "num_kv_heads", "head_dim"))
        check_divides("num_kv_heads", kvh, "num_heads", h)
        check_divides("tp", tp, "num_kv_heads", kvh)
        full, sharded = Attention(d, h, kvh, hd), Attention(d, h, kvh, hd)
        plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
                "o_proj": RowwiseParallel()}
    _dyadic_(full, gen)
    sharded.load_state_dict(full.state_dict())
    full, sharded = full.to(ctx.device), sharded.to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (tp,), mesh_dim_names=("tp",))
    parallelize_module(sharded, mesh, plan)
    b, s = example.get("tokens", (2, 3))
    x = (torch.randint(-4, 5, (b, s, d), generator=gen).double() / 8).to(ctx.device)
    g = (torch.randint(-4, 5, (b, s, d), generator=gen).double() / 8).to(ctx.device)

    with ByteCounter() as counter:
        out = sharded(x)
    counts: dict[str, int] = {}
    for coll, _ in counter.records:
        counts[coll] = counts.get(coll, 0) + 1
    if ctx.backend != "threaded":
        # CommDebugMode's module tracker uses process-global module hooks, which
        # break when ranks are threads; on processes it must agree with ByteCounter
        with CommDebugMode() as comm, torch.no_grad():  # counting only: no autograd graph
            again = sharded(x)
        float(again.sum())  # wait for the async all-reduce: an unwaited collective warns at exit
        result_cdm = sum(int(v) for v in comm.get_comm_counts().values())
        if result_cdm != len(counter.records):
            counts["CommDebugMode_disagrees"] = result_cdm
    if block == "attention":
        full.out_grads = {}
    out_full = full(x)
    (out * g).sum().backward()
    (out_full * g).sum().backward()

    def dense(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    out_local = dense(out).detach()
    err = (out_local - out_full.detach()).abs()
    result = {"counts": counts, "out_error": float(err.max().item())}
    if block == "mlp":
        if tp & (tp - 1) == 0:  # tp = 2**j: b / tp is exact, every sum is exact
            bound = np.zeros(tuple(err.shape))
        else:  # b / tp rounds (Partial._partition_value): the row-parallel bound
            a = torch.relu(full.up(x)).detach().cpu().numpy().reshape(-1, full.down.in_features)
            W = full.down.weight.detach().cpu().numpy().T
            bound = tpref.row_parallel_error_bound(a, W, tp, full.down.bias.detach().cpu().numpy()).reshape(err.shape)
        result.update(out_bound=float(np.max(bound)), out_excess=float(np.max(err.cpu().numpy() - bound)),
                      heads_equal=True)
    else:
        a = full.heads_out.cpu().numpy().reshape(-1, full.o_proj.in_features)
        W = full.o_proj.weight.detach().cpu().numpy().T
        bias = full.o_proj.bias.detach().cpu().numpy()
        bound = tpref.row_parallel_error_bound(a, W, tp, bias).reshape(err.shape)
        excess = err.cpu().numpy() - bound
        per = full.o_proj.in_features // tp
        mine = full.heads_out[..., ctx.rank * per:(ctx.rank + 1) * per]
        result.update(out_bound=float(np.max(bound)), out_excess=float(np.max(excess)),
                      heads_equal=bool(torch.equal(sharded.heads_out, mine)))
    grad_error, grad_excess, grad_bound = 0.0, 0.0, 0.0
    for (name, p), q in zip(sharded.named_parameters(), full.parameters()):
        e = (dense(p.grad) - q.grad).abs()
        grad_error = max(grad_error, e.max().item())
        if block == "mlp":
            grad_excess = max(grad_excess, e.max().item())
            continue
        # dW = dY^T X and db = sum_tokens dY: sums over n = b*s tokens in any order;
        # each side is within gamma_n of the exact value (Higham, Lemma 3.3)
        proj, kind = name.rsplit(".", 1)
        dy = full.out_grads[proj].reshape(-1, q.shape[0]).abs()
        inp = (x if proj != "o_proj" else full.heads_out).reshape(-1, q.shape[-1] if kind == "weight" else 1).abs()
        n = dy.shape[0]
        mag = dy.T @ inp if kind == "weight" else dy.sum(0)
        bound = 2 * tpref.gamma(n) * mag / (1 - tpref.gamma(n + 2))
        grad_bound = max(grad_bound, bound.max().item())
        grad_excess = max(grad_excess, (e - bound).max().item())
    result.update(grad_error=float(grad_error), grad_excess=float(grad_excess), grad_bound=float(grad_bound))
    return result


def default_tp_examples(world_size: int = 4) -> list[dict]:
    """An MLP and a grouped-query attention block that shard at tp = ``world_size``.

    Sizes follow the world so that every tp divides them (the rules of
    :func:`tp_unmet_rule`): ``ffn = n * max(1, 8 // n)`` and
    ``num_kv_heads = n * max(1, 4 // n)``, ``num_heads = 2 * num_kv_heads``
    (two query heads per kv head, so the grouping is exercised at every n),
    ``head_dim`` 4 up to 4 kv heads and 2 beyond (keeps a 1,024-rank threaded
    world small: 2,048 query heads x 2). At n in 1, 2, 4 this is the fixed
    example of earlier versions: ffn 8; 8 query heads, 4 kv heads, head_dim 4.

    Raises ConfigError unless ``world_size`` is an int >= 1.
    """
    n = check_positive_int("world_size", world_size)
    kv_heads = n * max(1, 4 // n)
    return [
        {"block": "mlp", "d": 6, "ffn": n * max(1, 8 // n), "tokens": (2, 3), "plan": "megatron", "seed": 31},
        {"block": "attention", "d": 8, "num_heads": 2 * kv_heads, "num_kv_heads": kv_heads,
         "head_dim": 4 if kv_heads <= 4 else 2, "tokens": (2, 5), "seed": 32},
    ]


def tp_unmet_rule(example: dict, tp: int) -> str | None:
    """The world-size rule ``example`` breaks at tensor-parallel degree ``tp``, or None.

    ColwiseParallel splits ``up``'s outputs (MLP: ``ffn``) and whole key/value
    heads (attention: ``num_kv_heads``; the query heads follow) over tp ranks,
    so tp must divide them. Returned as ``"tp=8 must divide num_kv_heads=4"``;
    the driver turns it into a ``skip`` row (the example cannot run at this
    world size, which is not a defect of the layer). Other malformed fields are
    left to :func:`tp_rank`, which raises ConfigError.
    """
    field = "ffn" if example.get("block") == "mlp" else "num_kv_heads"
    size = example.get(field)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1 and size % tp:
        return f"tp={tp} must divide {field}={size}"
    return None


def _expected_allreduces(block: str) -> int:
    from distcheck.closed_form import get

    return int(get(f"tp.{block}.allreduce_per_forward").evaluate())


def run_tp_checks(pool_or_world_sizes=(2,), *, backend: str = "gloo", examples: Sequence[dict] | None = None,
                  timeout_s: float = 60.0) -> list[CheckResult]:
    """Three rows per block and world: output, grads, all-reduce count (see the module doc).

    ``examples`` default to :func:`default_tp_examples` at each world's size, so
    they shard at any tp. An example whose sizes tp does not divide
    (:func:`tp_unmet_rule`) gives three ``skip`` rows naming the rule, not FAILs.
    """
    rows: list[CheckResult] = []
    for pool, ws, be, skip in iter_pools(pool_or_world_sizes, backend, timeout_s):
        for ex in list(examples or default_tp_examples(ws)):
            block = ex["block"]
            tag = f"tp.{block}" + ("" if ex.get("plan", "megatron") == "megatron" else f"[{ex['plan']}]")
            names = [f"{tag}.output", f"{tag}.grads", f"{tag}.allreduce_per_forward"]
            reason = skip or tp_unmet_rule(ex, ws)
            if reason:
                rows += [skip_row(nm, be, ws, reason) for nm in names]
                continue
            results, err = run_guarded(pool, tp_rank, ex)
            if err:
                rows += [result_row(nm, be, ws, 1, False, detail=err) for nm in names]
                continue
            out_err = max(r["out_error"] for r in results)
            excess = max(r["out_excess"] for r in results)
            bound = max(r["out_bound"] for r in results)
            heads = all(r["heads_equal"] for r in results)
            out_ok = heads and excess <= 0.0  # bound 0 where bitwise is claimed
            rows.append(result_row(
                names[0], be, ws, 1, out_ok, max_error=out_err, bound=bound,
                detail=("bitwise equal to the unsharded MLP (exact dyadic data)" if block == "mlp" and bound == 0.0 else
                        f"tp={ws} is not a power of two, so DTensor's b/tp rounds: output within "
                        f"2*gamma_k(|a||W|+|b|) elementwise (largest bound {bound:.2e})" if block == "mlp" else
                        f"heads bitwise equal={heads}; output within 2*gamma_k(|a||W|+|b|) elementwise "
                        f"(largest bound {bound:.2e})") if out_ok else
                f"max error {out_err:.3e}, excess over bound {excess:.3e}, heads bitwise equal={heads}",
            ))
            g_err = max(r["grad_error"] for r in results)
            g_exc = max(r["grad_excess"] for r in results)
            g_bound = max(r["grad_bound"] for r in results)
            g_ok = g_exc <= 0.0
            rows.append(result_row(
                names[1], be, ws, 1, g_ok, max_error=g_err, bound=g_bound,
                detail=("parameter gradients bitwise equal" if block == "mlp" else
                        "parameter gradients within 2*gamma_n(|dY|^T|X|) elementwise, n = tokens") if g_ok
                else f"max gradient error {g_err:.3e}, excess over bound {g_exc:.3e}"))
            # a one-rank mesh has nothing to reduce: DTensor issues no collective (seen on NCCL, tp=1)
            want = _expected_allreduces(block) if ws > 1 else 0
            expected = {"all_reduce": want} if want else {}
            bad = [(r, res["counts"]) for r, res in enumerate(results) if res["counts"] != expected]
            rows.append(result_row(
                names[2], be, ws, 1, not bad, bound=0.0,
                detail=(f"forward collectives {results[0]['counts']} = closed form tp.{block}.allreduce_per_forward = {want}"
                        if ws > 1 else "tp=1: no collective in the forward, as expected (nothing to reduce)")
                if not bad else f"rank {bad[0][0]}: forward collectives {bad[0][1]}, expected {expected} (closed form; none at tp=1)",
            ))
    return rows
