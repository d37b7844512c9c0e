"""The context-parallel contract: a user's attention on sequence-sharded q, k and v.

Target: a function ``fn(q, k, v) -> out`` called on every rank of the world (cp = world size, the
default process group) with its shards in torch's layout: ``q`` (1, H, s/cp, e), ``k`` and ``v``
(1, Hkv, s/cp, e), requiring gradients; it returns the rank's output shard (1, H, s/cp, e). The
rank's tokens are those of :func:`distcheck.parallel.cp.reference.load_balanced_positions` (the head-tail
split into 2 cp chunks: rank r holds chunks r and 2 cp - 1 - r, in that order; "The Llama 3 Herd of
Models", §3.3.2), or contiguous with ``--option load_balance=false``. Attention is causal on the global
positions, scaled by 1/sqrt(e), query head h reading KV head h // (H / Hkv). cp divides H and Hkv in
every case, so a Ulysses implementation fits too.

Reference: full attention on the whole sequence in float64 (:func:`distcheck.parallel.cp.reference.
full_attention`, tensor parallelism's single-device attention) and its backward.

Properties (bounded): ``forward``, every rank's output shard; ``grads``, its dq, dk, dv after
``out.backward(dout)``; each held entrywise to the bound of :mod:`distcheck.parallel.cp.properties` for
the dtype's unit roundoff (2^-53, 2^-24), plus the float64 reference's own, times (1 + 2^-30) for the
bound's rounding. The bytes sent are not part of the contract (a target may rotate blocks by
send/recv, all-gather or all-to-all); the numpy properties ``cp.*.attention`` pin each variant's bytes
to the closed forms.

``balance`` (exact, counted): a target that takes a keyword ``causal_mask`` (``fn(q, k, v, causal_mask=None)``)
is handed the contract's counter: ``causal_mask(q_pos, k_pos)`` returns the causal mask of one score block (a
bool tensor (len(q_pos), len(k_pos)), True where the key comes after the query: fill those scores with -inf),
given the block's global query and key positions (int tensors), and counts the block's len(q_pos) len(k_pos)
scores, in the forward and in the backward apart. In each pass where any rank counts a block, every rank's
count equals the closed form ``cp.scores_per_rank.balanced`` = (2 cp + 1) (s / 2 cp)^2 within one block of
(s / 2 cp)^2 scores (the head-tail split with fully masked blocks skipped, Llama 3 §3.3.2; Liu et al. 2023's
blockwise attention), and its counted blocks cover every (query, key) pair of its queries that the causal mask
leaves visible (a block computed with a mask that is not the contract's is not counted, and a count that leaves
a pair out is refused). The plain contiguous split (``load_balance=false``) is a named convention that fails
``balance`` only: rank r computes 4 r + 3 blocks. A target without the keyword has ``balance`` recorded ``skip``
with that reason.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis.strategies import SearchStrategy

from distcheck.core.exactness import unit_roundoff
from distcheck.engine.contracts.checks import combine, compare
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import Target, check_call_shape, make_target, resolve
from distcheck.engine.world import RankContext
from distcheck.parallel.cp import strategies as ds

__all__ = ["CPCase", "ContextParallelAttention", "entry_bounds", "takes_causal_mask", "MASK_KEYWORD"]

#: the keyword a target takes to be handed the contract's counting causal mask
MASK_KEYWORD = "causal_mask"
_NO_COUNTER = (f"the target takes no {MASK_KEYWORD} keyword, so the score blocks it computes are not counted "
               f"(fn(q, k, v, {MASK_KEYWORD}=None) is handed the contract's counting mask; docs/CERTIFY.md)")


@dataclass(frozen=True)
class CPCase:
    """One example: the whole sequence's ``q``, ``dout`` (s, H, e), ``k``, ``v`` (s, Hkv, e) and ``cp``."""

    inner: ds.CPAttentionCase

    def __repr__(self) -> str:
        return repr(self.inner)


def entry_bounds(case: ds.CPAttentionCase, u: float) -> tuple[float, float, float, float]:
    """The bounds (output, dq, dk, dv) of :mod:`distcheck.parallel.cp.properties` at unit roundoff ``u``."""
    s, H, e = case.q.shape
    g = H // case.k.shape[1]
    mq, mk, mv, mdo = (float(np.abs(a).max(initial=0)) for a in (case.q, case.k, case.v, case.dout))

    def gam(k: int) -> float:
        return k * u / (1 - k * u)

    delta = gam(e + 2) * e * mq * mk / math.sqrt(e)
    R = 2 * e * mq * mk / math.sqrt(e)
    eps = 4 * (math.expm1(2 * delta + 4 * u * R) + gam(2 * s + 2 * e + 8 * case.cp + 16))
    root = math.sqrt(e)
    return (eps * mv, eps * 2 * e * mdo * mv * mk / root, eps * 2 * g * s * e * mdo * mv * mq / root,
            eps * g * s * mdo)


