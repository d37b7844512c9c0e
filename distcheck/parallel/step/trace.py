"""The first divergence of a failing training step: every tensor of the step recorded on every rank and in the
single-device reference, mapped back to full tensors, and the first one in execution order that leaves its bound.

The ``training-step`` contract replays a failure's shrunk case once more with recording on
(:meth:`~distcheck.parallel.step.contracts.TrainingStep.explain`); a case that passes is never recorded, and no
hook is attached outside that replay. What is recorded (:class:`Recorder`), per step:

* per micro-batch, in execution order: every named module's forward ``output``; the gradient of the loss with
  respect to the model's output (``output grad`` of the root module: the loss hook's gradient); in the order
  the backward produces them, every module's ``input grad`` (full backward hooks: the gradient with respect to
  the module's inputs, this module's contribution only) and every parameter's ``grad`` (a hook on the tensor
  the forward used: FSDP2's unsharded parameter, DDP's before its all-reduce; the micro-batch's own
  gradient, before any reduction);
* then the step's: the reported ``loss`` and ``tokens``, every parameter's ``reduced grad`` (after every
  micro-batch and reduction, what the clipping hook is given), the reported ``grad norm``, the ``clipped grad``,
  AdamW's ``exp_avg`` and ``exp_avg_sq`` and the updated ``param``.

Module and parameter names are ``named_modules()``'s and ``named_parameters()``'s, wrappers' prefixes removed
(``module.``, ``_orig_mod.``, ``_checkpoint_wrapped_module.``). The reference runs the same decoder on each dp
rank's micro-batches one at a time, with the default loss hook's weight (a micro-batch's per-token losses times
``dp / T``), so its activations and gradients are those every rank must produce; its gradients are divided by dp
after the last micro-batch (the mean over dp ranks FSDP2 and DDP take).

Mapping back to full tensors (:func:`assemble`, in the parent, from every rank's pieces: no collective runs
inside a hook):

* a DTensor recorded inside a hook keeps its local tensor, global shape, mesh and placements: ``Shard(d)``
  pieces are concatenated along d in mesh order (the innermost mesh dim first), ``Partial`` pieces summed
  (``avg`` averaged), and each ``Replicate`` coordinate is compared on its own; a ``_StridedShard`` (FSDP2 over
  tp, only on sharded parameters, which FSDP2 unshards before the forward) cannot be mapped inside a hook and
  is skipped with the reason. The step's tensors (reduced and clipped gradients, AdamW's state, the parameters)
  are gathered on each rank with ``full_tensor()``, which maps every placement, strided shards included;
* a plain tensor is mapped over its tp group (the ranks of one pp stage and dp coordinate): with the shape of
  the reference's, each rank's is compared as it is (replicated); a plain tensor that is the reference's split
  along exactly one dim (the tp ranks' sizes along it adding up to the reference's, sequence-parallel activations
  or a Megatron-style weight shard) is concatenated over tp in tp order. A target says what the shapes cannot
  (:func:`declared`, ``StepTarget(shard_dims=...)``): the dim a tensor is split on, ``"replicated"``, or
  ``"sum"`` (partial sums over tp, added up). A replicated parameter's gradient of one micro-batch may be each
  rank's own or a partial sum over tp (a sequence-parallel norm's weight, summed later): either is accepted,
  and its reduced gradient decides;
* under pipeline parallelism a module lives on one stage: the ranks of that stage hold it. A stage's root
  module is not the model's, and is not recorded; the schedule's micro-batches are told apart by their order
  (the schedule's first step also runs each stage once for its shapes: the last m calls of a step are kept).

The bound (:func:`recorded_bound`), the contract's (:mod:`distcheck.parallel.step.bound`): each value v of a
recorded tensor is held to ``2^-32 (|v_ref| + S)``, ``S`` the largest magnitude of the reference's tensors of
the same kind in the same step (a gradient that cancels to 0 keeps the rounding of its terms); the updated
parameters and AdamW's moments to the contract's bounds (the moments' carried through AdamW's update); the
reported loss and grad norm to ``2^-31 |v_ref|``; the reported tokens are exact. The reference starts each
step from the state the ranks reached, as the contract's does. The report (:func:`first_divergence`) names the
first tensor in execution order (the forwards of a micro-batch in module call order, its backward in the order
gradients are produced, micro-batches in order, then the step's tensors in the order above) that leaves its
bound: kind, module or parameter name, step (from 1), micro-batch (from 0), the ranks at fault, the error and
the bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from distcheck.engine.contracts.errors import ProtocolError

if TYPE_CHECKING:
    from distcheck.parallel.step.case import StepCase
    from distcheck.parallel.step.reference import StepLayout

__all__ = ["OUTPUT", "OUTPUT_GRAD", "INPUT_GRAD", "GRAD", "LOSS", "TOKENS", "REDUCED_GRAD", "NORM", "CLIPPED_GRAD",
           "EXP_AVG", "EXP_AVG_SQ", "PARAM", "PER_MICROBATCH", "Recorder", "NoRecorder", "piece", "reference_trace",
           "recorded_bound", "within", "assemble", "Unmapped", "first_divergence", "check_shard_dims", "declared",
           "assemble_params", "explain_step", "normalize"]

OUTPUT, OUTPUT_GRAD, INPUT_GRAD, GRAD = "output", "output grad", "input grad", "grad"
LOSS, TOKENS, REDUCED_GRAD, NORM, CLIPPED_GRAD = "loss", "tokens", "reduced grad", "grad norm", "clipped grad"
EXP_AVG, EXP_AVG_SQ, PARAM = "exp_avg", "exp_avg_sq", "param"
#: the kinds recorded once per micro-batch (the others once per step)
PER_MICROBATCH = frozenset({OUTPUT, OUTPUT_GRAD, INPUT_GRAD, GRAD})
#: the kinds compared exactly (integers)
_EXACT = frozenset({TOKENS})
#: the values a target may declare for a tensor's layout over tp (besides a dim)
_LAYOUTS = ("replicated", "sum")
#: numpy's reduction of each Partial placement's reduce_op
_REDUCTIONS = {"sum": "sum", "avg": "mean", "max": "max", "min": "min"}
#: the name components wrappers add (torch.compile, activation checkpointing, DDP)
_WRAPPERS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "module"})


def normalize(name: str) -> str:
    """``name`` without the components wrappers add (``module``, ``_orig_mod``, ``_checkpoint_wrapped_module``):
    a wrapped module is named as the module it wraps."""
    return ".".join(c for c in name.split(".") if c not in _WRAPPERS)


# ---------------------------------------------------------------------------------------------------- rank side


def _numpy(t: Any) -> np.ndarray:
    import torch

    return t.detach().to(device="cpu", dtype=torch.float64).numpy().copy()


def _placement(p: Any) -> tuple:
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(p, _StridedShard):
        return ("strided", int(p.dim), int(p.split_factor))
    if p.is_shard():
        return ("shard", int(p.dim))
    if p.is_partial():
        return ("partial", str(p.reduce_op))
    return ("replicate",)


def piece(t: Any) -> dict:
    """What a rank keeps of tensor ``t``: ``{"local": array}`` (float64), and for a DTensor also its global
    ``shape``, ``placements`` (``("shard", d)``, ``("strided", d, split_factor)``, ``("partial", op)``,
    ``("replicate",)``), its mesh's ranks (``mesh``, flattened, and ``mesh_shape``) and this rank's ``coord``."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        mesh, coord = t.device_mesh, t.device_mesh.get_coordinate() or ()
        return {"local": _numpy(t.to_local().detach()), "shape": tuple(t.shape),
                "placements": tuple(_placement(p) for p in t.placements),
                "mesh": tuple(int(r) for r in mesh.mesh.flatten().tolist()), "mesh_shape": tuple(mesh.mesh.shape),
                "coord": tuple(int(c) for c in coord)}
    return {"local": _numpy(t)}


