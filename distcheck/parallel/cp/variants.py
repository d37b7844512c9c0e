"""The three context-parallel attentions, one rank at a time (numpy, float64; a topic of the
reference, :mod:`distcheck.parallel.cp.reference`, whose conventions hold here).

Every function takes the ranks' shards ``q_shards[r]`` (s/cp, H, e), ``k_shards[r]``, ``v_shards[r]``
(s/cp, Hkv, e) and their global ``positions[r]`` (any split: :func:`~distcheck.parallel.cp.reference.
load_balanced_positions` or contiguous), and appends what it communicates to ``log`` as
``(name, shape)``:

* **ring** (Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
  §3): step t = 0 .. cp-1, rank r attends its queries to the K/V block of rank (r - t) mod cp and merges
  the partial (:func:`~distcheck.parallel.cp.reference.merge_partials`, in step order); between steps
  every rank passes its block to rank r + 1: cp - 1 passes of K and of V, each logged
  ``(RING_PASS, block shape)`` (a point-to-point send/recv, not a collective: every rank sends one
  block). Backward: the K/V blocks go round again (cp - 1 passes) with their gradients' accumulators
  dK, dV travelling beside them and one more pass bringing them home (cp passes; none at cp = 1).
* **all-gather** ("The Llama 3 Herd of Models", §3.3.2): one all-gather of K and one of V (logged
  ``(Collective.ALL_GATHER, full shape)``, S the gathered tensor), then each rank's queries over the
  whole sequence; backward: each rank's dK, dV over the whole sequence, reduce-scattered back to the
  shards (``(Collective.REDUCE_SCATTER, full shape)``, the sum in rank order).
* **Ulysses** (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of
  Extreme Long Sequence Transformer Models", §3.1): all-to-alls of q, k and v from sequence shards to
  head shards (rank r: query heads ``[r H/cp, (r+1) H/cp)`` and KV heads ``[r Hkv/cp, (r+1) Hkv/cp)``,
  the grouping of :mod:`distcheck.parallel.tp.heads`), attention on the whole sequence, and an
  all-to-all of the output back (``(Collective.ALL_TO_ALL, one rank's buffer shape)``); backward: the
  output gradient's all-to-all and those of dq, dk, dv back. cp must divide H and Hkv
  (:func:`check_ulysses`, ConfigError otherwise).

The backward functions take the forward's saved activations as given (their forward is recomputed
without logging), and return ``(dq_shards, dk_shards, dv_shards)``. ``*_step`` runs both, the forward
into ``log`` and the backward into ``grad_log``: the implementation slot of the properties.
:func:`sent_bytes` turns a log into bytes per rank with the simulated collectives of
:mod:`distcheck.parallel.comm.reference` (nccl-tests' conventions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_bool, check_divides, check_positive_int, check_type
from distcheck.core.vocab import Collective, ContextParallel, PointToPoint, names
from distcheck.parallel.cp import reference as ref

__all__ = ["RING_PASS", "VARIANTS", "check_ulysses", "check_shards", "ring_attention", "ring_attention_backward",
           "all_gather_attention", "all_gather_attention_backward", "ulysses_attention", "ulysses_attention_backward",
           "ring_step", "all_gather_step", "ulysses_step", "sent_bytes", "to_head_shards"]

#: the log name of one ring pass: every rank sends one block to the next (torch.distributed's send/recv)
RING_PASS = PointToPoint.SEND_RECV
#: the three ways of splitting attention over cp ranks: K/V rotated, K/V all-gathered, heads all-to-all
VARIANTS = names(ContextParallel)

#: per-rank inputs: one array (or nested list) per rank
Arrays = Sequence[ArrayLike]
#: a communication log: ``(name, shape)`` per record, appended in order
Log = list[tuple[str, tuple[int, ...]]]
#: the outputs and ``(dq, dk, dv)`` shards of a variant's step
Step = tuple[list[np.ndarray], tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]]
_Grads = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]
_Checked = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray] | None]
_CheckedGrads = tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]


@overload
def check_shards(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays, positions: Arrays, dout_shards: Arrays,
                 log: Log | None = None) -> _CheckedGrads: ...


@overload
def check_shards(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays, positions: Arrays, dout_shards: None = None,
                 log: Log | None = None) -> _Checked: ...


def check_shards(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                 positions: Arrays, dout_shards: Arrays | None = None,
                 log: Log | None = None) -> _Checked:
    """The shards as float64 lists and the positions as int arrays; ConfigError naming the first bad one
    (one entry per rank, equal shard lengths, positions a permutation of 0 .. s-1)."""
    if log is not None:
        check_type("log", log, list, "must be a list (communication is appended to it) or None")
    n = len(q_shards)
    check_positive_int("cp", n)
    for name, xs in (("k_shards", k_shards), ("v_shards", v_shards), ("positions", positions)):
        if len(xs) != n:
            raise ConfigError(f"len({name})", len(xs), f"must equal len(q_shards)={n} (one entry per rank)")
    qs: list[np.ndarray] = []
    ks: list[np.ndarray] = []
    vs: list[np.ndarray] = []
    for r in range(n):
        q, k, v, _ = ref.check_qkv(q_shards[r], k_shards[r], v_shards[r], f"_shards[{r}]")
        if k.shape[0] != q.shape[0] or (qs and (q.shape != qs[0].shape or k.shape != ks[0].shape)):
            raise ConfigError(f"q_shards[{r}].shape", q.shape, "must match every rank's q and this rank's k, v lengths")
        qs.append(q)
        ks.append(k)
        vs.append(v)
    pos = [np.asarray(p, dtype=np.int64).reshape(-1) for p in positions]
    s = sum(len(p) for p in pos)
    if any(len(p) != q.shape[0] for p, q in zip(pos, qs, strict=True)) or \
            sorted(np.concatenate(pos).tolist()) != list(range(s)):
        raise ConfigError("positions", [p.tolist() for p in pos],
                          "must give each rank's tokens their global positions, a permutation of 0 .. s-1 in all")
    douts = None
    if dout_shards is not None:
        douts = [np.asarray(d, dtype=np.float64) for d in dout_shards]
        if len(douts) != n or any(d.shape != q.shape for d, q in zip(douts, qs, strict=True)):
            raise ConfigError("dout_shards", [d.shape for d in douts], "must have one shard per rank, shaped as q's")
    return qs, ks, vs, pos, douts


def _log(log: Log | None, name: str, shape: tuple[int, ...]) -> None:
    if log is not None:
        log.append((name, tuple(int(d) for d in shape)))


# ---------------------------------------------------------------- ring

def ring_attention(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                   positions: Arrays, *, causal: bool = True, log: Log | None = None) -> list[np.ndarray]:
    """Ring attention's outputs, one (s/cp, H, e) shard per rank (module doc)."""
    return [o for o, _ in _ring_forward(q_shards, k_shards, v_shards, positions, causal, log)]


