"""Context-parallel attention (numpy, float64): the sequence split over ``cp`` ranks.

Conventions
-----------
* A rank's shard of queries ``q`` is (s_local, num_heads, head_dim); keys ``k`` and values ``v`` are
  (s_local, num_kv_heads, head_dim). Query head ``h`` reads KV head ``h // (num_heads / num_kv_heads)``
  (grouped-query attention, the order of :mod:`distcheck.parallel.tp.heads`). Scores are scaled
  by ``1 / sqrt(head_dim)``.
* ``positions[r]`` holds the global positions of rank r's tokens, in the order of its shard. The causal
  mask compares global positions: query at position i reads key at position j iff j <= i.
* Load balancing (head-tail, "zig-zag"): the sequence is cut into ``2 cp`` equal chunks and rank r
  holds chunks r and 2 cp - 1 - r ("The Llama 3 Herd of Models", §3.3.2), so every rank's causal work
  is the same (:func:`causal_work`). :func:`contiguous_positions` is the unbalanced split.

Partial results (the online softmax, Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"; Dao 2023, "FlashAttention-2", Algorithm 1): a block of keys gives each query row a
:class:`Partial` ``(m, l, acc)``: its running max ``m``, ``l = sum_j exp(s_j - m)`` and
``acc = sum_j exp(s_j - m) v_j``; a row whose keys are all masked has ``m = -inf, l = 0, acc = 0``.
:func:`merge_partials` rescales both to their common max, ``m = max(m1, m2)``,
``l = l1 exp(m1 - m) + l2 exp(m2 - m)`` (and ``acc`` alike); :func:`finalize` returns
``out = acc / l`` and the log-sum-exp ``lse = m + log l``. The merge is commutative bit for bit (its
operations are), and exact, in any order and tree, when every partial has the same max and its
``l`` and ``acc`` are exact sums (``exp(0) = 1``); otherwise ``exp(m_i - m)`` rounds and the merge
is within the bound of :mod:`distcheck.parallel.cp.properties`.

The three variants (forward and backward; the backward by the explicit formulas of softmax
attention, ``dS = P * (dP - rowsum(dO * O))``, Dao 2023 Algorithm 2, checked against
:func:`full_attention_backward`, itself checked by finite differences in ``tests/test_cp.py``) live in
:mod:`distcheck.parallel.cp.variants`: the ring (Liu et al. 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context"), the all-gather of K and V (Llama 3, §3.3.2) and Ulysses
(Jacobs et al. 2023, "DeepSpeed Ulysses").

Full attention on the whole sequence is :func:`distcheck.parallel.tp.heads.attention_heads`, fed
``x = [q | k | v]`` and 0/1 selector projections (each product picks one entry and adds zeros:
exact), so the reference for context parallelism is tensor parallelism's single-device attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import MAX_RANKS, as_array, check_at_most, check_bool, check_positive_int

__all__ = ["Partial", "load_balanced_positions", "contiguous_positions", "shard", "causal_work", "blockwise_scores",
           "full_attention",
           "full_attention_backward", "block_partial", "scores_partial", "merge_partials", "finalize", "empty_partial",
           "check_qkv"]


def _check_cp(s: int, cp: int, chunks_per_rank: int) -> tuple[int, int]:
    s = check_positive_int("s", s)
    cp = check_positive_int("cp", cp)
    check_at_most("cp", cp, MAX_RANKS, "one list of positions is built per rank")
    if s % (chunks_per_rank * cp):
        raise ConfigError("s", s, f"must be divisible by {chunks_per_rank} cp = {chunks_per_rank * cp} "
                                  f"(every rank holds {chunks_per_rank} equal chunk(s))")
    return s, cp


def load_balanced_positions(s: int, cp: int) -> list[np.ndarray]:
    """Head-tail (zig-zag) split: rank r holds chunks r and 2 cp - 1 - r of the 2 cp equal chunks.

    ``load_balanced_positions(8, 2)`` -> ``[array([0, 1, 6, 7]), array([2, 3, 4, 5])]``. Raises
    ConfigError unless s and cp are integers >= 1 and 2 cp divides s (Llama 3, §3.3.2)."""
    s, cp = _check_cp(s, cp, 2)
    c = s // (2 * cp)
    return [np.concatenate([np.arange(r * c, (r + 1) * c), np.arange((2 * cp - 1 - r) * c, (2 * cp - r) * c)])
            for r in range(cp)]


def contiguous_positions(s: int, cp: int) -> list[np.ndarray]:
    """Rank r holds positions ``[r s / cp, (r + 1) s / cp)`` (unbalanced under a causal mask). Raises
    ConfigError unless cp divides s."""
    s, cp = _check_cp(s, cp, 1)
    n = s // cp
    return [np.arange(r * n, (r + 1) * n) for r in range(cp)]


def shard(x: ArrayLike, positions: Sequence[ArrayLike]) -> list[np.ndarray]:
    """Rows ``x[positions[r]]`` for each rank r (x is (s, ...))."""
    x = as_array("x", x)
    return [x[np.asarray(p, dtype=np.int64)] for p in positions]


def causal_work(positions: Sequence[ArrayLike]) -> list[int]:
    """Per rank: the (query, key) pairs its causal attention computes, ``sum_i (p_i + 1)`` over its
    positions (a query at position p reads the keys 0 .. p)."""
    return [int(np.sum(np.asarray(p, dtype=np.int64) + 1)) for p in positions]


def blockwise_scores(positions: Sequence[ArrayLike], block: int) -> list[int]:
    """Per rank: the scores blockwise attention computes with the fully masked blocks skipped. The sequence is
    cut into chunks of ``block`` positions; a rank computes the ``block x block`` scores of every (query chunk,
    key chunk) pair whose first key is at or before its last query (Liu et al. 2023, §3). Raises ConfigError
    unless ``block`` >= 1 and every rank's positions are whole chunks."""
    block = check_positive_int("block", block)
    out = []
    for r, p in enumerate(positions):
        chunks = np.asarray(p, dtype=np.int64).reshape(-1) // block
        mine, counts = np.unique(chunks, return_counts=True)
        if np.any(counts != block):
            raise ConfigError(f"positions[{r}]", np.asarray(p).tolist(), f"must be whole chunks of {block} positions")
        out.append(int(np.sum(mine + 1)) * block * block)
    return out


