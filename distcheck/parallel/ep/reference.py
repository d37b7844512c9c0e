"""Mixture-of-experts reference (numpy, float64): the router, capacity and dropping, the experts, and the
expert-parallel layer with its all-to-all dispatch and combine.

Conventions
-----------
* Tokens ``x`` are (T, h); the router's weight ``wg`` is (h, E) and its logits ``x @ wg`` (T, E). Expert e is
  the MLP ``relu(x @ w1[e]) @ w2[e]`` with ``w1`` (E, h, f) and ``w2`` (E, f, h).
* Top-k picks each token's k largest logits, ties to the lower expert index (a stable sort). The gates
  follow the named convention (:class:`distcheck.core.vocab.Router`): ``softmax_then_topk`` (Switch
  Transformers, §2.1, eq. 1-2: the full softmax's probabilities of the chosen experts) or
  ``topk_then_softmax`` (Mixtral; GShard's renormalised top-2 gates).
* Capacity (GShard, §2.2, "expert capacity"; Switch Transformers, §2.2, eq. 3): each group of T_g tokens gives
  every expert ``C = ceil(k T_g capacity_factor / E)`` slots; ``capacity_factor`` is read exactly (as a
  Fraction of the float given). Under expert parallelism a group is one rank's tokens.
* Priority (GShard, Algorithm 1: the top-1 choices take their slots before any top-2 choice): the slots of an
  expert are filled choice by choice, and within a choice in token order; a choice that finds its expert
  full is dropped. A dropped choice contributes nothing; a token whose choices are all dropped passes
  through the residual unchanged: the layer returns ``x + sum_kept g_j expert_{e_j}(x)``.
* The auxiliary load-balancing loss (Switch Transformers, §2.2, eq. 4-6, generalised to top-k as GShard's
  ``l_aux``, Lepikhin et al. 2020, §2.2): ``alpha E sum_e f_e P_e`` with ``f_e`` the fraction of the
  T k choices routed to e (before dropping) and ``P_e`` the mean over tokens of the full softmax's
  probability of e. For k = 1 this is Switch's eq. 4 with its f_i (eq. 5) and P_i (eq. 6). The expert-
  parallel layer computes it over the whole batch: it all-reduces the counts and the probability sums
  (2 E numbers) over the ep group.

Expert parallelism (GShard, §2.2; Switch Transformers, §2.3, Figure 3): ``ep`` ranks, rank r holds experts
``r E/ep .. (r+1) E/ep - 1`` and its own tokens. Each rank fills a (E, C, h) dispatch buffer (empty slots 0);
one all-to-all sends block j (the E/ep experts of rank j, (E/ep, C, h)) to rank j; each expert computes on
the (ep C, h) slots it received, stacked in source-rank order; a second all-to-all returns the outputs, and
each rank combines its tokens' outputs. The log holds ``(Collective.ALL_TO_ALL, (E, C, h))`` per all-to-all
(the per-rank buffer: a rank sends (ep-1)/ep of it) and ``(Collective.ALL_REDUCE, (2, E))`` for the aux loss.

Exactness: the single-device MoE with the same routing is :func:`moe_layer` with ``groups = ep`` (GShard's
groups). Every step is row-local (a token's logits, gates and expert outputs depend on that token only and
are computed by one fixed-order sum, :func:`rowdot`), the combine adds a token's choices in choice order
in both, and an expert's weight gradients sum its slots in the order of the stacked buffer, which both
build alike; so the expert-parallel layer gives the single-device layer's bits, forward and backward, for
any inputs. Dyadic inputs (multiples of 1/4 below 4) make the expert outputs themselves exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from distcheck.core.errors import ConfigError
from distcheck.core.validate import MAX_RANKS, as_array, check_at_most, check_choice, check_positive_int
from distcheck.core.vocab import Collective, Router, names

__all__ = ["ROUTERS", "Routing", "rowdot", "softmax", "route", "expert_capacity", "assign_slots", "aux_loss",
           "expert_mlp", "moe_layer", "moe_layer_backward", "ep_moe_layer", "ep_moe_layer_backward", "expert_shards",
           "check_moe"]

#: the router conventions (:class:`distcheck.core.vocab.Router`)
ROUTERS = names(Router)


def rowdot(a: Any, w: Any) -> np.ndarray:
    """``a @ w`` for a (n, p) and w (p, q), each entry summed over p in index order whatever n (row-local,
    so a token's result does not depend on the batch it is computed in)."""
    a, w = np.asarray(a, dtype=np.float64), np.asarray(w, dtype=np.float64)
    out = np.zeros((a.shape[0], w.shape[1]))
    for i in range(a.shape[1]):
        out = out + a[:, i:i + 1] * w[i][None, :]
    return out


def softmax(logits: Any) -> np.ndarray:
    """Row softmax of (n, m) logits, the row max subtracted first."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class Routing:
    """A batch's routing: ``experts`` and ``gates`` (T, k) (choice j of token t), ``probs`` (T, E) (the full
    softmax, for the aux loss), ``slots`` (T, k) (the choice's slot in its expert's group buffer, -1 when
    dropped) and the ``capacity`` C per expert and group; ``groups`` contiguous groups of T/groups tokens."""

    experts: np.ndarray
    gates: np.ndarray
    probs: np.ndarray
    slots: np.ndarray
    capacity: int
    groups: int

    @property
    def kept(self) -> np.ndarray:
        """(T, k) booleans: the choices that found a slot."""
        return self.slots >= 0


def check_moe(x: Any, wg: Any, w1: Any, w2: Any, k: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The arrays as float64 and k; ConfigError naming the one whose shape is wrong (x (T, h), wg (h, E),
    w1 (E, h, f), w2 (E, f, h), 1 <= k <= E)."""
    x, wg, w1, w2 = as_array("x", x), as_array("wg", wg), as_array("w1", w1), as_array("w2", w2)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ConfigError("x.shape", x.shape, "must be (tokens, h) with h >= 1")
    h = x.shape[1]
    if wg.ndim != 2 or wg.shape[0] != h or wg.shape[1] == 0:
        raise ConfigError("wg.shape", wg.shape, f"must be (h, num_experts) with h = {h}")
    E = wg.shape[1]
    if w1.ndim != 3 or w1.shape[:2] != (E, h) or w1.shape[2] == 0:
        raise ConfigError("w1.shape", w1.shape, f"must be (num_experts, h, f) = ({E}, {h}, f)")
    if w2.shape != (E, w1.shape[2], h):
        raise ConfigError("w2.shape", w2.shape, f"must be (num_experts, f, h) = ({E}, {w1.shape[2]}, {h})")
    k = check_positive_int("k", k)
    check_at_most("k", k, E, "a token picks k distinct experts of the num_experts")
    return x, wg, w1, w2, k