def _full_piece(t: Any) -> dict:
    """A step-level tensor: a DTensor gathered with ``full_tensor()`` (a collective of its mesh), else ``piece``."""
    return {"local": _numpy(t.full_tensor())} if hasattr(t, "full_tensor") else piece(t)


def _tensors(value: Any) -> list[tuple[int, Any]]:
    """The floating-point tensors of a module's output or gradients: ``[(part, tensor)]``."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(0, value)] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return []


class NoRecorder:
    """The recorder of a step that records nothing (every method does nothing): the run of every example."""

    def begin_step(self, step: int) -> None: ...
    def begin_microbatch(self, k: int) -> None: ...
    def after_backward(self, model: Any, loss: Any, tokens: Any) -> None: ...
    def after_clip(self, model: Any, norm: Any) -> None: ...
    def after_optimizer(self, model: Any, opt: Any) -> None: ...
    def close(self) -> list:
        return []


class Recorder(NoRecorder):
    """Hooks on every named module of ``model`` (module doc) that append to :attr:`events` tuples
    ``(step, micro-batch, dp index, call, kind, name, part, piece)``; ``micro-batch`` is None under a pipeline
    schedule (``pipelined``), where the parent tells them apart by order. ``call`` counts the calls of one
    module (or gradients of one tensor) in one micro-batch (in one step under pp); ``part`` indexes a tuple's
    tensors. :meth:`close` removes every hook and returns the events."""

    def __init__(self, model: Any, *, dp_index: int = 0, pipelined: bool = False) -> None:
        import warnings

        # a module whose inputs need no gradient (the embedding, the root) still reports its input gradients: None
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                                "respect to module outputs")
        self.events: list[tuple] = []
        self.step, self.dp_index, self.pipelined = 0, dp_index, pipelined
        self.microbatch: int | None = None if pipelined else 0
        self._calls: dict = {}
        self._grad_names: dict[int, list[str]] = {}
        self._grad_handles: list = []
        modules: dict[str, Any] = {}
        for name, mod in model.named_modules():  # pre-order: a wrapper's inner module replaces it
            modules[normalize(name)] = mod
        self._handles = []
        for name, mod in modules.items():
            self._handles.append(mod.register_forward_pre_hook(partial(self._pre, name)))
            if pipelined and name == "":  # a stage's root is a cut of the model, not the reference's root
                continue
            self._handles.append(mod.register_forward_hook(partial(self._output, name)))
            self._handles.append(mod.register_full_backward_hook(partial(self._input_grad, name)))
            if name == "":
                self._handles.append(mod.register_full_backward_pre_hook(partial(self._output_grad, name)))

    def _add(self, kind: str, name: str, part: int, p: dict) -> None:
        mb = self.microbatch if kind in PER_MICROBATCH else None
        key = (self.step, mb, self.dp_index, kind, name, part)
        call = self._calls[key] = self._calls.get(key, -1) + 1
        self.events.append((self.step, mb, self.dp_index, call, kind, name, part, p))

    def _pre(self, name: str, mod: Any, args: Any) -> None:
        for pname, p in mod.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{name}.{pname}" if name else pname
            names = self._grad_names.get(id(p))
            if names is None:  # one hook per tensor and step; a tied tensor is recorded under each of its names
                self._grad_names[id(p)] = names = []
                self._grad_handles.append(p.register_hook(partial(self._grad, names)))
            if full not in names:
                names.append(full)

    def _grad(self, names: list[str], g: Any) -> None:
        p = piece(g)
        for n in names:
            self._add(GRAD, n, 0, p)

    def _output(self, name: str, mod: Any, args: Any, output: Any) -> None:
        for part, t in _tensors(output):
            self._add(OUTPUT, name, part, piece(t))

    def _output_grad(self, name: str, mod: Any, grad_output: Any) -> None:
        for part, g in _tensors(grad_output):
            self._add(OUTPUT_GRAD, name, part, piece(g))

    def _input_grad(self, name: str, mod: Any, grad_input: Any, grad_output: Any) -> None:
        for part, g in _tensors(grad_input):
            self._add(INPUT_GRAD, name, part, piece(g))

    def begin_step(self, step: int) -> None:
        """Start step ``step`` (from 0): the parameter hooks of the last step removed (FSDP2 may give a step
        other unsharded tensors), the call counts reset."""
        for h in self._grad_handles:
            h.remove()
        self._grad_handles, self._grad_names, self._calls = [], {}, {}
        self.step = step
        if not self.pipelined:
            self.microbatch = 0

    def begin_microbatch(self, k: int) -> None:
        if not self.pipelined:
            self.microbatch = k

    def _named(self, model: Any) -> list[tuple[str, Any]]:
        return [(normalize(n), p) for n, p in model.named_parameters(remove_duplicate=False)]

    def _once(self, kind: str, named: list[tuple[str, Any]], value: Callable[[Any], Any]) -> None:
        """``value(p)`` of every named parameter (None: not recorded), gathered once per tensor (a collective of
        its mesh for a DTensor) and recorded under each of its names."""
        seen: dict[int, dict | None] = {}
        for name, p in named:
            if id(p) not in seen:
                v = value(p)
                seen[id(p)] = None if v is None else _full_piece(v)
            pc = seen[id(p)]
            if pc is not None:
                self._add(kind, name, 0, pc)

    def _grads(self, kind: str, model: Any) -> None:
        self._once(kind, self._named(model), lambda p: p.grad)

    def after_backward(self, model: Any, loss: Any, tokens: Any) -> None:
        """The reported loss and tokens, then every parameter's gradient after the last micro-batch."""
        self._add(LOSS, "", 0, {"local": np.float64(_scalar(loss))})
        self._add(TOKENS, "", 0, {"local": np.float64(_scalar(tokens))})
        self._grads(REDUCED_GRAD, model)

    def after_clip(self, model: Any, norm: Any) -> None:
        """The grad norm the clipping hook returned, then every parameter's clipped gradient."""
        self._add(NORM, "", 0, {"local": np.float64(_scalar(norm))})
        self._grads(CLIPPED_GRAD, model)

    def after_optimizer(self, model: Any, opt: Any) -> None:
        """AdamW's moments and the updated parameters, by name."""
        named = self._named(model)
        for kind in (EXP_AVG, EXP_AVG_SQ):  # kind by kind, as torch's foreach AdamW updates them
            self._once(kind, named, partial(_moment, opt, kind))
        self._once(PARAM, named, lambda p: p)

    def close(self) -> list:
        for h in self._handles + self._grad_handles:
            h.remove()
        self._handles, self._grad_handles = [], []
        return self.events