def check_qkv(q: ArrayLike, k: ArrayLike, v: ArrayLike,
              what: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The arrays as float64 and the GQA group ``num_heads / num_kv_heads``; ConfigError naming the
    array whose shape is wrong (q (s_q, H, e); k, v (s_k, Hkv, e); Hkv | H)."""
    q, k, v = as_array(f"q{what}", q), as_array(f"k{what}", k), as_array(f"v{what}", v)
    if q.ndim != 3 or k.ndim != 3 or q.shape[2] == 0 or q.shape[1] == 0:
        raise ConfigError(f"q{what}.shape", q.shape, "must be (s, num_heads, head_dim) with k (s, num_kv_heads, "
                                                     "head_dim)")
    if v.shape != k.shape or k.shape[2] != q.shape[2] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ConfigError(f"k{what}.shape", k.shape, f"must equal v's {v.shape}, share head_dim {q.shape[2]} with q, "
                                                     f"and have num_kv_heads dividing num_heads={q.shape[1]}")
    return q, k, v, q.shape[1] // k.shape[1]


def full_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, causal: bool = True) -> np.ndarray:
    """Attention on the whole sequence (positions 0 .. s-1), (s, H, e): tensor parallelism's
    single-device reference (:func:`distcheck.parallel.tp.heads.attention_heads`) on
    ``x = [q | k | v]`` with selector projections (module doc)."""
    from distcheck.parallel.tp.heads import attention_heads

    check_bool("causal", causal)
    q, k, v, _ = check_qkv(q, k, v)
    s, H, e = q.shape
    Hkv = k.shape[1]
    if k.shape[0] != s:
        raise ConfigError("k.shape", k.shape, f"must have the queries' sequence length {s}")
    x = np.concatenate([q.reshape(s, H * e), k.reshape(s, Hkv * e), v.reshape(s, Hkv * e)], axis=1)
    width = x.shape[1]
    eye = np.eye(width)
    Wq, Wk, Wv = eye[:, :H * e], eye[:, H * e:(H + Hkv) * e], eye[:, (H + Hkv) * e:]
    return attention_heads(x, Wq, Wk, Wv, H, Hkv, causal).reshape(s, H, e)


def _scores(q: np.ndarray, k: np.ndarray, q_pos: ArrayLike, k_pos: ArrayLike, causal: bool,
            group: int) -> np.ndarray:
    """(H, s_q, s_k) scaled scores, masked to -inf where a key follows the query (global positions)."""
    kk = np.repeat(k, group, axis=1)
    scores = np.einsum("qhe,khe->hqk", q, kk) / np.sqrt(q.shape[2])
    if causal:
        mask = np.asarray(k_pos)[None, :] > np.asarray(q_pos)[:, None]
        scores = np.where(mask[None], -np.inf, scores)
    return scores


def full_attention_backward(q: ArrayLike, k: ArrayLike, v: ArrayLike, dout: ArrayLike, causal: bool = True,
                            q_pos: ArrayLike | None = None,
                            k_pos: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of ``sum(out * dout)`` for attention of q over k, v (shapes as
    :func:`full_attention`; positions 0 .. s-1 unless given), by the explicit formulas:
    ``P = softmax(S)``, ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``,
    ``dQ = dS K / sqrt(e)``, ``dK = dS^T Q / sqrt(e)``; a KV head's gradient sums over its query group."""
    check_bool("causal", causal)
    q, k, v, group = check_qkv(q, k, v)
    dout = as_array("dout", dout)
    if dout.shape != q.shape:
        raise ConfigError("dout.shape", dout.shape, f"must equal q's shape {q.shape}")
    q_pos = np.arange(q.shape[0]) if q_pos is None else np.asarray(q_pos)
    k_pos = np.arange(k.shape[0]) if k_pos is None else np.asarray(k_pos)
    scores = _scores(q, k, q_pos, k_pos, causal, group)
    m = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - m)
    p = p / p.sum(axis=-1, keepdims=True)
    return _grads_from_p(q, k, v, dout, p, group)