def route(logits: Any, k: int, router: str = Router.TOPK_THEN_SOFTMAX) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(experts, gates, probs)`` for (T, E) logits: the top-k experts (T, k) in decreasing logit order (ties
    to the lower index), their gates under ``router`` (module doc) and the full softmax (T, E)."""
    check_choice("router", router, ROUTERS)
    z = as_array("logits", logits)
    experts = np.argsort(-z, axis=1, kind="stable")[:, :k]
    probs = softmax(z)
    if router == Router.SOFTMAX_THEN_TOPK:
        gates = np.take_along_axis(probs, experts, axis=1)
    else:
        gates = softmax(np.take_along_axis(z, experts, axis=1))
    return experts, gates, probs


def expert_capacity(tokens: int, num_experts: int, k: int, capacity_factor: Any) -> int:
    """Slots per expert for a group of ``tokens``: ``ceil(k tokens capacity_factor / num_experts)`` (GShard
    §2.2; Switch Transformers eq. 3), the factor read exactly; ConfigError for a factor that is not > 0."""
    tokens = check_positive_int("tokens", tokens)
    num_experts, k = check_positive_int("num_experts", num_experts), check_positive_int("k", k)
    try:
        cf = Fraction(capacity_factor)
    except (TypeError, ValueError) as exc:
        raise ConfigError("capacity_factor", capacity_factor, "must be a number > 0") from exc
    if cf <= 0:
        raise ConfigError("capacity_factor", capacity_factor, "must be > 0")
    return math.ceil(Fraction(k * tokens) * cf / num_experts)


def assign_slots(experts: Any, num_experts: int, capacity: int) -> np.ndarray:
    """(T, k) slot of each choice in its expert's buffer of ``capacity`` slots, -1 when dropped: choice 0 of
    every token in token order first, then choice 1, ... (GShard, Algorithm 1)."""
    experts = np.asarray(experts)
    slots = np.full(experts.shape, -1, dtype=np.int64)
    fill = np.zeros(num_experts, dtype=np.int64)
    for j in range(experts.shape[1]):
        for t in range(experts.shape[0]):
            e = experts[t, j]
            if fill[e] < capacity:
                slots[t, j] = fill[e]
                fill[e] += 1
    return slots


def aux_loss(probs: Any, experts: Any, num_experts: int, alpha: float = 1.0) -> float:
    """``alpha E sum_e f_e P_e`` (module doc; Switch Transformers eq. 4-6): ``f_e`` the share of the T k
    choices routed to e, ``P_e`` the mean full-softmax probability of e."""
    probs, experts = np.asarray(probs, dtype=np.float64), np.asarray(experts)
    counts = np.bincount(experts.ravel(), minlength=num_experts).astype(np.float64)
    return _aux_from_sums(counts, probs.sum(axis=0), experts.size, probs.shape[0], num_experts, alpha)


def _aux_from_sums(counts: Any, prob_sums: Any, choices: Any, tokens: Any, E: Any, alpha: Any) -> float:
    f = counts / choices
    P = prob_sums / tokens
    return float(alpha * E * np.sum(f * P))


def expert_mlp(x: Any, w1: Any, w2: Any) -> np.ndarray:
    """One expert on its slots: ``relu(x @ w1) @ w2`` by :func:`rowdot`; x (n, h), w1 (h, f), w2 (f, h)."""
    return rowdot(np.maximum(rowdot(x, w1), 0.0), w2)


def _routing(x: Any, wg: Any, k: Any, capacity_factor: Any, router: Any, groups: Any) -> Routing:
    T, E = x.shape[0], wg.shape[1]
    groups = check_positive_int("groups", groups)
    if T % groups:
        raise ConfigError("tokens", T, f"must be divisible by groups = {groups} (equal groups of tokens)")
    experts, gates, probs = route(rowdot(x, wg), k, router)
    cap = expert_capacity(T // groups, E, k, capacity_factor)
    n = T // groups
    slots = np.concatenate([assign_slots(experts[g * n:(g + 1) * n], E, cap) for g in range(groups)])
    return Routing(experts, gates, probs, slots, cap, groups)


def _buffers(x: Any, r: Routing, E: int) -> np.ndarray:
    """(groups, E, C, h) dispatch buffers, zeros in the empty slots."""
    n = x.shape[0] // r.groups
    buf = np.zeros((r.groups, E, r.capacity, x.shape[1]))
    for t, j in zip(*np.nonzero(r.kept), strict=True):
        buf[t // n, r.experts[t, j], r.slots[t, j]] = x[t]
    return buf


def _combine(x: Any, r: Routing, outs: Any) -> np.ndarray:
    """``x + sum_kept g_j out_j`` per token, the choices added in order; outs (groups, E, C, h)."""
    n = x.shape[0] // r.groups
    y = x.copy()
    for j in range(r.experts.shape[1]):
        for t in range(x.shape[0]):
            if r.slots[t, j] >= 0:
                y[t] = y[t] + r.gates[t, j] * outs[t // n, r.experts[t, j], r.slots[t, j]]
    return y


def moe_layer(x: Any, wg: Any, w1: Any, w2: Any, *, k: int = 2, capacity_factor: Any = 1.0,
              router: str = Router.TOPK_THEN_SOFTMAX,
              groups: int = 1, alpha: float = 1.0) -> tuple[np.ndarray, float, Routing]:
    """The single-device MoE layer: ``(out (T, h), aux loss, routing)`` with capacity per group of T/groups
    contiguous tokens (module doc). Raises ConfigError for shapes, k, the factor, or groups not dividing T."""
    x, wg, w1, w2, k = check_moe(x, wg, w1, w2, k)
    E = wg.shape[1]
    r = _routing(x, wg, k, capacity_factor, router, groups)
    buf = _buffers(x, r, E)
    outs = np.zeros_like(buf)
    for e in range(E):
        stacked = buf[:, e].reshape(-1, x.shape[1])          # (groups C, h), group order
        outs[:, e] = expert_mlp(stacked, w1[e], w2[e]).reshape(r.groups, r.capacity, -1)
    return _combine(x, r, outs), aux_loss(r.probs, r.experts, E, alpha), r


def expert_shards(w: Any, ep: int) -> list[np.ndarray]:
    """Rank r's experts ``w[r E/ep : (r+1) E/ep]``; ConfigError unless ep divides the expert count."""
    w = np.asarray(w, dtype=np.float64)
    ep = check_positive_int("ep", ep)
    check_at_most("ep", ep, MAX_RANKS, "one shard is built per rank")
    if w.shape[0] % ep:
        raise ConfigError("ep", ep, f"must divide num_experts = {w.shape[0]} (every rank holds E/ep experts)")
    n = w.shape[0] // ep
    return [w[i * n:(i + 1) * n] for i in range(ep)]