def _moment(opt: Any, kind: str, p: Any) -> Any:
    return opt.state.get(p, {}).get(kind)


def _scalar(value: Any) -> float:
    from distcheck.parallel.step.hooks import as_float

    return as_float(value)


def reference_trace(case: StepCase, tokens: Any, labels: Any, starts: list[dict] | None = None,
                    target: Any = None, initial: dict | None = None) -> dict:
    """The single-device float64 step recorded (module doc): each dp rank's micro-batches run one at a time
    (``tokens``, ``labels``: ``(steps, dp, m, micro_batch_size, seq_len)``), the loss of each its per-token sum
    (the target's ``loss`` hook) times ``dp / T``, the gradients divided by dp after the last, torch's
    ``clip_grad_norm_`` and AdamW; step s + 1 from ``starts[s]``; ``target`` and ``initial`` as the contract's
    reference step takes them (:func:`~distcheck.parallel.step.harness.reference_step`: the model factory, its
    ``batch`` and ``loss`` hooks, rank 0's initial weights). Returns ``{"events": [...], "tied": {name: [the
    other names of the same tensor]}}``."""
    import torch

    from distcheck.parallel.step.case import weights
    from distcheck.parallel.step.harness import ADAMW, _load, build_target_model
    from distcheck.parallel.step.hooks import StepInfo, StepTarget, call_model
    from distcheck.parallel.step.model import IGNORE_INDEX, build_model
    from distcheck.parallel.step.reference import StepLayout

    target = target or StepTarget(lambda model, mesh, layout: model)
    if target.model is None:
        model = build_model(case.config, weights(case))
    else:
        model = build_target_model(target.model, case.config, case.seed)
        if initial is not None:
            model.load_state_dict({k: torch.as_tensor(v) for k, v in initial.items()})
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, **ADAMW)
    rec = Recorder(model)
    dp = case.layout.dp
    for s in range(case.steps):
        if s and starts is not None:
            _load(model, opt, starts[s - 1])
        rec.begin_step(s)
        opt.zero_grad()
        total = int((labels[s] != IGNORE_INDEX).sum())
        loss_sum = torch.zeros((), dtype=torch.float64)
        for d in range(dp):
            rec.dp_index = d
            for k in range(case.microbatches):
                rec.begin_microbatch(k)
                x, y = tokens[s, d, k], labels[s, d, k]
                info = StepInfo(StepLayout(), None, total, int((y != IGNORE_INDEX).sum()), 1, case.max_norm, 0,
                                target.loss)
                per_token = target.loss(call_model(model, target.batch(x, y, info)), y, info)
                (per_token * dp / total).backward()
                loss_sum += per_token.detach()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(dp)
        rec.after_backward(model, loss_sum / total, total)
        rec.after_clip(model, torch.nn.utils.clip_grad_norm_(model.parameters(), case.max_norm))
        opt.step()
        rec.after_optimizer(model, opt)
    names: dict[int, list[str]] = defaultdict(list)
    for name, p in model.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    tied = {n: [o for o in group if o != n] for group in names.values() if len(group) > 1 for n in group}
    return {"events": rec.close(), "tied": tied}