def _grads_from_p(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, p: np.ndarray, group: int,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) from the probabilities ``p`` (H, s_q, s_k) of the rows' whole softmax; ``out`` the rows'
    attention output (computed from p when None: then p must hold every key of the rows)."""
    vv = np.repeat(v, group, axis=1)
    kk = np.repeat(k, group, axis=1)
    if out is None:
        out = np.einsum("hqk,khe->qhe", p, vv)
    D = np.einsum("qhe,qhe->hq", dout, out)[..., None]
    dp = np.einsum("qhe,khe->hqk", dout, vv)
    ds = p * (dp - D)
    scale = 1 / np.sqrt(q.shape[2])
    dq = np.einsum("hqk,khe->qhe", ds, kk) * scale
    dk_h = np.einsum("hqk,qhe->khe", ds, q) * scale
    dv_h = np.einsum("hqk,qhe->khe", p, dout)
    s_k, Hkv, e = k.shape
    return dq, dk_h.reshape(s_k, Hkv, group, e).sum(axis=2), dv_h.reshape(s_k, Hkv, group, e).sum(axis=2)


@dataclass(frozen=True)
class Partial:
    """One block's partial result for each query row (module doc): ``m`` and ``l`` (s_q, H), ``acc``
    (s_q, H, e)."""

    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the online softmax's name
    acc: np.ndarray


def empty_partial(s_q: int, H: int, e: int) -> Partial:
    """The partial of no keys: ``m = -inf``, ``l = 0``, ``acc = 0`` (the merge's identity)."""
    return Partial(np.full((s_q, H), -np.inf), np.zeros((s_q, H)), np.zeros((s_q, H, e)))


def block_partial(q: ArrayLike, k: ArrayLike, v: ArrayLike, q_pos: ArrayLike, k_pos: ArrayLike,
                  causal: bool = True) -> Partial:
    """The :class:`Partial` of queries ``q`` (positions ``q_pos``) over one block of keys and values
    (positions ``k_pos``): :func:`scores_partial` of the block's masked scores."""
    q, k, v, group = check_qkv(q, k, v)
    scores = _scores(q, k, q_pos, k_pos, causal, group)          # (H, s_q, s_k)
    return scores_partial(np.transpose(scores, (1, 0, 2)), np.repeat(v, group, axis=1))


def scores_partial(scores: ArrayLike, v: ArrayLike) -> Partial:
    """The :class:`Partial` of scores (s_q, H, n_k) (-inf where masked) over values (n_k, H, e): each row's
    max subtracted before ``exp``; a row with no finite score gives ``(-inf, 0, 0)``."""
    scores, v = np.asarray(scores, dtype=np.float64), as_array("v", v)  # -inf marks a masked score
    if np.isnan(scores).any() or np.isposinf(scores).any():
        raise ConfigError("scores", scores.tolist(), "must be finite or -inf (masked)")
    if scores.ndim != 3 or v.ndim != 3 or v.shape[:2] != (scores.shape[2], scores.shape[1]):
        raise ConfigError("v.shape", v.shape, f"must be (n_k, H, e) for scores (s_q, H, n_k) = {scores.shape}")
    m = scores.max(axis=-1) if scores.shape[-1] else np.full(scores.shape[:2], -np.inf)
    safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(scores - safe[..., None])                          # exp(-inf) = 0 for masked keys
    return Partial(m, p.sum(axis=-1), np.einsum("qhk,khe->qhe", p, v))


def _rescale(m_part: np.ndarray, m_new: np.ndarray) -> np.ndarray:
    """exp(m_part - m_new), 0 where the part saw no key (m_part = -inf)."""
    finite = np.isfinite(m_part)
    return np.where(finite, np.exp(np.where(finite, m_part - np.where(finite, m_new, 0.0), 0.0)), 0.0)


def merge_partials(a: Partial, b: Partial) -> Partial:
    """The online-softmax merge (module doc): both partials rescaled to ``max(a.m, b.m)`` and added.
    Commutative bit for bit; the identity is :func:`empty_partial`."""
    m = np.maximum(a.m, b.m)
    wa, wb = _rescale(a.m, m), _rescale(b.m, m)
    return Partial(m, a.l * wa + b.l * wb, a.acc * wa[..., None] + b.acc * wb[..., None])


def finalize(p: Partial) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)``: ``acc / l`` (s_q, H, e) and ``m + log l`` (s_q, H). A row with no key
    (``l = 0``) gives ``out = 0`` and ``lse = -inf``."""
    seen = p.l > 0
    out = np.where(seen[..., None], p.acc / np.where(seen, p.l, 1.0)[..., None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, p.m + np.log(np.where(seen, p.l, 1.0)), -np.inf)
    return out, lse