def _ep_inputs(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, k: Any) -> Any:
    ep = len(x_shards)
    if ep == 0 or len(w1_shards) != ep or len(w2_shards) != ep:
        raise ConfigError("ep", ep, "x_shards, w1_shards and w2_shards must hold one entry per rank (ep >= 1)")
    x = np.concatenate([as_array("x_shards", a) for a in x_shards])
    w1, w2 = np.concatenate([as_array("w1_shards", a) for a in w1_shards]), np.concatenate(
        [as_array("w2_shards", a) for a in w2_shards])
    x, wg, w1, w2, k = check_moe(x, wg, w1, w2, k)
    if len({len(a) for a in x_shards}) != 1 or len({len(a) for a in w1_shards}) != 1:
        raise ConfigError("x_shards", [len(a) for a in x_shards], "every rank holds as many tokens and experts")
    return ep, x, wg, w1, w2, k


def _ep_forward(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, k: Any, capacity_factor: Any, router: Any,
                log: Any) -> Any:
    ep, x, wg, w1, w2, k = _ep_inputs(x_shards, wg, w1_shards, w2_shards, k)
    E, h = wg.shape[1], x.shape[1]
    r = _routing(x, wg, k, capacity_factor, router, ep)        # each rank routes its own tokens
    send = _buffers(x, r, E)                                   # send[src] = rank src's (E, C, h) buffer
    n_local = E // ep
    if log is not None:
        log.append((Collective.ALL_TO_ALL, send.shape[1:]))
    # all-to-all: rank dst receives block dst of every source, (ep, E/ep, C, h)
    recv = [np.stack([send[src, dst * n_local:(dst + 1) * n_local] for src in range(ep)]) for dst in range(ep)]
    back = np.zeros_like(send)
    for dst in range(ep):
        for i in range(n_local):
            stacked = recv[dst][:, i].reshape(-1, h)           # (ep C, h), source-rank order
            y = expert_mlp(stacked, w1_shards[dst][i], w2_shards[dst][i]).reshape(ep, r.capacity, h)
            back[:, dst * n_local + i] = y                     # the combine all-to-all returns row src to src
    if log is not None:
        log.append((Collective.ALL_TO_ALL, send.shape[1:]))
    return ep, x, wg, w1, w2, r, send, back