# ---------------------------------------------------------------------------------------------------- the mapping


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


# ---------------------------------------------------------------------------------------------------- the bound


def recorded_bound(kind: str, ref: np.ndarray, floor: float) -> np.ndarray:
    """The bound of every entry of a recorded tensor of ``kind`` against the reference's ``ref``, the contract's
    (:mod:`~distcheck.parallel.step.bound`): the reported tokens exact (0); the reported loss and grad norm, sums
    of terms of one sign, ``2^-31 |v_ref|``; every other value ``2^-32 (|v_ref| + S)``, ``S`` = ``floor``, the
    largest magnitude of the reference's tensors of its kind in the step (``value_bound``). The updated
    parameters and AdamW's moments are held to ``param_bounds`` instead (:func:`first_divergence`). The one place
    the recorder's bound of a kind is chosen."""
    from distcheck.parallel.step.bound import value_bound

    shape = np.shape(ref)
    if kind in _EXACT:
        return np.zeros(shape)
    if kind in (LOSS, NORM):
        return 2 * value_bound(ref, 0.0).reshape(shape)
    return value_bound(ref, floor).reshape(shape)


@dataclass
class _Fit:
    ok: bool
    error: float = 0.0
    bound: float = 0.0
    index: tuple = ()
    expected: float = 0.0
    got: float = 0.0
    bad: np.ndarray | None = None


