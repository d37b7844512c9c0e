"""The hooks of the training step distcheck runs, with their defaults (torch imported inside the functions).

A target of the ``training-step`` contract is a torchtitan-style ``parallelize(model, mesh, layout) -> model``
(the hooks below as they are) or a :class:`StepTarget` naming its own hooks. distcheck owns the step
(data, micro-batches, backward, AdamW); the hooks are what torchtitan and Megatron let a user replace:

* ``loss_fn(logits, labels, info) -> Tensor``: the loss of one micro-batch to call ``backward()`` on.
  Default :func:`token_mean_loss`: the micro-batch's sum of per-token cross-entropies (``ignore_index``
  -100 dropped) divided by the step's global token count, plus the MoE layers' load-balancing loss divided by
  the micro-batches, times ``dp * cp`` because FSDP2 and DDP average the gradients over the ranks holding
  different tokens; summed over micro-batches and ranks this is the global token mean (and the mean
  load-balancing loss).
* ``report_loss(loss_sum, tokens, info) -> (loss, tokens)``: what the step reports (the logged loss
  and tokens seen). ``loss_sum`` is this rank's sum of per-token losses over its micro-batches,
  ``tokens`` its non-ignored tokens (0-d float64 tensors). Default :func:`all_reduce_dp`: both
  summed over the ranks holding different tokens (``dp_replicate``, ``dp_shard``, then ``cp``), loss = sum /
  tokens.
* ``clip_grad_norm(parameters, max_norm, info) -> norm``: clip the gradients in place and return
  their total norm before clipping (a tensor, a DTensor, or a float). Default :func:`torch_clip`:
  ``torch.nn.utils.clip_grad_norm_`` (on DTensor gradients it returns a DTensor; distcheck reads its
  ``full_tensor()``).
* ``accumulate(model, info) -> context manager``: entered around each micro-batch's forward and backward
  (``info.microbatch`` is its index, 0 to m - 1): where a loop skips DDP's gradient all-reduce before the
  last micro-batch (``model.no_sync()``, accelerate's ``Accelerator.accumulate``). Default
  :func:`no_accumulate`: ``contextlib.nullcontext()``.
* ``backward(loss, model, info) -> None``: the backward of one micro-batch's loss. Default
  :func:`loss_backward`: ``loss.backward()``; accelerate's loop calls ``accelerator.backward(loss)``.
* ``finalize_grads(model, info) -> None``: once per step after every micro-batch's backward (after the pipeline
  schedule under pp), before ``report_loss`` and the clipping: Megatron-LM's ``finalize_model_grads``, where a
  tied head's two copies on the first and last pipeline stage get their gradients summed
  (:func:`all_reduce_tied`). Default :func:`no_finalize`: nothing.

``axes`` names the axes the target parallelizes (default: the dense step's dp_replicate, dp_shard, tp and pp, or
what ``--option axes=...`` names; cp and ep when named): a DDP-only loop names ``("dp_replicate",)``, and only
layouts with every other axis at 1 are drawn. ``accumulate`` and
``backward`` are the micro-batch loop's; under pipeline parallelism the schedule runs the forwards and
backwards, so a target that replaces either must leave ``pp`` out of its axes.

**The user's own pipeline split.** ``pipeline(model, mesh, layout, info) -> (schedule, model_parts)`` (default
None: distcheck cuts its own tiny Llama, :func:`~distcheck.parallel.step.model.pipeline_stage`, and drives
``torch.distributed.pipelining`` itself) is the target's split and schedule under pp > 1, the shape of torchtitan's
``pipeline_llm``: it gets the whole model (the factory's, or the tiny Llama, with the weights every rank and the
reference start from), the mesh, the layout and a :class:`PipelineInfo` (m, the micro-batch size, the device, the
drawn schedule's name and ``info.loss``, the stage loss distcheck owns), and returns this rank's schedule (a
``torch.distributed.pipelining`` schedule built with ``loss_fn=info.loss`` or a function calling it, and
``scale_grads=False``: ``loss_fn`` already weighs each token) and its model parts, each already parallelized by the
hook (torchtitan's ``pipeline_llm`` calls ``parallelize_fn`` on every part). One part per rank: pipeline stage i on
the rank of pp coordinate i (``ScheduleGPipe``, ``Schedule1F1B``); an interleaved schedule's several parts per rank
are refused. A part's parameter and module names must be the whole model's (a split that sets what the stage does
not run to None, as torchtitan's does), so that each is held to the reference's tensor of the same name. distcheck
then calls ``schedule.step`` on this dp rank's m micro-batches (the first stage's inputs the ``batch`` hook's, one
call per micro-batch, their tensors concatenated along dim 0 for the schedule to split again; the last stage's
``target`` the labels), builds AdamW on the parts' parameters and calls ``finalize_grads``, ``report_loss`` and
``clip_grad_norm`` with ``model`` the rank's part. ``info.loss(output, labels)`` returns the target's ``loss_fn``
of the micro-batch (what is backpropagated) and keeps the target's ``loss`` hook's token sum for the reported loss,
so the ``batch`` and ``loss`` hooks stay the target's under pp when it gives ``pipeline``.

``info`` (:class:`StepInfo`) carries the layout, the mesh (dims ``pp, dp_replicate, dp_shard, cp, tp``), the
token counts, under cp the global positions of this rank's chunks, and the model. Under pipeline parallelism
``loss_fn`` runs on the last stage only (the schedule's
``loss_fn``), and the default ``report_loss`` also sums the loss over the pp group.

**The user's own model.** ``model(config) -> nn.Module`` is a factory (default None: distcheck's tiny Llama,
:mod:`~distcheck.parallel.step.model`, with the weights of :func:`~distcheck.parallel.step.case.weights`). It is
called with ``config``, the StepTarget's own config object when it carries one, else the sizes distcheck drew
for the layout (a :class:`~distcheck.parallel.step.model.TinyConfig`: heads, ffn width and vocabulary divisible
by tp; the factory may map them onto its own config or ignore them). Each rank builds it on CPU under
``torch.manual_seed(case seed)`` with float64 the default dtype, then takes rank 0's ``state_dict`` (broadcast
over the world), so the reference and every rank start from the same weights even when the factory draws from
another generator; the reference is the same factory on one device, float64, loaded from rank 0's copy.
Token ids are drawn below ``config.vocab_size`` (a user config must have it); a user config naming its longest
sequence (``max_seq_len``, ``n_positions``, ``max_position_embeddings`` or ``block_size``, the first present)
caps the drawn sequence length. A user model is pipelined by its own ``pipeline`` hook (above); without one it
has no pipeline split and ``pp`` is left out of its axes.

**Context parallelism.** Under cp > 1 each cp rank gets, of every sequence of its dp rank's micro-batch, the
head-tail chunks of :func:`distcheck.parallel.cp.reference.load_balanced_positions` (chunks c and 2 cp - 1 - c
of 2 cp; "The Llama 3 Herd of Models", §3.3.2), tokens and labels alike, and ``info.positions`` their global
positions; the default ``batch`` hook passes them to distcheck's tiny Llama (``positions=``), whose RoPE and
whose attention core (a ring over the cp ranks, the target's) read them. A user model's ``batch`` hook passes
them its own way.

* ``batch(tokens, labels, info) -> inputs``: the forward's arguments for one micro-batch of the drawn causal-LM
  data (token ids ``(b, s)`` int64; labels ``(b, s)``, the next-token targets already aligned with the ids,
  ``IGNORE_INDEX`` -100 after each sequence's length): a dict is passed as keywords (``model(**inputs)``), a
  tuple as positional arguments, anything else as the one argument. Default :func:`token_ids`: ``tokens``.
  The labels stay distcheck's: token counts and the reference's weighting come from them.
* ``loss(output, labels, info) -> Tensor``: the micro-batch's **sum** of per-token losses (0-d, differentiable)
  read off the model's output. Default :func:`cross_entropy_sum`: the output is the logits, cross-entropy
  summed over the non-ignored labels. distcheck does the weighting: the default ``loss_fn`` is this sum times
  ``dp / global_tokens``, the default ``report_loss`` sums it over micro-batches and dp ranks, the reference
  divides the whole step's sum by its tokens. A model that returns its own loss as a per-micro-batch token mean
  (Hugging Face's ``model(input_ids, labels=labels).loss``) gives the sum back as ``output.loss *
  info.microbatch_tokens``, so every token still weighs ``1/T`` of the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from distcheck.core.vocab import Axis

__all__ = ["AXES", "FLAT_AXES", "EXPERT_AXES", "expert_mesh", "StepInfo", "StepTarget", "token_mean_loss",
           "all_reduce_dp", "torch_clip", "tied_copies", "all_reduce_tied",
           "tied_embedding_clip", "no_finalize", "no_accumulate", "loss_backward", "dp_groups", "as_float", "token_ids",
           "cross_entropy_sum", "call_model", "MAX_LEN_FIELDS", "check_hooks", "PipelineInfo",
           "MIN_SEQ_LEN", "user_config_limits"]

#: the config attributes read, in this order, as a user model's longest sequence (torchtitan, Hugging Face's
#: GPT-2, Hugging Face's Llama, nanoGPT)
MAX_LEN_FIELDS = ("max_seq_len", "n_positions", "max_position_embeddings", "block_size")

#: the mesh dims of the step, in torchtitan's order (the vocabulary's names)
AXES: tuple[str, ...] = tuple(a.value for a in (Axis.PP, Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.CP, Axis.TP))
#: the flattened dims the step's mesh also names (torchtitan's ``ParallelDims``): ``dp_shard x cp``, FSDP2's
#: shard dim under context parallelism, and ``dp_replicate x dp_shard x cp``, the ranks holding different tokens
FLAT_AXES: tuple[str, ...] = ("dp_shard_cp", "dp_cp")
#: the experts' meshes built, by world, rank, device type and shape (:func:`expert_mesh`)
_EXPERT_MESHES: dict = {}
#: the dims of the experts' mesh (:func:`expert_mesh`)
EXPERT_AXES: tuple[str, ...] = (Axis.PP.value, Axis.DP_REPLICATE.value, "efsdp", Axis.EP.value, Axis.TP.value)


@dataclass(frozen=True)
class StepInfo:
    """What a hook may need: ``layout`` (:class:`~distcheck.parallel.step.reference.StepLayout`), ``mesh`` (the
    ``DeviceMesh`` with dims ``pp, dp_replicate, dp_shard, tp``), ``global_tokens`` (non-ignored tokens of the whole
    step: every dp rank, every micro-batch), ``microbatch_tokens`` (this rank's, this micro-batch),
    ``num_microbatches`` (m, gradient-accumulation steps), ``max_norm``, ``microbatch`` (the index of the
    micro-batch being run, 0 to m - 1; 0 outside the micro-batch loop), ``token_loss`` (the target's ``loss`` hook,
    which the default ``loss_fn`` weighs; None: :func:`cross_entropy_sum`), ``positions`` (under context parallelism
    the global positions ``(s_local,)`` of this rank's head-tail chunks of the micro-batch's sequences, int64; None
    when cp = 1: positions ``0 .. s-1``), ``model`` (the model the micro-batch runs through, as ``parallelize``
    returned it; in ``finalize_grads``, ``report_loss`` and ``clip_grad_norm`` too). In the reference step ``info``
    describes one device: every degree 1, ``mesh`` None, one micro-batch holding every token of the step (of the
    micro-batch index, for a model with MoE layers, whose load-balancing loss is per micro-batch)."""

    layout: Any
    mesh: Any
    global_tokens: int
    microbatch_tokens: int
    num_microbatches: int
    max_norm: float
    microbatch: int = 0
    token_loss: Callable | None = None
    positions: Any = None
    model: Any = None


@dataclass(frozen=True)
class PipelineInfo:
    """What a ``pipeline`` hook needs to build its schedule (module doc): ``microbatches`` (m, the schedule's
    ``n_microbatches``), ``microbatch_size`` (sequences per micro-batch; the schedule is stepped on ``m *
    microbatch_size`` sequences of this dp rank), ``device`` (the rank's ``torch.device``), ``schedule`` (the drawn
    schedule's name, :class:`~distcheck.core.vocab.Schedule`: ``"gpipe"`` or ``"1f1b"``, torch's
    ``get_schedule_class`` reads either) and ``loss`` (``loss(output, labels) -> Tensor``: the last stage's loss of
    one micro-batch, the target's ``loss_fn``; distcheck counts the target's ``loss`` hook's token sums from it,
    keeping each step's last m calls: a schedule's first step also calls it once to infer the gradients' shapes;
    the hooks it calls get a :class:`StepInfo` with the micro-batch's own tokens, ``microbatch`` 0 and ``model``
    the rank's part)."""

    microbatches: int
    microbatch_size: int
    device: Any
    schedule: str
    loss: Callable


def token_ids(tokens: Any, labels: Any, info: StepInfo) -> Any:
    """The default ``batch`` hook: the token ids, the forward's one argument (``model(tokens)``); under context
    parallelism (``info.positions`` given) ``{"tokens": tokens, "positions": info.positions}``, the keywords of
    distcheck's tiny Llama (``model(tokens=..., positions=...)``)."""
    if info.positions is not None:
        return {"tokens": tokens, "positions": info.positions}
    return tokens


def cross_entropy_sum(output: Any, labels: Any, info: StepInfo) -> Any:
    """The default ``loss`` hook: ``output`` is the logits ``(b, s, vocab)``; the sum of the per-token
    cross-entropies over the labels that are not ``IGNORE_INDEX`` (``reduction="sum"``)."""
    from distcheck.parallel.step.model import token_loss_sum

    return token_loss_sum(output, labels)


def call_model(model: Any, inputs: Any) -> Any:
    """``model`` called on a ``batch`` hook's ``inputs``: a dict as keywords, a tuple as positional arguments,
    anything else as the one argument."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple):
        return model(*inputs)
    return model(inputs)


def token_mean_loss(logits: Any, labels: Any, info: StepInfo) -> Any:
    """``(sum of the micro-batch's per-token losses / global_tokens + load-balancing loss / m) * dp * cp`` (module
    doc): the sum is the target's ``loss`` hook's (``info.token_loss``) of the model's output, by default the
    cross-entropy of the logits; the load-balancing loss is this rank's share of the MoE layers' of this
    micro-batch (:func:`~distcheck.parallel.step.model.load_balance_loss` of ``info.model``, 0 without MoE
    layers). FSDP2 averages the gradients over the ``dp * cp`` ranks holding different tokens, so the ranks'
    terms add up to the step's loss: the global token mean plus the mean over micro-batches of the load-balancing
    loss."""
    from distcheck.parallel.step.model import load_balance_loss

    loss = info.token_loss or cross_entropy_sum
    main = loss(logits, labels, info) * info.layout.dp_cp / info.global_tokens
    aux = load_balance_loss(info.model) if info.model is not None else 0.0
    if isinstance(aux, float):  # no MoE layer
        return main
    return main + aux * info.layout.dp_cp / info.num_microbatches


def dp_groups(mesh: Any) -> list:
    """The process groups of the mesh's dimensions of size > 1 whose ranks hold different tokens
    (``dp_replicate``, ``dp_shard``, ``cp``)."""
    return [mesh.get_group(name) for name in ("dp_replicate", "dp_shard", "cp") if mesh[name].size() > 1]


def all_reduce_dp(loss_sum: Any, tokens: Any, info: StepInfo) -> tuple[Any, Any]:
    """Sum ``loss_sum`` and ``tokens`` over the ranks holding different tokens (dp, and cp: each cp rank holds
    its chunks' sums, torchtitan's ``dp_cp`` reduction); return ``(loss_sum / tokens, tokens)``."""
    import torch
    import torch.distributed as dist

    both = torch.stack([loss_sum.detach(), tokens.detach()])
    for group in dp_groups(info.mesh):
        dist.all_reduce(both, group=group)
    loss = both[0]
    if info.layout.pp > 1:  # only the last stage computes losses: the others hold 0
        dist.all_reduce(loss, group=info.mesh.get_group("pp"))
    return loss / both[1], both[1]


def torch_clip(parameters: Iterable[Any], max_norm: float, info: StepInfo, *, shared: Iterable[Any] = ()) -> Any:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``; under pipeline or expert parallelism (pp > 1, ep >
    1) torchtitan's ``clip_grad_norm_`` (torchtitan/distributed/utils.py): the norm of the gradients of each
    DTensor mesh (``torch.nn.utils.get_total_norm``, a DTensor's ``full_tensor()``: the experts' under ep, the
    others), their squares summed, and over the pp group under pp, the square root the global norm, then
    ``torch.nn.utils.clip_grads_with_norm_``. torch's own function on a stage returns that stage's norm only
    (pytorch/torchtitan#596), and refuses DTensors of two meshes. ``shared``: parameters among ``parameters``
    that are clipped but not counted in the norm (under pp, a second copy of a weight another stage counts:
    Megatron-LM's ``param_is_not_shared``)."""
    import torch
    import torch.distributed as dist

    params = list(parameters)
    if info.layout.pp == 1 and info.layout.ep == 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    skip = {id(p) for p in shared}
    # DTensor gradients on different meshes (the experts' under ep) do not stack: one norm per mesh, their squares
    # summed (torchtitan's _clip_grad_norm_with_ep), and each group clipped by the total
    groups: dict = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p)
    squares = []
    for group in groups.values():
        counted = [p.grad for p in group if id(p) not in skip]
        if not counted:
            continue
        norm = torch.nn.utils.get_total_norm(counted)
        squares.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm) ** 2)
    norm = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    if info.layout.pp > 1:
        dist.all_reduce(norm, group=info.mesh.get_group("pp"))
    norm = norm**0.5
    for group in groups.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm


def tied_copies(model: Any, info: StepInfo) -> list:
    """This rank's copy of a tied head's weight under pp > 1 (distcheck's tiny Llama,
    :func:`~distcheck.parallel.step.model.pipeline_stage`): ``[model.tok_embeddings.weight]`` on the first stage,
    ``[model.output.weight]`` on the last, ``[]`` elsewhere, at pp = 1 and for an untied head."""
    cfg = getattr(model, "config", None)
    if info.layout.pp == 1 or not getattr(cfg, "tied", False):
        return []
    first, last = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    return [m.weight for m in (first, last) if m is not None]


def all_reduce_tied(model: Any, info: StepInfo) -> None:
    """Megatron-LM's ``_allreduce_embedding_grads`` (megatron/core/distributed/finalize_model_grads.py): the
    gradients of a tied head's two copies (:func:`tied_copies`), the embedding's on the first pipeline stage and
    the head's on the last, summed in place over the embedding group, the first and last stage of the ranks'
    other coordinates: the mesh's pp group at pp = 2 (the step's layouts have pp <= 2). On a DTensor gradient
    (FSDP2's shard, tp's) the local shard is summed: the two copies are laid out alike. A ``finalize_grads`` hook
    (module doc). RuntimeError for pp > 2."""
    import torch.distributed as dist

    if info.layout.pp > 2:
        raise RuntimeError(f"pp = {info.layout.pp}: the embedding group is the first and last stage, the pp group "
                           "only at pp = 2")
    for weight in tied_copies(model, info):
        if weight.grad is not None:
            grad = weight.grad.to_local() if hasattr(weight.grad, "to_local") else weight.grad
            dist.all_reduce(grad, group=info.mesh.get_group("pp"))