def ep_moe_layer(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, *, k: int = 2, capacity_factor: Any = 1.0,
                 router: str = Router.TOPK_THEN_SOFTMAX, alpha: float = 1.0,
                 log: list | None = None) -> tuple[list[np.ndarray], float]:
    """The expert-parallel layer on ``ep = len(x_shards)`` ranks: rank r's tokens (T/ep, h) and experts
    ``w1_shards[r]`` (E/ep, h, f), ``w2_shards[r]`` (E/ep, f, h); the router ``wg`` replicated. Returns every
    rank's output (T/ep, h) and the aux loss over the whole batch; logs two all-to-alls and one all-reduce."""
    ep, x, wg, _, _, r, _, back = _ep_forward(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router, log)
    E = wg.shape[1]
    y = _combine(x, r, back)
    n = x.shape[0] // ep
    counts = [np.bincount(r.experts[i * n:(i + 1) * n].ravel(), minlength=E).astype(np.float64) for i in range(ep)]
    psums = [r.probs[i * n:(i + 1) * n].sum(axis=0) for i in range(ep)]
    if log is not None:
        log.append((Collective.ALL_REDUCE, (2, E)))
    aux = _aux_from_sums(np.sum(counts, axis=0), np.sum(psums, axis=0), r.experts.size, x.shape[0], E, alpha)
    return [y[i * n:(i + 1) * n] for i in range(ep)], aux