def within(ref: np.ndarray, got: np.ndarray, bound: np.ndarray) -> _Fit:
    """Whether ``got`` is within ``bound`` (an array of ``ref``'s shape, :func:`recorded_bound`) of ``ref``; the
    worst entry's index, values, error and bound, and the mask of entries outside. Unmapped for another shape."""
    e = np.asarray(ref, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    if g.shape != e.shape:
        raise Unmapped(f"shape {g.shape}, the reference's {e.shape}")
    err = np.abs(g - e)
    err = np.where(np.isnan(err), np.inf, err)
    bad = err > bound
    if not bad.any():
        return _Fit(True, float(err.max()) if err.size else 0.0, float(bound.max()) if bound.size else 0.0)
    i = np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), e.shape)
    return _Fit(False, float(err[i]), float(bound[i]), tuple(int(j) for j in i), float(e[i]), float(g[i]), bad)


# ---------------------------------------------------------------------------------------------------- the report


def _index(results: list, layout: StepLayout, m: int) -> dict[tuple, dict[int, dict]]:
    """Every rank's events by key ``(step, micro-batch, dp index, call, kind, name, part)`` (micro-batch, dp index
    and call None for a step's tensors) -> rank -> piece; under pp the last m calls of a step are its m
    micro-batches."""
    got: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r, res in enumerate(results):
        d = layout.dp_index(r)
        calls: dict[tuple, list[dict]] = defaultdict(list)
        for s, mb, _, call, kind, name, part, pc in res["trace"]:
            if kind not in PER_MICROBATCH:
                got[(s, None, None, None, kind, name, part)][r] = pc
            elif mb is None:  # a pipeline schedule's
                calls[(s, kind, name, part)].append(pc)
            else:
                got[(s, mb, d, call, kind, name, part)][r] = pc
        for (s, kind, name, part), pcs in calls.items():
            for k, pc in enumerate(pcs[-m:]):
                got[(s, k, d, 0, kind, name, part)][r] = pc
    return got