def _ring_forward(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                  positions: Arrays, causal: bool, log: Log | None,
                  steps: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    check_bool("causal", causal)
    qs, ks, vs, pos, _ = check_shards(q_shards, k_shards, v_shards, positions, log=log)
    cp = len(qs)
    acc = [ref.empty_partial(q.shape[0], q.shape[1], q.shape[2]) for q in qs]
    for t in range(cp if steps is None else steps):
        for r in range(cp):
            j = (r - t) % cp
            acc[r] = ref.merge_partials(acc[r], ref.block_partial(qs[r], ks[j], vs[j], pos[r], pos[j], causal))
        if t < cp - 1:
            _log(log, RING_PASS, ks[0].shape)
            _log(log, RING_PASS, vs[0].shape)
    return [ref.finalize(a) for a in acc]


def ring_attention_backward(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                            dout_shards: Arrays, positions: Arrays, *, causal: bool = True,
                            log: Log | None = None) -> _Grads:
    """Ring attention's ``(dq, dk, dv)`` shards: each step's block gradients from the rows' global
    softmax (the forward's ``lse``), dK and dV accumulated while they travel (module doc)."""
    fwd = _ring_forward(q_shards, k_shards, v_shards, positions, causal, None)
    qs, ks, vs, pos, douts = check_shards(q_shards, k_shards, v_shards, positions, dout_shards, log)
    cp = len(qs)
    dq = [np.zeros_like(q) for q in qs]
    dk = [np.zeros_like(k) for k in ks]    # dk[j]: the accumulator travelling with block j
    dv = [np.zeros_like(v) for v in vs]
    for t in range(cp):
        for r in range(cp):
            j = (r - t) % cp
            a, b, c = _block_grads(qs[r], ks[j], vs[j], douts[r], fwd[r], pos[r], pos[j], causal)
            dq[r] += a
            dk[j] += b
            dv[j] += c
        if t < cp - 1:
            _log(log, RING_PASS, ks[0].shape)
            _log(log, RING_PASS, vs[0].shape)
        if cp > 1:
            _log(log, RING_PASS, ks[0].shape)
            _log(log, RING_PASS, vs[0].shape)
    return dq, dk, dv


def _block_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, fwd: tuple[np.ndarray, np.ndarray],
                 q_pos: np.ndarray, k_pos: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block's contribution to (dq, dk, dv), its probabilities ``exp(S - lse)`` from the rows' global
    log-sum-exp."""
    out, lse = fwd
    group = q.shape[1] // k.shape[1]
    scores = ref._scores(q, k, q_pos, k_pos, causal, group)
    safe = np.where(np.isfinite(lse), lse, 0.0).T[..., None]
    p = np.exp(scores - safe)
    return ref._grads_from_p(q, k, v, dout, p, group, out=out)


# ---------------------------------------------------------------- all-gather of K and V

def all_gather_attention(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                         positions: Arrays, *, causal: bool = True,
                         log: Log | None = None) -> list[np.ndarray]:
    """Outputs with K and V all-gathered (Llama 3, §3.3.2): each rank's queries over the whole sequence."""
    check_bool("causal", causal)
    qs, ks, vs, pos, _ = check_shards(q_shards, k_shards, v_shards, positions, log=log)
    k_all, v_all, p_all = np.concatenate(ks), np.concatenate(vs), np.concatenate(pos)
    _log(log, Collective.ALL_GATHER, k_all.shape)
    _log(log, Collective.ALL_GATHER, v_all.shape)
    return [ref.finalize(ref.block_partial(q, k_all, v_all, p, p_all, causal))[0] for q, p in zip(qs, pos, strict=True)]


def all_gather_attention_backward(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                                  dout_shards: Arrays, positions: Arrays, *,
                                  causal: bool = True, log: Log | None = None) -> _Grads:
    """``(dq, dk, dv)``: each rank's gradients over the gathered K, V, and dK, dV reduce-scattered (the sum in
    rank order) back to the sequence shards."""
    qs, ks, vs, pos, douts = check_shards(q_shards, k_shards, v_shards, positions, dout_shards, log)
    k_all, v_all, p_all = np.concatenate(ks), np.concatenate(vs), np.concatenate(pos)
    dq, dk_parts, dv_parts = [], [], []
    for q, d, p in zip(qs, douts, pos, strict=True):
        fwd = ref.finalize(ref.block_partial(q, k_all, v_all, p, p_all, causal))
        a, b, c = _block_grads(q, k_all, v_all, d, fwd, p, p_all, causal)
        dq.append(a)
        dk_parts.append(b)
        dv_parts.append(c)
    bounds = np.cumsum([0] + [len(k) for k in ks])
    out = []
    for parts in (dk_parts, dv_parts):
        total = parts[0]
        for x in parts[1:]:
            total = total + x
        _log(log, Collective.REDUCE_SCATTER, total.shape)
        out.append([total[bounds[r]:bounds[r + 1]] for r in range(len(ks))])
    return dq, out[0], out[1]


# ---------------------------------------------------------------- Ulysses

def check_ulysses(cp: int, num_heads: int, num_kv_heads: int) -> None:
    """Ulysses' constraint: cp divides num_heads and num_kv_heads (Jacobs et al. 2023, §3.1: each rank
    takes whole heads); ConfigError, e.g. "cp=3 must divide num_heads=4", otherwise."""
    check_divides("cp", cp, "num_heads", num_heads)
    check_divides("cp", cp, "num_kv_heads", num_kv_heads)


def to_head_shards(shards: Sequence[np.ndarray], cp: int, log: Log | None = None) -> list[np.ndarray]:
    """All-to-all: sequence shards (s/cp, X, e) -> head shards (s, X/cp, e), the sequence in rank order."""
    _log(log, Collective.ALL_TO_ALL, shards[0].shape)
    full = np.concatenate(shards)
    n = full.shape[1] // cp
    return [full[:, r * n:(r + 1) * n] for r in range(cp)]


def _to_sequence(heads: Sequence[np.ndarray], lengths: Sequence[int], log: Log | None) -> list[np.ndarray]:
    """All-to-all back: head shards (s, X/cp, e) -> sequence shards (s/cp, X, e)."""
    full = np.concatenate(heads, axis=1)
    bounds = np.cumsum([0] + list(lengths))
    out = [full[bounds[r]:bounds[r + 1]] for r in range(len(lengths))]
    _log(log, Collective.ALL_TO_ALL, out[0].shape)
    return out


def ulysses_attention(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                      positions: Arrays, *, causal: bool = True,
                      log: Log | None = None) -> list[np.ndarray]:
    """Outputs of Ulysses attention (module doc). Raises ConfigError unless cp divides both head counts."""
    check_bool("causal", causal)
    qs, ks, vs, pos, _ = check_shards(q_shards, k_shards, v_shards, positions, log=log)
    cp = len(qs)
    check_ulysses(cp, qs[0].shape[1], ks[0].shape[1])
    p_all = np.concatenate(pos)
    qh, kh, vh = to_head_shards(qs, cp, log), to_head_shards(ks, cp, log), to_head_shards(vs, cp, log)
    outs = [ref.finalize(ref.block_partial(q, k, v, p_all, p_all, causal))[0]
            for q, k, v in zip(qh, kh, vh, strict=True)]
    return _to_sequence(outs, [len(q) for q in qs], log)


def ulysses_attention_backward(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                               dout_shards: Arrays, positions: Arrays, *,
                               causal: bool = True, log: Log | None = None) -> _Grads:
    """``(dq, dk, dv)`` of Ulysses attention: the output gradient to head shards, each head's gradients on the
    whole sequence, and dq, dk, dv back to sequence shards (4 all-to-alls)."""
    qs, ks, vs, pos, douts = check_shards(q_shards, k_shards, v_shards, positions, dout_shards, log)
    cp = len(qs)
    check_ulysses(cp, qs[0].shape[1], ks[0].shape[1])
    p_all = np.concatenate(pos)
    qh, kh, vh = (to_head_shards(x, cp) for x in (qs, ks, vs))  # the forward's saved activations: not sent again
    dh = to_head_shards(douts, cp, log)
    grads = [full_grads(q, k, v, d, p_all, causal) for q, k, v, d in zip(qh, kh, vh, dh, strict=True)]
    lengths = [len(q) for q in qs]
    dq, dk, dv = (_to_sequence([g[i] for g in grads], lengths, log) for i in range(3))
    return dq, dk, dv


def full_grads(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, p_all: np.ndarray,
               causal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) of attention on one rank's whole sequence in the order ``p_all``."""
    return ref.full_attention_backward(q, k, v, dout, causal, q_pos=p_all, k_pos=p_all)


# ---------------------------------------------------------------- steps and bytes

def ring_step(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
              dout_shards: Arrays, positions: Arrays, *, causal: bool = True,
              log: Log | None = None, grad_log: Log | None = None) -> Step:
    """Ring attention's forward (into ``log``) and backward (into ``grad_log``): ``(outs, (dq, dk, dv))``."""
    outs = ring_attention(q_shards, k_shards, v_shards, positions, causal=causal, log=log)
    return outs, ring_attention_backward(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal,
                                         log=grad_log)


def all_gather_step(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                    dout_shards: Arrays, positions: Arrays, *, causal: bool = True,
                    log: Log | None = None, grad_log: Log | None = None) -> Step:
    """The all-gather variant's forward (into ``log``) and backward (into ``grad_log``)."""
    outs = all_gather_attention(q_shards, k_shards, v_shards, positions, causal=causal, log=log)
    return outs, all_gather_attention_backward(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal,
                                               log=grad_log)


def ulysses_step(q_shards: Arrays, k_shards: Arrays, v_shards: Arrays,
                 dout_shards: Arrays, positions: Arrays, *, causal: bool = True,
                 log: Log | None = None, grad_log: Log | None = None) -> Step:
    """Ulysses' forward (into ``log``) and backward (into ``grad_log``)."""
    outs = ulysses_attention(q_shards, k_shards, v_shards, positions, causal=causal, log=log)
    return outs, ulysses_attention_backward(q_shards, k_shards, v_shards, dout_shards, positions, causal=causal,
                                            log=grad_log)


def sent_bytes(log: Log, cp: int, itemsize: int = 8) -> int:
    """The bytes one rank sends for the records of ``log``: a ring pass sends its block; a collective
    what :func:`distcheck.parallel.comm.reference.simulate` makes the busiest rank send (S the logged
    shape's bytes: the full tensor for all-gather and reduce-scatter, one rank's buffer for all-to-all)."""
    from distcheck.parallel.comm.reference import simulate

    total = 0
    for name, shape in log:
        size = int(np.prod(shape)) * itemsize
        if name == RING_PASS:
            total += size
        else:
            total += simulate(name, size, cp).max_sent_bytes
    return total
