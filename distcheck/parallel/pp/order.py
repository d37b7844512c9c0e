"""A per-rank order of pipeline actions as flat integer arrays, its checks and its dependencies.

An :class:`Order` holds every rank's list of actions one after the other (rank ``r``'s are
``offsets[r]:offsets[r+1]``), as codes: ``kind`` (0 ``F`` forward, 1 ``B`` full backward,
2 ``I`` input-gradient backward, 3 ``W`` weight-gradient backward), ``microbatch`` and
``stage``. ``overlap[k]`` marks action ``k`` and the next action of its rank as one
*overlapped pair* (DualPipe's "F&B", torch's ``OVERLAP_F_B``): both start together and end
``t_fb`` ticks later.

Routes. By default every micro-batch runs every stage ``0 .. num_stages-1``. ``first_stage``
and ``last_stage`` (one entry per micro-batch) let two pipelines share the ranks: DualPipe
sends half of the micro-batches through stages ``0 .. p-1`` and the other half through
``p .. 2p-1``.

Dependencies (for one micro-batch ``j`` on its route): ``F`` of stage ``s`` needs ``F`` of
``s - 1``; the backward (``B`` or ``I``) of ``s`` needs ``F`` of ``s`` and the backward of
``s + 1`` (the last stage of the route needs only its own ``F``: the loss is computed at its
end); ``W`` of ``s`` needs ``I`` of ``s``. :func:`check_order` refuses an order that breaks
the rules of :func:`distcheck.parallel.pp.replay` with the same ConfigError messages, and
:func:`dependencies` lists, for every action, the (at most two) actions it waits for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distcheck.core.errors import ConfigError
from distcheck.core.validate import check_positive_int
from distcheck.parallel.pp.actions import KINDS, MAX_ACTIONS, Action

__all__ = ["F", "B", "I", "W", "Order", "compile_order", "check_order", "dependencies", "from_arrays"]

#: action codes of :data:`Order.kind` (the index in :data:`distcheck.parallel.pp.actions.KINDS`)
F, B, I, W = 0, 1, 2, 3  # noqa: E741 - the schedule notation's action letters, public names
_CODE = {k: n for n, k in enumerate(KINDS)}


@dataclass(frozen=True, eq=False)
class Order:
    """A per-rank order as flat arrays (see the module docstring)."""

    num_ranks: int
    num_stages: int
    num_microbatches: int
    offsets: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    stage: np.ndarray
    overlap: np.ndarray
    first_stage: np.ndarray | None = None
    last_stage: np.ndarray | None = None

    @property
    def num_actions(self) -> int:
        return int(self.kind.size)

    def ranks(self) -> np.ndarray:
        """The rank of every action."""
        return np.repeat(np.arange(self.num_ranks, dtype=np.int64), np.diff(self.offsets))

    def action(self, k: int) -> Action:
        """Action ``k`` as an :class:`~distcheck.parallel.pp.actions.Action`."""
        return Action(KINDS[int(self.kind[k])], int(self.microbatch[k]), int(self.stage[k]))

    def to_actions(self, *, pairs: bool = False) -> dict[int, list]:
        """``{rank: [Action, ...]}``; with ``pairs`` an overlapped pair is one ``(Action, Action)`` tuple."""
        out: dict[int, list] = {}
        kinds, mbs, sts, ov = self.kind.tolist(), self.microbatch.tolist(), self.stage.tolist(), self.overlap.tolist()
        acts = [Action(KINDS[k], j, s) for k, j, s in zip(kinds, mbs, sts, strict=True)]
        for r in range(self.num_ranks):
            lo, hi = int(self.offsets[r]), int(self.offsets[r + 1])
            if not pairs:
                out[r] = acts[lo:hi]
                continue
            row: list = []
            k = lo
            while k < hi:
                if ov[k] and k + 1 < hi:
                    row.append((acts[k], acts[k + 1]))
                    k += 2
                else:
                    row.append(acts[k])
                    k += 1
            out[r] = row
        return out


def from_arrays(num_stages: int, num_microbatches: int, ranks: Sequence[Sequence[np.ndarray]],
                routes: tuple[np.ndarray, np.ndarray] | None = None) -> Order:
    """An :class:`Order` from per-rank ``[kind, stage, microbatch, overlap]`` arrays (no checks)."""
    counts = [len(r[0]) for r in ranks]
    cat = np.concatenate
    return Order(num_ranks=len(ranks), num_stages=num_stages, num_microbatches=num_microbatches,
                 offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                 kind=cat([r[0] for r in ranks]).astype(np.int8, copy=False),
                 stage=cat([r[1] for r in ranks]).astype(np.int64, copy=False),
                 microbatch=cat([r[2] for r in ranks]).astype(np.int64, copy=False),
                 overlap=cat([r[3] for r in ranks]).astype(bool, copy=False),
                 first_stage=None if routes is None else np.asarray(routes[0], np.int64),
                 last_stage=None if routes is None else np.asarray(routes[1], np.int64))


def _items(order: object) -> list:
    if isinstance(order, Mapping):
        return list(order.items())
    if isinstance(order, Sequence) and not isinstance(order, (str, bytes)):
        return list(enumerate(order))
    raise ConfigError("order", type(order).__name__, "must be a dict {rank: [Action, ...]} or a list of lists")


def compile_order(order: Mapping[int, Sequence[Any]] | Sequence[Sequence[Any]], num_stages: int, num_microbatches: int,
                  routes: tuple[ArrayLike, ArrayLike] | None = None) -> Order:
    """Turn ``{rank: [Action | (Action, Action) | None, ...]}`` (or a list of lists) into an :class:`Order`.

    ``None`` entries (idle slots of a torch ``pipeline_order``) are dropped; a 2-tuple of
    Actions is an overlapped pair. Ranks missing below the largest key hold no action.
    ``routes`` is None or ``(first_stage, last_stage)``, one entry per micro-batch.

    Raises ConfigError naming the rank and the entry for anything else, or for more than
    :data:`~distcheck.parallel.pp.actions.MAX_ACTIONS` actions.
    """
    num_stages = check_positive_int("num_stages", num_stages)
    num_microbatches = check_positive_int("num_microbatches", num_microbatches)
    items = _items(order)
    if not items:
        raise ConfigError("order", order, "must have at least one rank")
    rows: dict[int, tuple[list, list]] = {}
    total = 0
    for rank, actions in items:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            raise ConfigError("rank", rank, "must be an integer >= 0")
        rank = int(rank)
        if isinstance(actions, (str, bytes, Mapping)) or not isinstance(actions, Iterable):
            raise ConfigError(f"order[{rank}]", type(actions).__name__, "must be a list of actions")
        acts: list[Action] = []
        flags: list[bool] = []
        for a in actions:
            if a is None:
                continue
            if isinstance(a, Action):
                acts.append(a)
                flags.append(False)
            elif isinstance(a, tuple) and len(a) == 2 and all(isinstance(x, Action) for x in a):
                acts.extend(a)
                flags.extend((True, False))
            else:
                raise ConfigError(f"order[{rank}]", a, "must hold Action objects or None (or (Action, Action) "
                                                       "overlapped pairs; see from_torch_actions)")
            if total + len(acts) > MAX_ACTIONS:
                raise ConfigError("order", f"<more than {MAX_ACTIONS} actions>",
                                  f"must hold at most pp.MAX_ACTIONS = {MAX_ACTIONS} actions; "
                                  "for large sizes use the closed forms pp.* (distcheck.closed_form.get)")
        total += len(acts)
        rows[rank] = (acts, flags)
    p = max(rows) + 1
    flat = [a for r in range(p) for a in rows.get(r, ((), ()))[0]]
    n = len(flat)
    return Order(
        num_ranks=p, num_stages=num_stages, num_microbatches=num_microbatches,
        offsets=np.concatenate([[0], np.cumsum([len(rows.get(r, ((),))[0]) for r in range(p)])]).astype(np.int64),
        kind=np.fromiter((_CODE[a.kind] for a in flat), np.int8, n),
        microbatch=np.fromiter((a.microbatch for a in flat), np.int64, n),
        stage=np.fromiter((a.stage for a in flat), np.int64, n),
        overlap=np.fromiter((f for r in range(p) for f in rows.get(r, ((), ()))[1]), bool, n),
        first_stage=None if routes is None else np.asarray(routes[0], np.int64),
        last_stage=None if routes is None else np.asarray(routes[1], np.int64),
    )


def _route(order: Order) -> tuple[np.ndarray, np.ndarray]:
    S, M = order.num_stages, order.num_microbatches
    first = np.zeros(M, np.int64) if order.first_stage is None else order.first_stage
    last = np.full(M, S - 1, np.int64) if order.last_stage is None else order.last_stage
    return first, last


def check_order(order: Order, rank_of: np.ndarray, stage_to_rank: Mapping[int, int] | Sequence[int] | None = None  # noqa: C901 - one branch per check of an order, each raising the error that names it
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check ranges, duplicates, placement and completeness of ``order``.

    Returns ``(idx_f, idx_bk, idx_i, idx_w, placed)``: for every (stage, micro-batch) pair
    ``s * M + j`` the index of its ``F``, of its backward (``B``, or ``I`` when split), of its
    ``I`` and of its ``W`` (-1 where absent), and the rank of every stage (-1 for a stage no
    action uses).
    Raises ConfigError with the messages of :func:`distcheck.parallel.pp.replay`.
    """
    S, M, N = order.num_stages, order.num_microbatches, order.num_actions
    if S * M > MAX_ACTIONS:
        raise ConfigError("num_microbatches", M, f"gives num_stages*num_microbatches = {S * M} (stage, micro-batch) "
                          f"pairs, more than pp.MAX_ACTIONS = {MAX_ACTIONS}; for large sizes use the closed "
                          "forms pp.* (distcheck.closed_form.get)")
    kind, mb, st = order.kind, order.microbatch, order.stage
    first, last = _route(order)
    if first.shape != (M,) or last.shape != (M,) or (first < 0).any() or (last >= S).any() or (first > last).any():
        raise ConfigError("routes", (first.tolist(), last.tolist()),
                          f"must give each of the {M} micro-batches a stage range 0 <= first <= last < {S}")
    for name, arr, bound, what in (("stage", st, S, "num_stages"), ("microbatch", mb, M, "num_microbatches")):
        bad = np.flatnonzero((arr < 0) | (arr >= bound))
        if bad.size:
            k = int(bad[0])
            raise ConfigError(name, int(arr[k]),
                              f"must be < {what}={bound} (in {order.action(k)} on rank {int(rank_of[k])})")
    if order.first_stage is not None:
        off = np.flatnonzero((st < first[mb]) | (st > last[mb]))
        if off.size:
            k = int(off[0])
            raise ConfigError("order", str(order.action(k)), f"is off micro-batch {int(mb[k])}'s route (stages "
                              f"{int(first[mb[k]])}..{int(last[mb[k]])})")
    ov = np.flatnonzero(order.overlap)
    if ov.size and (np.isin(ov + 1, order.offsets[1:]).any() or order.overlap[ov + 1].any()):
        raise ConfigError("overlap", ov.tolist()[:4], "must pair an action with the next action of the same rank")
    SM = S * M
    key = st * M + mb
    full = kind.astype(np.int64) * SM + key
    pos: np.ndarray = np.full(4 * SM, -1, np.int32 if N < 2**31 else np.int64)
    arange = np.arange(N, dtype=pos.dtype)
    pos[full[::-1]] = arange[::-1]  # the first action of each key wins
    got = pos[full]
    if not np.array_equal(got, arange):
        k = int(np.flatnonzero(got != arange)[0])  # the first repeat, as a scan in rank order finds it
        raise ConfigError("order", str(order.action(k)),
                          f"appears twice (ranks {int(rank_of[got[k]])} and {int(rank_of[k])})")
    placed = np.full(S, -1, np.int64)
    placed[st[::-1]] = rank_of[::-1]  # the first rank that runs the stage
    wrong = np.flatnonzero(placed[st] != rank_of)
    if wrong.size:
        k = int(wrong[0])
        raise ConfigError("stage", int(st[k]), f"must live on one rank (found on ranks {int(placed[st[k]])} and "
                                               f"{int(rank_of[k])})")
    if stage_to_rank is not None:
        mapping = dict(stage_to_rank.items()) if isinstance(stage_to_rank, Mapping) else dict(enumerate(stage_to_rank))
        for s in np.flatnonzero(placed >= 0).tolist():
            if mapping.get(s) != int(placed[s]):
                raise ConfigError("stage_to_rank", mapping.get(s),
                                  f"puts stage {s} on rank {mapping.get(s)}, "
                                  f"but the order runs it on rank {int(placed[s])}")
    idx = pos.reshape(4, SM)
    has = idx >= 0
    if order.first_stage is None:
        on_route = None
        missing_f = np.flatnonzero(~has[F])
    else:
        sg = np.arange(S)[:, None]
        on_route = ((sg >= first[None, :]) & (sg <= last[None, :])).reshape(-1)
        missing_f = np.flatnonzero(on_route & ~has[F])
    if missing_f.size:
        s, j = divmod(int(missing_f[0]), M)
        raise ConfigError("order", str(Action("F", j, s)), "is missing (every stage runs every micro-batch forward)")
    split = has[I] | has[W]
    if split.any():
        mixed = np.flatnonzero(has[B] & split)
        if mixed.size:
            s, j = divmod(int(mixed[0]), M)
            raise ConfigError("order", str(Action("B", j, s)),
                              "mixes a full backward B with split I/W for one micro-batch")
        complete = has[B] | (has[I] & has[W])
    else:
        complete = has[B]
    incomplete = np.flatnonzero(~complete if on_route is None else on_route & ~complete)
    if incomplete.size:
        k = int(incomplete[0])
        s, j = divmod(k, M)
        miss = "W" if has[I, k] else ("I" if has[W, k] else "B")
        raise ConfigError("order", str(Action(miss, j, s)),
                          "is missing (each micro-batch needs B, or I and W, per stage)")
    idx_f = idx[F]
    idx_bk = np.where(has[B], idx[B], idx[I]) if split.any() else idx[B]
    return idx_f, idx_bk, idx[I], idx[W], placed