def _what(kind: str, name: str, part: int, tied: list[str]) -> str:
    shown = (name or "the model") + (f"[{part}]" if part else "")
    also = f" (tied to {', '.join(tied)} in the reference)" if tied else ""
    return {OUTPUT: f"output of {shown}", OUTPUT_GRAD: f"gradient of the loss w.r.t. the output of {shown}",
            INPUT_GRAD: f"input grad of {shown}", GRAD: f"grad of {shown}{also}",
            REDUCED_GRAD: f"reduced grad of {shown}{also} (after every micro-batch, before clipping)",
            CLIPPED_GRAD: f"clipped grad of {shown}{also}", EXP_AVG: f"AdamW exp_avg of {shown}{also}",
            EXP_AVG_SQ: f"AdamW exp_avg_sq of {shown}{also}", PARAM: f"updated parameter {shown}{also}",
            LOSS: "the reported loss", TOKENS: "the reported tokens",
            NORM: "the grad norm the clipping hook returned"}[kind]


def _ranks(ranks: list[int]) -> str:
    rs = sorted(set(ranks))
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def _slots(ref_events: list, layout: StepLayout) -> tuple[dict, dict, list]:
    """The reference's tensors by key, the floor of each (step, kind) and the slots in execution order (module
    doc): per step, each micro-batch's tensors in the order dp rank 0's were made, then the step's."""
    floors: dict[tuple, float] = defaultdict(float)
    ref: dict[tuple, np.ndarray] = {}
    slots: list[tuple] = []
    for pos, (s, mb, d, call, kind, name, part, pc) in enumerate(ref_events):
        if layout.pp > 1 and name == "" and kind in PER_MICROBATCH:
            continue  # a stage's root is a cut of the model: the model's own root is on no rank
        a = np.asarray(pc["local"], dtype=np.float64)
        floors[(s, kind)] = max(floors[(s, kind)], float(np.abs(a).max()) if a.size else 0.0)
        if kind in PER_MICROBATCH:
            ref[(s, mb, d, call, kind, name, part)] = a
            if d == 0:
                slots.append(((s, 0, mb, pos), (s, mb, call, kind, name, part)))
        else:
            ref[(s, None, None, None, kind, name, part)] = a
            slots.append(((s, 1, 0, pos), (s, None, None, kind, name, part)))
    slots.sort(key=lambda x: x[0])
    return ref, floors, [slot for _, slot in slots]


def _param_bounds(case: StepCase, ref_events: list) -> dict[tuple, np.ndarray]:
    """``(step, kind, name) -> bound`` of the updated parameters and AdamW's moments: the contract's
    (``param_bounds``: the moments' bounds carried through AdamW's update) from the reference's values."""
    from distcheck.parallel.step.bound import param_bounds
    from distcheck.parallel.step.harness import ADAMW

    states: list[dict] = [{"params": {}, "state": {}} for _ in range(case.steps)]
    for s, _, _, _, kind, name, _, pc in ref_events:
        if kind == PARAM:
            states[s]["params"][name] = np.asarray(pc["local"], dtype=np.float64)
        elif kind in (EXP_AVG, EXP_AVG_SQ):
            moments = states[s]["state"].setdefault(name, [None, None])
            moments[kind == EXP_AVG_SQ] = np.asarray(pc["local"], dtype=np.float64)
    bounds: dict[tuple, np.ndarray] = {}
    for s, per_name in enumerate(param_bounds(states, lr=case.lr, **ADAMW)):
        for name, (bp, bm, bv) in per_name.items():
            bounds.update({(s, PARAM, name): bp, (s, EXP_AVG, name): bm, (s, EXP_AVG_SQ, name): bv})
    return bounds