# ----------------------------------------------------------------------------- backward
# The gradients of ``sum(out * dout)`` (the aux loss's own gradient is not included): a kept choice (t, j)
# gives ``dg_tj = dout_t . y_tj`` and its expert the slot gradient ``g_tj dout_t``; the expert's backward
# ``dw2 = relu(a)^T dy``, ``da = (dy w2^T) [a > 0]``, ``dw1 = x^T da``, ``dx = da w1^T`` (a = x w1); the
# router's, through the softmax of its convention, ``dz = p (dp - sum(p dp))``; ``dx = dout + the kept
# slots' dx in choice order + dz wg^T``; ``dwg = x^T dz``.


def _gate_grads(dout: Any, r: Routing, outs: Any, E: Any) -> Any:
    n = dout.shape[0] // r.groups
    dg = np.zeros(r.gates.shape)
    dy = np.zeros((r.groups, E, r.capacity, dout.shape[1]))
    for t, j in zip(*np.nonzero(r.kept), strict=True):
        g, e, c = t // n, r.experts[t, j], r.slots[t, j]
        dg[t, j] = float(np.sum(dout[t] * outs[g, e, c]))
        dy[g, e, c] = r.gates[t, j] * dout[t]
    return dg, dy


def _expert_backward(xs: Any, w1: Any, w2: Any, dy: Any) -> Any:
    a = rowdot(xs, w1)
    da = rowdot(dy, w2.T) * (a > 0)
    return rowdot(da, w1.T), rowdot(xs.T, da), rowdot(np.maximum(a, 0.0).T, dy)


def _router_dz(x: Any, wg: Any, r: Routing, dg: Any, router: Any) -> Any:
    z = rowdot(x, wg)
    if router == Router.SOFTMAX_THEN_TOPK:
        dp = np.zeros(z.shape)
        np.put_along_axis(dp, r.experts, dg, axis=1)
        return r.probs * (dp - np.sum(r.probs * dp, axis=1, keepdims=True))
    dzk = r.gates * (dg - np.sum(r.gates * dg, axis=1, keepdims=True))
    dz = np.zeros(z.shape)
    np.put_along_axis(dz, r.experts, dzk, axis=1)
    return dz