class ContextParallelAttention(Contract):
    """Attention on sequence-sharded q, k, v (see the module doc)."""

    name = "context-parallel-attention"
    parallelism = "cp"
    min_world_size = 2
    min_world_reason = ("one rank holds the whole sequence: no K/V block moves, so a skipped rotation, a missing "
                        "merge or a mask on local positions is the right answer there")
    summary = "causal attention on head-tail sequence shards: every rank's output and q, k, v gradients"
    dtypes = ("float64", "float32")
    properties = (
        PropertySpec("forward", "every rank's output shard equals full attention's rows at its positions, within "
                                "the derived bound", "bounded"),
        PropertySpec("grads", "every rank's dq, dk, dv equal full attention's gradients at its positions, within "
                              "the derived bound", "bounded"),
        PropertySpec("balance", "in each pass, every rank computes cp.scores_per_rank.balanced = (2 cp + 1) blocks "
                                "of (s / 2 cp)^2 scores within one block, counted by the contract's causal_mask, "
                                "covering every visible (query, key) pair of its queries", "exact"),
    )
    options = (Option("load_balance", True, bool, "the head-tail split into 2 cp chunks (false: contiguous shards)"),)

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        shown = ref or repr(obj)
        if not callable(obj) or isinstance(obj, type):
            raise ProtocolError("target", shown, f"must be a function fn(q, k, v) -> out for contract {self.name}")
        check_call_shape(obj, shown, "must take (q, k, v): the rank's shards, (1, heads, s/cp, head_dim)", nargs=3)
        return make_target(obj, ref, "function"), options

    def skipped(self, target: Any, options: dict) -> dict[str, str]:
        """``balance`` for a target that takes no ``causal_mask`` keyword (its blocks cannot be counted); torch's
        ``context_parallel`` where torch refuses the attention op (without a GPU, torch 2.13): every property, with
        torch's refusal as the reason (:func:`distcheck.parallel.cp.plans.cpu_refusal`)."""
        out = {} if takes_causal_mask(resolve(target)) else {"balance": _NO_COUNTER}
        if not (target.ref.endswith(":TORCH_CONTEXT_PARALLEL") or target.ref.endswith(":torch_context_parallel")):
            return out
        import torch

        from distcheck.parallel.cp.plans import cpu_refusal

        reason = cpu_refusal("cuda" if torch.cuda.is_available() else "cpu")
        return out if reason is None else {p.name: reason for p in self.properties}

    def cases(self, world_size: int, dtype: str, options: dict) -> SearchStrategy[CPCase]:
        balanced = bool(options["load_balance"])
        inner = ds.cp_attention_cases(min_cp=world_size, max_cp=world_size, max_chunk=2, max_kv_heads=2 * world_size,
                                      divisible_heads=True)
        return inner.map(lambda c: CPCase(ds.CPAttentionCase(q=c.q, k=c.k, v=c.v, dout=c.dout, cp=c.cp, causal=True,
                                                             balanced=balanced)))

    def run_rank(self, ctx: RankContext, target: Target, case: CPCase, dtype: str, options: dict) -> dict[str, Any]:
        import torch

        from distcheck.engine.contracts.layer import torch_dtype

        c = case.inner
        p = _positions(c)[ctx.rank]
        dt = torch_dtype(dtype)

        def local(a: np.ndarray, grad: bool = True) -> Any:
            t = torch.as_tensor(np.ascontiguousarray(np.transpose(a[p], (1, 0, 2))[None]), dtype=dt, device=ctx.device)
            return t.clone().requires_grad_(grad)

        q, k, v, dout = local(c.q), local(c.k), local(c.v), local(c.dout, False)
        fn = resolve(target)
        counter = _Counter(c.q.shape[0])
        out = fn(q, k, v, **{MASK_KEYWORD: counter}) if takes_causal_mask(fn) else fn(q, k, v)
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(dout.shape):
            raise AssertionError(f"{target.ref}: the output must be this rank's shard, shape {tuple(dout.shape)}; got "
                                 f"{getattr(out, 'shape', type(out).__name__)}")
        counter.phase = "backward"
        torch.autograd.backward(out, dout)

        def back(t: Any) -> np.ndarray | None:
            return None if t is None else np.transpose(t.detach().to(torch.float64).cpu().numpy()[0], (1, 0, 2))

        def kind(t: Any) -> str | None:
            return None if t is None else str(t.dtype).removeprefix("torch.")

        return {"out": back(out), "dq": back(q.grad), "dk": back(k.grad), "dv": back(v.grad),
                "dtypes": {"out": kind(out), "dq": kind(q.grad), "dk": kind(k.grad), "dv": kind(v.grad)},
                "scores": counter.counts, "covered": counter.covered}

    def check(self, case: CPCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        from distcheck.parallel.cp import reference as ref

        c = case.inner
        positions = _positions(c)
        full = ref.full_attention(c.q, c.k, c.v, True)
        grads = ref.full_attention_backward(c.q, c.k, c.v, c.dout, True)
        u = float(unit_roundoff(dtype))
        mine, own = entry_bounds(c, u), entry_bounds(c, float(unit_roundoff("float64")))
        widen = 1 + 2.0**-30
        bounds = [(a + b) * widen for a, b in zip(mine, own, strict=True)]

        def one(what: str, expected: np.ndarray, key: str, bound: float) -> Outcome:
            return compare(what, dtype, [expected[p] for p in positions], [r[key] for r in results],
                           [r["dtypes"][key] for r in results], [np.full(expected[p].shape, bound) for p in positions])

        return {"forward": one("output", full, "out", bounds[0]),
                "grads": combine(*(one(f"gradient {k}", g, k, b)
                                   for k, g, b in zip(("dq", "dk", "dv"), grads, bounds[1:], strict=True))),
                "balance": balance(c, positions, results)}


def _positions(c: ds.CPAttentionCase) -> list[np.ndarray]:
    from distcheck.parallel.cp import reference as ref

    s = c.q.shape[0]
    return ref.load_balanced_positions(s, c.cp) if c.balanced else ref.contiguous_positions(s, c.cp)


def takes_causal_mask(fn: Any) -> bool:
    """Whether ``fn`` takes the keyword :data:`MASK_KEYWORD` (it is then handed the contract's counting mask)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(MASK_KEYWORD)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


class _Counter:
    """The counting causal mask handed to a target (module doc): ``counts[phase]`` scores, ``covered[phase]`` an
    (s, s) bool array of the (query, key) pairs of the counted blocks."""

    def __init__(self, s: int) -> None:
        self.s, self.phase = s, "forward"
        self.counts = {"forward": 0, "backward": 0}
        self.covered = {"forward": np.zeros((s, s), dtype=bool), "backward": np.zeros((s, s), dtype=bool)}

    def __call__(self, q_pos: Any, k_pos: Any) -> Any:
        qp = np.asarray(q_pos.detach().cpu().numpy(), dtype=np.int64).reshape(-1)
        kp = np.asarray(k_pos.detach().cpu().numpy(), dtype=np.int64).reshape(-1)
        if (qp.size and (qp.min() < 0 or qp.max() >= self.s)) or (kp.size and (kp.min() < 0 or kp.max() >= self.s)):
            raise ValueError(f"{MASK_KEYWORD}: positions must be global positions in 0 .. {self.s - 1}; got queries "
                             f"{qp.tolist()}, keys {kp.tolist()}")
        self.counts[self.phase] += int(qp.size * kp.size)
        self.covered[self.phase][np.ix_(qp, kp)] = True
        return k_pos.reshape(-1)[None, :] > q_pos.reshape(-1)[:, None]


def balance(c: ds.CPAttentionCase, positions: list[np.ndarray], results: list) -> Outcome:
    """``balance`` (module doc): per pass, every rank's counted scores within one block of
    ``cp.scores_per_rank.balanced``, its counted blocks covering the visible pairs of its queries."""
    from distcheck.engine.catalogue import get

    s, cp = c.q.shape[0], c.cp
    want = int(get("cp.scores_per_rank.balanced").evaluate(s=s, cp=cp))
    block = (s // (2 * cp)) ** 2
    bad, ranks, passes = [], set(), 0
    for phase in ("forward", "backward"):
        counts = [r["scores"][phase] for r in results]
        if not any(counts):
            continue
        passes += 1
        for rank, (res, pos) in enumerate(zip(results, positions, strict=True)):
            n = counts[rank]
            visible = np.zeros((s, s), dtype=bool)
            visible[pos] = np.arange(s)[None, :] <= pos[:, None]
            missed = np.argwhere(visible & ~res["covered"][phase])
            if abs(n - want) > block:
                bad.append(f"{phase}: rank {rank} computes {n} scores ({n / block:g} blocks of {block})")
                ranks.add(rank)
            if len(missed):
                bad.append(f"{phase}: rank {rank}'s counted blocks leave out the visible (query, key) pairs "
                           f"{[tuple(int(x) for x in p) for p in missed[:4]]}{' ...' if len(missed) > 4 else ''} "
                           f"(a block masked without the contract's causal_mask, or with the wrong positions)")
                ranks.add(rank)
    if passes == 0:
        return Outcome(False, bound=float(block), message=f"the target takes {MASK_KEYWORD} but counted no score "
                                                          f"block in the forward or the backward")
    if not bad:
        return Outcome(True, max_error=0.0, bound=float(block))
    counts_text = "; ".join(f"{ph} {[r['scores'][ph] for r in results]}" for ph in ("forward", "backward"))
    return Outcome(False, bound=float(block), ranks=tuple(sorted(ranks)),
                   message=f"scores per rank ({counts_text}) differ from the balanced cp.scores_per_rank.balanced = "
                           f"(2 cp + 1) (s / 2 cp)^2 = {want} at s={s}, cp={cp} (within one block of {block}; "
                           f"Llama 3 §3.3.2 head-tail chunking, fully masked blocks skipped): " + "; ".join(bad))
