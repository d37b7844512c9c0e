"""Recorded pieces of a training step mapped back to full tensors (the rank side records them:
:mod:`distcheck.parallel.step.trace`, whose module doc gives the rules), and the declared layouts of hand-written
sharding (``StepTarget(shard_dims=...)``). numpy only: the mapping runs in the parent, no collective inside a hook.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from distcheck.engine.contracts.errors import ProtocolError

if TYPE_CHECKING:
    from distcheck.parallel.step.reference import StepLayout

__all__ = ["check_shard_dims", "declared", "Unmapped", "assemble", "assemble_params"]

#: the values a target may declare for a tensor's layout over tp (besides a dim)
_LAYOUTS = ("replicated", "sum")
#: numpy's reduction of each Partial placement's reduce_op
_REDUCTIONS = {"sum": "sum", "avg": "mean", "max": "max", "min": "min"}


def check_shard_dims(spec: Any, shown: str) -> None:
    """A :class:`~distcheck.parallel.step.hooks.StepTarget`'s ``shard_dims`` checked: None, a mapping of names
    (parameter names, covering their gradients and AdamW moments; module names, covering their outputs;
    ``"<module>:input"``, a module's input gradient; as ``named_parameters()``/``named_modules()`` give them,
    wrappers' components removed) to an int dim, ``"replicated"`` or ``"sum"``, or a callable of one argument (a
    name) returning one of those or None (left to the shapes). ProtocolError naming the target otherwise."""
    if spec is None:
        return
    if isinstance(spec, Mapping):
        for name, value in spec.items():
            _check_layout(name, value, shown)
        return
    if not callable(spec):
        raise ProtocolError("target", shown, f"StepTarget shard_dims={spec!r} must be a dict of names to a dim, "
                            "\"replicated\" or \"sum\", or a callable of a name")
    from distcheck.engine.contracts.targets import check_call_shape

    check_call_shape(spec, shown, "StepTarget shard_dims, a callable, must take 1 positional argument (a name)", 1)


def _check_layout(name: Any, value: Any, shown: str) -> None:
    if not isinstance(name, str):
        raise ProtocolError("target", shown, f"StepTarget shard_dims key {name!r} must be a name (a str)")
    if isinstance(value, bool) or not (isinstance(value, int) or value in _LAYOUTS):
        raise ProtocolError("target", shown, f"StepTarget shard_dims[{name!r}] = {value!r} must be a dim (an int), "
                            "\"replicated\" or \"sum\"")


def declared(spec: Any, names: list[str], shown: str = "the target") -> dict[str, int | str]:
    """``shard_dims`` (:func:`check_shard_dims`) evaluated on ``names``: name -> dim, ``"replicated"`` or
    ``"sum"``, for those it declares (a callable's None and a mapping's missing names are left to the shapes).
    ProtocolError for a callable's answer that is none of these."""
    if spec is None:
        return {}
    out: dict[str, int | str] = {}
    for name in names:
        value = spec.get(name) if isinstance(spec, Mapping) else spec(name)
        if value is not None:
            _check_layout(name, value, shown)
            out[name] = value
    return out


class Unmapped(Exception):
    """A recorded tensor that cannot be mapped back to the reference's full tensor (the reason is the message)."""


@dataclass
class _Candidate:
    """One full tensor assembled from ``ranks``' pieces; ``owner[i]`` the rank whose piece holds entry i (-1:
    every rank of the candidate, a sum); ``alternative``: also accepted when it is within the bound."""

    ranks: list[int]
    array: np.ndarray
    owner: np.ndarray
    alternative: _Candidate | None = None