def _token_dx(dout: Any, r: Routing, dxs: Any) -> Any:
    """``dout + sum_kept dx_slot`` per token in choice order; dxs (groups, E, C, h)."""
    n = dout.shape[0] // r.groups
    dx = dout.copy()
    for j in range(r.experts.shape[1]):
        for t in range(dout.shape[0]):
            if r.slots[t, j] >= 0:
                dx[t] = dx[t] + dxs[t // n, r.experts[t, j], r.slots[t, j]]
    return dx


def moe_layer_backward(x: Any, wg: Any, w1: Any, w2: Any, dout: Any, *, k: int = 2, capacity_factor: Any = 1.0,
                       router: str = Router.TOPK_THEN_SOFTMAX, groups: int = 1) -> Any:
    """``(dx, dwg, dw1, dw2)`` of ``sum(out * dout)`` for :func:`moe_layer` (shapes of x, wg, w1, w2)."""
    x, wg, w1, w2, k = check_moe(x, wg, w1, w2, k)
    dout = _check_dout(dout, x.shape)
    E, h = wg.shape[1], x.shape[1]
    r = _routing(x, wg, k, capacity_factor, router, groups)
    buf = _buffers(x, r, E)
    outs = np.zeros_like(buf)
    for e in range(E):
        outs[:, e] = expert_mlp(buf[:, e].reshape(-1, h), w1[e], w2[e]).reshape(r.groups, r.capacity, h)
    dg, dy = _gate_grads(dout, r, outs, E)
    dxs, dw1, dw2 = np.zeros_like(buf), np.zeros_like(w1), np.zeros_like(w2)
    for e in range(E):
        got, dw1[e], dw2[e] = _expert_backward(buf[:, e].reshape(-1, h), w1[e], w2[e], dy[:, e].reshape(-1, h))
        dxs[:, e] = got.reshape(r.groups, r.capacity, h)
    dz = _router_dz(x, wg, r, dg, router)
    return _token_dx(dout, r, dxs) + rowdot(dz, wg.T), rowdot(x.T, dz), dw1, dw2


def _check_dout(dout: Any, shape: Any) -> Any:
    dout = as_array("dout", dout)
    if dout.shape != shape:
        raise ConfigError("dout.shape", dout.shape, f"must equal the tokens' shape {shape}")
    return dout


def ep_moe_layer_backward(x_shards: Any, wg: Any, w1_shards: Any, w2_shards: Any, dout_shards: Any, *, k: int = 2,
                          capacity_factor: Any = 1.0,
                          router: str = Router.TOPK_THEN_SOFTMAX, log: list | None = None) -> Any:
    """``(dx_shards, dwg, dw1_shards, dw2_shards)`` of :func:`ep_moe_layer`: the slot gradients go to the
    experts' ranks by an all-to-all and their input gradients come back by a second (logged, (E, C, h)
    each); ``dwg`` is the all-reduce (logged, (h, E)) of the ranks' partial router gradients, summed in rank
    order (the one result not bitwise the single device's: module :mod:`distcheck.parallel.ep.properties`)."""
    ep, x, wg, w1, w2, r, send, back = _ep_forward(x_shards, wg, w1_shards, w2_shards, k, capacity_factor, router,
                                                   None)
    dout = _check_dout(np.concatenate([np.asarray(d, dtype=np.float64) for d in dout_shards]), x.shape)
    E, h = wg.shape[1], x.shape[1]
    n_local, n = E // ep, x.shape[0] // ep
    dg, dy = _gate_grads(dout, r, back, E)                  # on each token's rank, from the returned outputs
    if log is not None:
        log.append((Collective.ALL_TO_ALL, dy.shape[1:]))
    dxs = np.zeros_like(send)
    dw1s = [np.zeros_like(a) for a in w1_shards]
    dw2s = [np.zeros_like(a) for a in w2_shards]
    for dst in range(ep):
        for i in range(n_local):
            e = dst * n_local + i
            xs = np.stack([send[src, e] for src in range(ep)]).reshape(-1, h)
            dys = np.stack([dy[src, e] for src in range(ep)]).reshape(-1, h)
            got, dw1s[dst][i], dw2s[dst][i] = _expert_backward(xs, w1_shards[dst][i], w2_shards[dst][i], dys)
            dxs[:, e] = got.reshape(ep, r.capacity, h)
    if log is not None:
        log.append((Collective.ALL_TO_ALL, dy.shape[1:]))
    dz = _router_dz(x, wg, r, dg, router)
    dx = _token_dx(dout, r, dxs) + rowdot(dz, wg.T)
    partial = [rowdot(x[i * n:(i + 1) * n].T, dz[i * n:(i + 1) * n]) for i in range(ep)]
    if log is not None:
        log.append((Collective.ALL_REDUCE, wg.shape))
    dwg = partial[0]
    for p in partial[1:]:
        dwg = dwg + p
    return [dx[i * n:(i + 1) * n] for i in range(ep)], dwg, dw1s, dw2s
