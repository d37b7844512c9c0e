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
(``module.``, ``_orig_mod.``, ``_checkpoint_wrapped_module.``). The reference
(:func:`~distcheck.parallel.step.harness.reference_trace`, on rank 0) runs the same model on each dp rank's
micro-batches one at a time, with the default loss hook's weight (a micro-batch's per-token losses times
``dp / T``), so its activations and gradients are those every rank must produce; its gradients are divided by dp
after the last micro-batch (the mean over dp ranks FSDP2 and DDP take).

Mapping back to full tensors (:func:`~distcheck.parallel.step.mapping.assemble`, in the parent, from every rank's
pieces: no collective runs inside a hook):

* a DTensor recorded inside a hook keeps its local tensor, global shape, mesh and placements: ``Shard(d)``
  pieces are concatenated along d in mesh order (the innermost mesh dim first), ``Partial`` pieces summed
  (``avg`` averaged), and each ``Replicate`` coordinate is compared on its own; a ``_StridedShard`` (FSDP2 over
  tp, only on sharded parameters, which FSDP2 unshards before the forward) cannot be mapped inside a hook and
  is skipped with the reason. The step's tensors (reduced and clipped gradients, AdamW's state, the parameters)
  are gathered on each rank with ``full_tensor()``, which maps every placement, strided shards included;
* a plain tensor is mapped over its tp group (the ranks of one pp stage and dp coordinate): with the shape of the
  reference's, each rank's is compared as it is (replicated); a plain tensor that is the reference's split along
  exactly one dim (the tp ranks' sizes along it adding up to the reference's, sequence-parallel activations or a
  Megatron-style weight shard) is concatenated over tp in tp order. A target says what the shapes cannot
  (:func:`~distcheck.parallel.step.mapping.declared`, ``StepTarget(shard_dims=...)``): the dim a tensor is split on,
  ``"replicated"``, or ``"sum"`` (partial sums over tp, added up). A replicated parameter's gradient of one
  micro-batch may be each rank's own or a partial sum over tp (a sequence-parallel norm's weight, summed later):
  either is accepted, and its reduced gradient decides;
* under pipeline parallelism a module lives on one stage: the ranks of that stage hold it. A stage's root
  module is not the model's, and is not recorded; the schedule's micro-batches are told apart by their order
  (the schedule's first step also runs each stage once for its shapes: the last m calls of a step are kept).

The bound (:func:`~distcheck.parallel.step.divergence.recorded_bound`), the contract's
(:mod:`distcheck.parallel.step.bound`): each value v of a recorded tensor is held to ``2^-32 (|v_ref| + S)``, ``S``
the largest magnitude of the reference's tensors of the same kind in the same step (a gradient that cancels to 0
keeps the rounding of its terms); the updated parameters and AdamW's moments to the contract's bounds (the moments'
carried through AdamW's update); the reported loss and grad norm to ``2^-31 |v_ref|``; the reported tokens are
exact. The reference starts each step from the state the ranks reached, as the contract's does. The report
(:func:`~distcheck.parallel.step.divergence.first_divergence`) names the first tensor in execution order (the
forwards of a micro-batch in module call order, its backward in the order gradients are produced, micro-batches in
order, then the step's tensors in the order above) that leaves its bound: kind, module or parameter name, step (from
1), micro-batch (from 0), the ranks at fault, the error and the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

__all__ = ["OUTPUT", "OUTPUT_GRAD", "INPUT_GRAD", "GRAD", "LOSS", "TOKENS", "REDUCED_GRAD", "NORM", "CLIPPED_GRAD",
           "EXP_AVG", "EXP_AVG_SQ", "PARAM", "PER_MICROBATCH", "Recorder", "NoRecorder", "piece", "normalize",
           "tied_names"]

OUTPUT, OUTPUT_GRAD, INPUT_GRAD, GRAD = "output", "output grad", "input grad", "grad"
LOSS, TOKENS, REDUCED_GRAD, NORM, CLIPPED_GRAD = "loss", "tokens", "reduced grad", "grad norm", "clipped grad"
EXP_AVG, EXP_AVG_SQ, PARAM = "exp_avg", "exp_avg_sq", "param"
#: the kinds recorded once per micro-batch (the others once per step)
PER_MICROBATCH = frozenset({OUTPUT, OUTPUT_GRAD, INPUT_GRAD, GRAD})
#: the name components wrappers add (torch.compile, activation checkpointing, DDP)
_WRAPPERS = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "module"})


def normalize(name: str) -> str:
    """``name`` without the components wrappers add (``module``, ``_orig_mod``, ``_checkpoint_wrapped_module``):
    a wrapped module is named as the module it wraps."""
    return ".".join(c for c in name.split(".") if c not in _WRAPPERS)

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



def tied_names(model: Any) -> dict[str, list[str]]:
    """Parameter name -> the other names of the same tensor in ``model`` (a tied weight), none for the others."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {n: [o for o in group if o != n] for group in names.values() if len(group) > 1 for n in group}