def _concat(items: list[tuple[np.ndarray, np.ndarray]], dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([a for a, _ in items], axis=dim), np.concatenate([o for _, o in items], axis=dim)


def _reduce(op: str, items: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    arrays = np.stack([a for a, _ in items])
    if op not in _REDUCTIONS:
        raise Unmapped(f"a Partial({op}) placement, which has no numpy reduction here")
    return getattr(np, _REDUCTIONS[op])(arrays, axis=0), np.full(arrays.shape[1:], -1)


def _dtensor(pieces: dict[int, dict], ref_shape: tuple) -> list[_Candidate]:
    """The full tensors of one mesh's DTensor pieces (module doc)."""
    first = next(iter(pieces.values()))
    placements, mesh_shape, mesh = first["placements"], first["mesh_shape"], first["mesh"]
    if any(p[0] == "strided" for p in placements):
        raise Unmapped(f"placements {_shown(placements)}: a strided shard (FSDP2 over tp) inside a hook")
    if len(pieces) != len(mesh) or set(pieces) != set(mesh):
        raise Unmapped(f"its mesh has ranks {list(mesh)}, of which only {sorted(pieces)} recorded it")
    entries: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for r, pc in pieces.items():
        local = np.asarray(pc["local"])
        entries[pc["coord"]] = (local, np.full(local.shape, r))
    for i in reversed(range(len(mesh_shape))):  # the innermost mesh dim first (DTensor shards in mesh order)
        kind = placements[i][0]
        if kind == "replicate":
            continue
        groups: dict[tuple, list] = defaultdict(list)
        for coord, item in entries.items():
            groups[coord[:i] + (None,) + coord[i + 1:]].append((coord[i], item))
        entries = {}
        for key, items in groups.items():
            ordered = [it for _, it in sorted(items, key=lambda x: x[0])]
            entries[key] = _concat(ordered, placements[i][1]) if kind == "shard" else _reduce(placements[i][1],
                                                                                               ordered)
    shape = tuple(first["shape"])
    out = []
    for key, (array, owner) in entries.items():
        if array.shape != shape:
            raise Unmapped(f"placements {_shown(placements)} assemble shape {array.shape}, not its global {shape}")
        ranks = sorted(r for r, pc in pieces.items()
                       if all(k is None or k == c for k, c in zip(key, pc["coord"], strict=True)))
        out.append(_Candidate(ranks, array, owner))
    if shape != tuple(ref_shape):
        raise Unmapped(f"its global shape {shape} is not the reference's {tuple(ref_shape)}")
    return out


def _shown(placements: tuple) -> str:
    names = {"shard": "Shard", "strided": "_StridedShard", "partial": "Partial", "replicate": "Replicate"}
    return "(" + ", ".join(f"{names[p[0]]}({', '.join(map(str, p[1:]))})" for p in placements) + ")"


def _plain(pieces: dict[int, dict], ref_shape: tuple, layout: StepLayout, layout_of: int | str | None,
           alternative_sum: bool) -> list[_Candidate]:
    """The full tensors of plain pieces, one tp group at a time (module doc)."""
    from distcheck.core.vocab import Axis

    groups: dict[tuple, list[int]] = defaultdict(list)
    for r in pieces:
        c = layout.coordinates(r)
        groups[(c[Axis.PP], c[Axis.DP_REPLICATE], c[Axis.DP_SHARD])].append(r)
    ref_shape = tuple(ref_shape)
    out: list[_Candidate] = []
    for ranks in groups.values():
        ranks.sort(key=lambda r: layout.coordinates(r)[Axis.TP])
        arrays = [np.asarray(pieces[r]["local"]) for r in ranks]
        shapes = [a.shape for a in arrays]
        how = layout_of if layout_of is not None else _infer(shapes, ref_shape)
        owners = [np.full(a.shape, r) for a, r in zip(arrays, ranks, strict=True)]
        if isinstance(how, int):
            try:
                array, owner = _concat(list(zip(arrays, owners, strict=True)), how)
            except (ValueError, IndexError):
                array = None
            if array is None or array.shape != ref_shape:
                raise Unmapped(f"split on dim {how} over tp: the tp ranks' shapes {shapes} do not make the reference's "
                               f"{ref_shape}")
            out.append(_Candidate(ranks, array, owner))
            continue
        if any(s != ref_shape for s in shapes):
            raise Unmapped(f"{how}: the tp ranks' shapes {shapes} are not the reference's {ref_shape}")
        if how == "sum":
            out.append(_Candidate(ranks, *_reduce("sum", list(zip(arrays, owners, strict=True)))))
            continue
        summed = _Candidate(ranks, *_reduce("sum", list(zip(arrays, owners, strict=True))))
        for r, a, o in zip(ranks, arrays, owners, strict=True):
            out.append(_Candidate([r], a, o, summed if alternative_sum and len(ranks) > 1 else None))
    return out


def _infer(shapes: list[tuple], ref_shape: tuple) -> int | str:
    """``"replicated"`` when every shape is the reference's; the one dim the tp ranks split it on; else Unmapped."""
    if all(s == ref_shape for s in shapes):
        return "replicated"
    if any(len(s) != len(ref_shape) for s in shapes):
        raise Unmapped(f"the tp ranks' shapes {shapes} do not have the reference's {len(ref_shape)} dims")
    differ = {i for s in shapes for i, (a, b) in enumerate(zip(s, ref_shape, strict=True)) if a != b}
    if len(differ) == 1:
        (dim,) = differ
        if sum(s[dim] for s in shapes) == ref_shape[dim]:
            return dim
    raise Unmapped(f"the tp ranks' shapes {shapes} are not the reference's {ref_shape} split along one dim over tp "
                   "(StepTarget(shard_dims=...) can say how it is laid out)")


def assemble(pieces: dict[int, dict], ref_shape: tuple, layout: StepLayout, layout_of: int | str | None = None, *,
             alternative_sum: bool = False) -> list[_Candidate]:
    """Every full tensor the ranks' ``pieces`` (rank -> :func:`piece`) of one recorded tensor stand for, each
    with the ranks it came from (module doc): DTensor pieces by their placements, one mesh at a time; plain
    pieces over each tp group, by ``layout_of`` (a dim, ``"replicated"``, ``"sum"``) or else by their shapes
    against ``ref_shape``. ``alternative_sum``: a replicated plain tensor may also be a partial sum over tp
    (a gradient of one micro-batch). Raises :class:`Unmapped` with the reason when they cannot be mapped."""
    meshes: dict[tuple, dict[int, dict]] = defaultdict(dict)
    plain: dict[int, dict] = {}
    for r, pc in pieces.items():
        if "placements" in pc:
            meshes[pc["mesh"]][r] = pc
        else:
            plain[r] = pc
    out: list[_Candidate] = []
    for group in meshes.values():
        out += _dtensor(group, ref_shape)
    if plain:
        out += _plain(plain, ref_shape, layout, layout_of, alternative_sum)
    return out


def assemble_params(layout: StepLayout, results: list, shapes: Mapping[str, tuple]) -> list:
    """``results`` (every rank's :func:`~distcheck.parallel.step.harness.run_step` record: ``steps``, and
    ``shard_dims``) with each plain parameter and AdamW moment that is a shard of the full tensor (a Megatron-style
    tp split: its shape is not ``shapes[name]``, the unparallelized model's) replaced, on each rank of its tp group,
    by the full tensor assembled over the group (:func:`assemble`, the ranks' declared ``shard_dims`` first); one
    that cannot be mapped is left as it is (the check then names its shape). DTensors are already full tensors
    there. A new list; ``results`` is not changed."""
    shard: dict[str, Any] = {}
    for res in results:
        shard.update(res.get("shard_dims", {}))
    out = [dict(res, steps=[dict(st) for st in res["steps"]]) for res in results]
    for name, shape in shapes.items():
        for s in range(len(out[0]["steps"]) if out else 0):
            held = [i for i, res in enumerate(out) if res["steps"][s]["params"].get(name) is not None]
            if all(np.shape(out[i]["steps"][s]["params"][name]) == tuple(shape) for i in held):
                continue
            _replace(out, s, held, name, tuple(shape), layout, shard.get(name))
    return out


def _replace(out: list, s: int, held: list[int], name: str, shape: tuple, layout: StepLayout,
             layout_of: Any) -> None:
    def full(get: Callable[[dict], Any], put: Callable[[dict, Any], None]) -> None:
        pieces = {i: {"local": get(out[i]["steps"][s])} for i in held if get(out[i]["steps"][s]) is not None}
        try:
            cands = assemble(pieces, shape, layout, layout_of)
        except Unmapped:
            return
        for c in cands:
            for i in c.ranks:
                put(out[i]["steps"][s], c.array)

    def put_param(st: dict, a: Any) -> None:
        st["params"] = dict(st["params"], **{name: a})

    def get_param(st: dict) -> Any:
        return st["params"].get(name)

    full(get_param, put_param)
    for j in (0, 1):
        def get_state(st: dict, j: int = j) -> Any:
            return st["state"].get(name, (None, None))[j]

        def put_state(st: dict, a: Any, j: int = j) -> None:
            moments = list(st["state"][name])
            moments[j] = a
            st["state"] = dict(st["state"], **{name: tuple(moments)})

        full(get_state, put_state)