def _compare(want: np.ndarray, cands: list[_Candidate], bound: np.ndarray) -> tuple[_Fit | None, list[int]]:
    """The worst fit of the candidates outside ``bound`` (None when all are within) and the ranks at fault."""
    worst: _Fit | None = None
    bad: list[int] = []
    for c in cands:
        fit = within(want, c.array, bound)
        if not fit.ok and c.alternative is not None:
            alt = within(want, c.alternative.array, bound)
            fit = alt if alt.ok else fit
        if fit.ok:
            continue
        owners = set(np.unique(c.owner[fit.bad]).tolist()) if fit.bad is not None else {-1}
        bad += c.ranks if -1 in owners else sorted(owners)
        if worst is None or fit.error > worst.error:
            worst = fit
    return worst, bad


def first_divergence(case: StepCase, results: list, reference: dict) -> str:
    """The report of a recorded replay: ``results[r]`` holds rank r's ``trace`` and ``shard_dims`` (declared
    layouts), ``reference`` is :func:`reference_trace`'s (module doc). One line: ``first divergence: <tensor>,
    step s, micro-batch k, ranks ...: error e > bound b (...)``, how many tensors matched before it, and the
    tensors that could not be mapped (skipped, with the reason); or that none leaves its bound."""
    layout = case.layout
    tied = reference["tied"]
    got = _index(results, layout, case.microbatches)
    shard: dict[str, int | str] = {}
    for res in results:
        shard.update(res.get("shard_dims", {}))
    ref, floors, slots = _slots(reference["events"], layout)
    bounds = _param_bounds(case, reference["events"])
    matched, skipped = 0, []
    for s, mb, call, kind, name, part in slots:
        keys = ([(s, mb, d, call, kind, name, part) for d in range(layout.dp)] if kind in PER_MICROBATCH
                else [(s, None, None, None, kind, name, part)])
        what = _what(kind, name, part, tied.get(name, []))
        worst: _Fit | None = None
        bad_ranks: list[int] = []
        for key in keys:
            if not got.get(key):
                skipped.append(f"{what} (no rank recorded it)")
                continue
            bound = bounds.get((s, kind, name))
            if bound is None:
                bound = recorded_bound(kind, ref[key], floors[(s, kind)])
            try:
                cands = assemble(got[key], ref[key].shape, layout,
                                 shard.get(f"{name}:input" if kind == INPUT_GRAD else name),
                                 alternative_sum=kind == GRAD)
                fit, bad = _compare(ref[key], cands, bound)
            except Unmapped as exc:
                skipped.append(f"{what} ({exc})")
                continue
            bad_ranks += bad
            if fit is not None and (worst is None or fit.error > worst.error):
                worst = fit
        if worst is None:
            matched += 1
            continue
        at = f", step {s + 1}" + (f", micro-batch {mb}" if mb is not None else "")
        index = f"at index {worst.index}: " if worst.index else ""
        values = f"{index}expected {worst.expected:.17g}, got {worst.got:.17g}"
        error = (f"{values} (exact)" if kind in _EXACT else
                 f"error {worst.error:.2e} > bound {worst.bound:.2e} ({values})")
        return (f"first divergence: {what}{at}, {_ranks(bad_ranks)}: {error}; {matched} recorded tensors matched "
                f"before it" + _skipped(skipped))
    return (f"first divergence: none of the {matched} recorded tensors (every module's outputs and gradients, the "
            f"step's gradients, AdamW's state and the parameters) leaves its bound on the recorded replay"
            + _skipped(skipped))


def _skipped(skipped: list[str]) -> str:
    if not skipped:
        return ""
    shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return f"; not mapped, skipped: {shown}"


def explain_step(case: StepCase, results: list) -> str:
    """:func:`first_divergence` of every rank's recorded replay (``results``, :func:`~distcheck.parallel.step.
    harness.run_step` with ``record``: rank 0's carries the ``reference_trace``). numpy only: the parent runs no
    torch."""
    return first_divergence(case, results, results[0]["reference_trace"])


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
