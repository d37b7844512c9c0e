"""Automatic cross-claim checks from known relations between quantities: a table and its total.

An answer key rarely states its tables' arithmetic, and it should not have to. When a key's
claims name quantities that are known to add up, with the same inputs, the audit checks the
printed figures against each other as if a ``[[check]]`` had been written (the same rule,
:mod:`distcheck.audit.figures`):

* ``memory.train_state_bytes`` = ``memory.weights_bytes`` + ``memory.grads_bytes`` +
  ``memory.optimizer_bytes`` (same params, tp, pp): a memory table and its total;
* ``memory.state_plus_activations_bytes`` with ``activation_bytes = "@A"`` = the same three
  components + A, or = ``memory.train_state_bytes`` + A: a table with an activations row;
* ``memory.per_gpu_bytes.zero<s>`` with ``activation_bytes = "@A"`` = ``zero.bytes_per_gpu.stage<s>``
  + A (same params, dp, k): a ZeRO table built on another table's rows;
* ``zero.bytes_per_gpu.stage0`` = ``memory.train_state_bytes`` (same params, ``bytes_per_param =
  4 + k``, tp = pp = 1): ZeRO's baseline is the whole training state;
* ``pp.step_ticks.<schedule>`` = ``pp.busy_ticks`` + ``pp.idle_ticks.<schedule>``
  (same p, m, t_f, t_b, and v): a schedule's step is its work plus its bubble.

Each becomes a :class:`~distcheck.audit.consistency.CheckVerdict` with ``automatic=True`` and an id
``auto:<kind>:<claim ids>``. A relation that an explicit ``[[check]]`` already states over the same
claims is not repeated. Matching is on the resolved inputs, defaults filled (``model`` included, as
the exact parameter count it stands for).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from distcheck.audit.keys import AnswerKey, Check, Claim
from distcheck.core.vocab import Schedule

__all__ = ["relation_checks"]

_COMPONENTS = ("memory.weights_bytes", "memory.grads_bytes", "memory.optimizer_bytes")


def _full(c: Claim, inputs: dict[str, str]) -> dict[str, Fraction]:
    from distcheck.audit import quantities as qmod

    q = qmod.get_quantity(c.quantity)
    out = {i.name: Fraction(str(i.default)) for i in q.inputs if i.default is not None}
    out.update({k: Fraction(v) for k, v in inputs.items() if k != "order" and v != "vector"})
    return out


def _same(a: dict, b: dict, names: Sequence[str]) -> bool:
    return all(n in a and n in b and a[n] == b[n] for n in names)


def _ref(c: Claim, name: str) -> str | None:
    v = c.inputs.get(name)
    return v[1:] if isinstance(v, str) and v.startswith("@") else None


def relation_checks(key: AnswerKey, recomputed: Sequence[tuple[Claim, dict[str, str]]]) -> list[Check]:  # noqa: C901 - one case per relation between quantities, read as one table
    """The ``[[check]]``-equivalents the relations above give for ``key`` (see the module docstring),
    minus those an explicit check of the key already states."""
    scalar = [(c, _full(c, i)) for c, i in recomputed if not isinstance(c.claimed, tuple)]
    by_q: dict[str, list[tuple[Claim, dict]]] = {}
    for c, v in scalar:
        by_q.setdefault(c.quantity, []).append((c, v))
    found: list[tuple[str, str, tuple[str, ...]]] = []  # (kind, total id, part ids)

    def components(v: dict) -> list[Claim] | None:
        parts = []
        for q in _COMPONENTS:
            match = [c for c, w in by_q.get(q, []) if _same(v, w, ("params", "tp", "pp"))]
            if len(match) != 1:
                return None
            parts.append(match[0])
        return parts

    for total, v in by_q.get("memory.train_state_bytes", []):
        parts = components(v)
        if parts:
            found.append(("sum", total.id, tuple(p.id for p in parts)))
    for total, v in by_q.get("memory.state_plus_activations_bytes", []):
        act = _ref(total, "activation_bytes")
        if act is None:
            continue
        parts = components(v)
        if parts:
            found.append(("sum", total.id, tuple(p.id for p in parts) + (act,)))
        for state, w in by_q.get("memory.train_state_bytes", []):
            if _same(v, w, ("params", "bytes_per_param", "tp", "pp")):
                found.append(("sum", total.id, (state.id, act)))
    for s in range(4):
        for total, v in by_q.get(f"memory.per_gpu_bytes.zero{s}", []):
            act = _ref(total, "activation_bytes")
            for zero, w in by_q.get(f"zero.bytes_per_gpu.stage{s}", []):
                if act is not None and _same(v, w, ("params", "dp", "k")):
                    found.append(("sum", total.id, (zero.id, act)))
    for sched in Schedule:
        for total, v in by_q.get(f"pp.step_ticks.{sched}", []):
            shared = ("p", "m", "t_f", "t_b") + (("v",) if sched == Schedule.INTERLEAVED else ())
            busy = [c for c, w in by_q.get("pp.busy_ticks", [])
                    if _same(v, w, shared) and (sched == Schedule.INTERLEAVED or w.get("v", 1) == 1)]
            idle = [c for c, w in by_q.get(f"pp.idle_ticks.{sched}", []) if _same(v, w, shared)]
            if len(busy) == 1 and len(idle) == 1:
                found.append(("sum", total.id, (busy[0].id, idle[0].id)))
    for zero, v in by_q.get("zero.bytes_per_gpu.stage0", []):
        for state, w in by_q.get("memory.train_state_bytes", []):
            if v["params"] == w.get("params") and w.get("bytes_per_param") == 4 + v["k"] \
                    and w.get("tp") == 1 and w.get("pp") == 1:
                found.append(("equal", "", (zero.id, state.id)))

    stated = {(k.kind, k.total or "", frozenset(p for p in k.parts if isinstance(p, str))) for k in key.checks}
    out: list[Check] = []
    seen: set[tuple[str, str, frozenset[str]]] = set()
    for kind, total_id, part_ids in found:
        sig = (kind, total_id, frozenset(part_ids))
        if sig in stated or sig in seen:
            continue
        seen.add(sig)
        ids = "+".join(part_ids) + (f"={total_id}" if total_id else "")
        out.append(Check(id=f"auto:{kind}:{ids}", kind=kind, total=total_id or None, parts=tuple(part_ids),
                         note="automatic: a known relation between the claims' quantities (distcheck.audit.relations)"))
    return out