def tied_embedding_clip(parameters: Iterable[Any], max_norm: float, info: StepInfo) -> Any:
    """A ``clip_grad_norm`` hook for a tied head under pp: :func:`torch_clip` with the last stage's copy of the
    weight (:func:`tied_copies` of ``info.model``) clipped but not counted in the norm, the first stage's counting
    it once (Megatron-LM's ``param_is_not_shared``); :func:`torch_clip` itself when the model has no copies."""
    model = info.model
    last = tied_copies(model, info) if getattr(model, "tok_embeddings", None) is None else []
    return torch_clip(parameters, max_norm, info, shared=last)


def expert_mesh(mesh: Any, layout: Any) -> Any:
    """The experts' ``DeviceMesh`` of ``layout`` on ``mesh``'s device type: dims :data:`EXPERT_AXES` ``(pp,
    dp_replicate, efsdp, ep, tp)`` of shape :attr:`~distcheck.parallel.step.reference.StepLayout.expert_shape`
    (torchtitan's sparse mesh; under Megatron's placement dp_replicate is 1 and efsdp spans the replicas), over
    the ranks of ``mesh`` in the same order: ``ep`` consecutive data-parallel ranks (cp innermost) share the
    experts out, ``["dp_replicate", "efsdp"]`` is the experts' data parallelism. Built once per world, rank and
    layout (every rank must call it the first time: it creates process groups)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.group.WORLD), dist.get_rank(), mesh.device_type, *layout.expert_shape)
    if key not in _EXPERT_MESHES:
        _EXPERT_MESHES[key] = init_device_mesh(mesh.device_type, layout.expert_shape, mesh_dim_names=EXPERT_AXES)
    return _EXPERT_MESHES[key]


def no_accumulate(model: Any, info: StepInfo) -> contextlib.AbstractContextManager:
    """The default ``accumulate`` hook: ``contextlib.nullcontext()`` (every micro-batch's backward runs as the
    model's wrapper runs it)."""
    return contextlib.nullcontext()


def loss_backward(loss: Any, model: Any, info: StepInfo) -> None:
    """The default ``backward`` hook: ``loss.backward()``."""
    loss.backward()


def no_finalize(model: Any, info: StepInfo) -> None:
    """The default ``finalize_grads`` hook: nothing (the gradients as the backward and the model's wrapper left
    them)."""


def as_float(value: Any) -> float:
    """A reported number as a Python float (a DTensor's ``full_tensor()``, a tensor's item)."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


@dataclass(frozen=True)
class StepTarget:
    """A ``training-step`` target with its own hooks: ``parallelize(model, mesh, layout) -> model`` and any of
    ``loss_fn``, ``report_loss``, ``clip_grad_norm``, ``accumulate``, ``backward``, ``batch``, ``loss``,
    ``finalize_grads`` (module doc;
    the defaults when left out), ``axes``, the axes it parallelizes (a tuple of names among ``dp_replicate``,
    ``dp_shard``, ``tp``, ``pp``, ``cp``, ``ep``; empty: the ``axes`` option's, by default the dense step's
    dp_replicate, dp_shard, tp and pp, or dp_replicate, dp_shard and tp for a user model, and pp too with its
    ``pipeline`` hook), and the user's own
    model: ``model``, a factory ``model(config) -> nn.Module`` (None: distcheck's tiny Llama), and ``config``,
    what the factory is called
    with (None: the sizes drawn for the layout, a ``TinyConfig``; given: it must have ``vocab_size``, and is
    shipped to the ranks inside each example, so it must pickle). ``pipeline``: the target's own pipeline split
    and schedule, ``pipeline(model, mesh, layout, info) -> (schedule, model_parts)`` (module doc, ``info`` a
    :class:`PipelineInfo`; None: distcheck's split of its tiny Llama, and a user model draws no pp); with it ``pp``
    is among a user model's default axes and the ``batch`` and ``loss`` hooks stay the target's under pp.
    ``shard_dims`` says how plain tensors (Megatron-style hand-written sharding, no DTensor) are laid out over
    tp where their shapes do not: a dict of names (parameter names and module names) to the dim a tensor is
    split on, ``"replicated"`` or ``"sum"`` (partial sums over tp), or a callable of a name returning one of
    those or None (left to the shapes); :mod:`distcheck.parallel.step.trace`. A parameter's entry maps its
    gradients and AdamW moments too; a module's maps its output, and ``"<module>:input"`` its input gradient.
    The StepTarget itself must be a module-level object: each rank imports it again by its reference
    (``module:NAME``); its hooks may be any callables taking their arguments (module functions, lambdas,
    ``functools.partial``)."""

    parallelize: Callable
    loss_fn: Callable = token_mean_loss
    report_loss: Callable = all_reduce_dp
    clip_grad_norm: Callable = torch_clip
    finalize_grads: Callable = no_finalize
    accumulate: Callable = no_accumulate
    backward: Callable = loss_backward
    axes: tuple[str, ...] = ()
    model: Callable | None = None
    config: Any = None
    batch: Callable = token_ids
    loss: Callable = cross_entropy_sum
    shard_dims: Any = None
    pipeline: Callable | None = None

    #: (field, number of arguments) of every hook (``model`` and ``pipeline`` only when given)
    HOOKS = (("parallelize", 3), ("loss_fn", 3), ("report_loss", 3), ("clip_grad_norm", 3), ("accumulate", 2),
             ("backward", 3), ("model", 1), ("batch", 3), ("loss", 3), ("finalize_grads", 2), ("pipeline", 4))

    @property
    def loop_hooks(self) -> tuple[str, ...]:
        """The micro-batch loop's hooks this target replaces that a pipeline schedule does not call under pp > 1
        (the schedule runs the forwards, the loss and the backwards itself): ``accumulate`` and ``backward``, and
        ``batch`` and ``loss`` unless the target gives its own ``pipeline`` (whose stage loss and inputs distcheck
        feeds from them)."""
        hooks: list[tuple[str, Callable]] = [("accumulate", no_accumulate), ("backward", loss_backward)]
        if self.pipeline is None:
            hooks += [("batch", token_ids), ("loss", cross_entropy_sum)]
        return tuple(n for n, d in hooks if getattr(self, n) is not d)


def check_hooks(obj: Any, shown: str) -> None:
    """Every hook of a :class:`StepTarget` callable with its number of arguments, else ProtocolError naming it."""
    import inspect

    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.engine.contracts.targets import check_call_shape

    for field, n in obj.HOOKS:
        fn = getattr(obj, field)
        if field in ("model", "pipeline") and fn is None:  # distcheck's tiny Llama, distcheck's split
            continue
        if not callable(fn):
            raise ProtocolError("target", shown, f"the {field} hook of a StepTarget must be callable, not {fn!r}")
        try:
            have = f" (its signature is {inspect.signature(fn)})"
        except (TypeError, ValueError):
            have = ""
        check_call_shape(fn, shown, f"the {field} hook of a StepTarget must take {n} positional arguments{have}", n)


#: the shortest sequence a user config must allow: tp = 4 cuts each sequence into 4 shards
MIN_SEQ_LEN = 4


def user_config_limits(obj: Any, shown: str) -> tuple[int | None, int | None]:
    """``(vocab_size, longest sequence)`` of a :class:`StepTarget`'s own ``config`` (None, None when it carries
    none). ProtocolError naming the target for a config without a model factory, a ``vocab_size`` that is not a
    positive int, or a declared longest sequence (``hooks.MAX_LEN_FIELDS``) that is not an int >= 4."""
    from distcheck.engine.contracts.errors import ProtocolError

    cfg = obj.config
    if cfg is None:
        return None, None
    if obj.model is None:
        raise ProtocolError("target", shown, "StepTarget config is given without a model factory: pass model=... "
                            "(a callable config -> nn.Module), or leave config out for the tiny Llama")
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ProtocolError("target", shown, f"StepTarget config.vocab_size={vocab!r} must be a positive int: token "
                            "ids are drawn below it")
    for name in MAX_LEN_FIELDS:
        longest = getattr(cfg, name, None)
        if longest is None:
            continue
        if isinstance(longest, bool) or not isinstance(longest, int) or longest < MIN_SEQ_LEN:
            raise ProtocolError("target", shown, f"StepTarget config.{name}={longest!r} must be an int >= "
                                f"{MIN_SEQ_LEN}: the sequences drawn are cut into up to {MIN_SEQ_LEN} tp shards")
        return vocab, longest
    return vocab, None