def dependencies(order: Order, idx_f: np.ndarray, idx_bk: np.ndarray, idx_i: np.ndarray,
                 idx_w: np.ndarray) -> np.ndarray:
    """``(N, 2)`` indices of the actions each action waits for, -1 for none, in the order the
    reference names them (``F`` of the same stage before the backward of the next one).

    Written on the (stage, micro-batch) grid of a checked order (every pair on its route has
    its F and its backward): the forward of pair ``s * M + j`` waits on ``idx_f`` one stage
    down, its backward on its own F and on ``idx_bk`` one stage up, its W on its I."""
    S, M = order.num_stages, order.num_microbatches
    deps = np.full((order.num_actions, 2), -1, np.int64)
    none = np.full(M, -1, idx_f.dtype)
    f_before = np.concatenate([none, idx_f[:-M]])  # F of stage s - 1
    b_after = np.concatenate([idx_bk[M:], none])  # backward of stage s + 1
    on: slice | np.ndarray
    if order.first_stage is None:
        on = slice(None)
    else:
        first, last = _route(order)
        stage = np.repeat(np.arange(S), M)
        mb = np.tile(np.arange(M), S)
        f_before = np.where(stage > first[mb], f_before, -1)
        b_after = np.where(stage < last[mb], b_after, -1)
        on = idx_f >= 0  # the pairs on a route
    deps[idx_f[on], 0] = f_before[on]
    deps[idx_bk[on], 0] = idx_f[on]
    deps[idx_bk[on], 1] = b_after[on]
    has_w = idx_w >= 0
    if has_w.any():
        deps[idx_w[has_w], 0] = idx_i[has_w]
    return deps
