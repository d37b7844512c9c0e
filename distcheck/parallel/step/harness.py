"""The torch side of the ``training-step`` contract: what every rank runs for one example (:func:`run_step`)
and the single-device float64 reference step (:func:`reference_step`). torch is imported inside the functions.

Every rank builds the case's decoder, cuts it to its pipeline stage when pp > 1
(:func:`~distcheck.parallel.step.model.pipeline_stage`), calls the target's ``parallelize(model, mesh, layout)`` on
the ``DeviceMesh`` of dims ``(pp, dp_replicate, dp_shard, cp, tp)`` (:func:`mesh_for`; the experts' mesh,
:func:`~distcheck.parallel.step.hooks.expert_mesh`, is built when the target asks for it), builds AdamW on what it
returns, and runs the case's steps. A step, on dp index d and cp index c: for each of the m micro-batches, inside
``accumulate(model, info)``, the forward on its sequences (under cp > 1 their head-tail chunks c and 2 cp - 1 - c,
with their global positions, :func:`cp_positions`), ``loss_fn(logits, labels, info)`` and ``backward(loss, model,
info)`` (under pp > 1 the schedule runs them: ``loss_fn`` on the last stage); ``finalize_grads(model, info)``;
``report_loss`` over the rank's summed per-token losses and tokens; the gradients (local shards) are kept,
``clip_grad_norm(parameters, max_norm, info)`` is called, the scale it applied is measured from the local shards
before and after; ``optimizer.step()``; every parameter and AdamW moment is gathered to a full tensor
(``full_tensor()``). Rank 0 then runs the reference (:func:`reference_step`, from every rank's records): the same
decoder on the whole step's batch at once (a decoder with MoE layers one global micro-batch at a time: its
load-balancing loss is each micro-batch's over every rank's tokens), the token-mean loss, ``clip_grad_norm_`` and
AdamW, float64, each step from the state the ranks reached after the step before (:func:`parallel_states`).

A target with its own model (``StepTarget(model=...)``) is built by :func:`build_target_model` (seeded, CPU,
float64), every rank then holding rank 0's ``state_dict`` (:func:`same_weights`); each micro-batch's forward is
``model`` called on the ``batch`` hook's inputs and its loss sum the ``loss`` hook's; the reference is the same
factory loaded with rank 0's initial ``state_dict`` and the same two hooks on the whole batch. A target with its
own ``pipeline`` hook splits the whole model itself under pp > 1
(:func:`~distcheck.parallel.step.pipeline.own_split`: the hook returns its schedule and this rank's part,
parallelized) instead of :func:`~distcheck.parallel.step.model.pipeline_stage` and ``parallelize``; distcheck steps
that schedule (:func:`~distcheck.parallel.step.pipeline.schedule_step`) and the rest of the step runs on the part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distcheck.engine.world import RankContext
    from distcheck.parallel.step.case import StepCase
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.reference import StepLayout
from distcheck.parallel.step.precision import floating_to

__all__ = ["ADAMW", "run_step", "reference_step", "reference_trace", "parallel_states", "mesh_for",
           "cp_positions", "build_target_model", "same_weights"]

#: AdamW's hyperparameters besides the learning rate (torchtitan's defaults)
ADAMW: dict = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
#: wrappers' prefixes a parameter name may gain (torch.compile, activation checkpointing, DDP)
_PREFIXES = ("_orig_mod.", "_checkpoint_wrapped_module.", "module.")
_MESHES: dict = {}


def mesh_for(ctx: RankContext, layout: StepLayout) -> Any:
    """The ``DeviceMesh`` of ``layout`` on this world (dims ``pp, dp_replicate, dp_shard, cp, tp``, torchtitan's
    order), built once per world and rank, with torchtitan's flattened dims ``dp_shard_cp`` (``dp_shard x cp``,
    FSDP2's shard dim under context parallelism) and ``dp_cp`` (``dp_replicate x dp_shard x cp``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from distcheck.parallel.step.hooks import AXES, FLAT_AXES

    key = (id(dist.group.WORLD), ctx.rank, *layout.shape)
    if key not in _MESHES:
        mesh = init_device_mesh(ctx.device.type, layout.shape, mesh_dim_names=AXES)
        # DeviceMesh has no public flatten (torch 2.13); torchtitan's ParallelDims calls the same method
        mesh["dp_shard", "cp"]._flatten(FLAT_AXES[0])
        mesh["dp_replicate", "dp_shard", "cp"]._flatten(FLAT_AXES[1])
        _MESHES[key] = mesh
    return _MESHES[key]


def _name(name: str) -> str:
    for p in _PREFIXES:
        name = name.replace(p, "")
    return name


def _full(t: Any) -> Any:
    """The full tensor (a DTensor's ``full_tensor()``) as a float64 numpy array (exact for every dtype the step
    holds: bf16, float32, float64)."""
    import torch

    if t is None:
        return None
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().cpu().to(torch.float64).numpy().copy()


def _local(t: Any) -> Any:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def _ties(model: Any) -> dict[str, str]:
    """The second and later names of each tensor ``model`` ties (``named_parameters(remove_duplicate=False)``) ->
    its first name, the one the reference lists: after a pipeline split each stage holds its own copy of a tied
    weight (an embedding on the first stage, the head on the last), recorded under the reference's name."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[_name(name)] = _name(first[id(p)])
        else:
            first[id(p)] = name
    return out


def _gathered_by(t: Any) -> int | None:
    """The lowest rank of a DTensor's mesh when its ``full_tensor()`` is the same on every rank of that mesh by
    construction (no ``Replicate`` placement: each dim is all-gathered or all-reduced), else None (a plain tensor,
    or a replicated dim whose copies may differ)."""
    placements = getattr(t, "placements", None)
    if placements is None or any(p.is_replicate() for p in placements):
        return None
    return int(t.device_mesh.mesh.min())


def _record(model: Any, opt: Any, alias: dict | None = None) -> dict:
    """Parameters and AdamW moments by name, full float64 arrays (``alias``: a tied head's pp copy renamed), and
    ``gathered``: ``(kind, name, moment)`` -> the lowest rank holding the same full tensor by construction
    (:func:`_gathered_by`; :func:`distcheck.parallel.step.records.ship_once` reads it)."""
    names = {n: (alias or {}).get(_name(n), _name(n)) for n, _ in model.named_parameters()}
    params = {names[n]: _full(p) for n, p in model.named_parameters()}
    gathered = {("params", names[n], 0): r for n, p in model.named_parameters() if (r := _gathered_by(p)) is not None}
    state = {}
    for n, p in model.named_parameters():
        st = opt.state.get(p, {})
        moments = (st.get("exp_avg"), st.get("exp_avg_sq"))
        state[names[n]] = tuple(_full(m) for m in moments)
        gathered.update({("state", names[n], j): r for j, m in enumerate(moments)
                         if m is not None and (r := _gathered_by(m)) is not None})
    return {"params": params, "state": state, "gathered": gathered}


def _scale(before: list, after: list) -> tuple[float | None, float, float]:
    """The factor that took ``before`` to ``after`` (least squares over the local shards), the largest
    entry of ``after - scale * before`` and the largest ``|before|``; None (and 0s) when every local gradient is
    zero."""
    import torch

    # in float64 whatever the gradients' dtype: the factor's own rounding stays far below the gradients'
    after, before = [a.to(torch.float64) for a in after], [b.to(torch.float64) for b in before]
    num = sum(float(torch.sum(a * b)) for a, b in zip(after, before, strict=True))
    den = sum(float(torch.sum(b * b)) for b in before)
    if den == 0:
        return None, 0.0, 0.0
    s = num / den
    pairs = [(a, b) for a, b in zip(after, before, strict=True) if b.numel()]
    resid = max((float(torch.max(torch.abs(a - s * b))) for a, b in pairs), default=0.0)
    return s, resid, max((float(torch.max(torch.abs(b))) for _, b in pairs), default=0.0)


def build_target_model(factory: Any, config: Any, seed: int) -> Any:
    """``factory(config)`` built on CPU under ``torch.manual_seed(seed)`` with float64 the default dtype (the
    global generator and default dtype restored after), then its floating-point parameters and buffers cast to
    float64 (complex buffers, such as a RoPE cache of complex numbers, keep theirs): the same weights for the same seed
    whatever ran before. Raises ProtocolError naming the factory when it does not return an ``nn.Module``."""
    import torch

    from distcheck.engine.contracts.errors import ProtocolError

    dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.float64)
        try:
            model = factory(config)
        finally:
            torch.set_default_dtype(dtype)
    if not isinstance(model, torch.nn.Module):
        raise ProtocolError("model", repr(factory), f"the StepTarget's model factory must return a torch.nn.Module, "
                            f"not {type(model).__name__}")
    return floating_to(model.to(device="cpu"), torch.float64)


def same_weights(model: Any) -> dict:
    """Every tensor of ``model``'s ``state_dict`` (parameters and buffers) overwritten with rank 0's (``broadcast``
    over the default group, in the state_dict's order) when a process group is up; returns a copy of the result
    (rank 0's initial weights, what the reference loads)."""
    import torch
    import torch.distributed as dist

    state = model.state_dict()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for t in state.values():
                dist.broadcast(t, src=0)
    return {k: v.detach().clone() for k, v in state.items()}


def _sum64(value: Any) -> Any:
    import torch

    value = value.full_tensor() if hasattr(value, "full_tensor") else value
    return value.detach().to(device="cpu", dtype=torch.float64)


def run_step(ctx: RankContext, target: StepTarget, case: StepCase, *, record: bool = False,
             single: Callable | None = None, every: bool = False) -> dict:
    """One example on this rank (module doc). Returns plain Python / numpy: per step ``loss``, ``tokens``,
    ``norm`` (as reported), ``scale`` and ``residual`` (measured on the local shards; ``grad_dtype`` the local
    gradients' dtype name), ``params`` and ``state`` (full tensors by name, float64 arrays of the values the rank
    holds; a plain tensor as this rank holds it; on a rank above 0, ``Same(r)`` for an array rank r holds bitwise,
    :mod:`distcheck.parallel.step.records`), ``dp_index``, ``device`` (the ranks' device type) and
    ``shard_dims`` (the target's declared layouts of the names this rank holds); on rank 0 also ``every`` when
    that argument is set (every rank's record but its ``trace``, the arrays restored: what the contract checks
    on rank 0, :meth:`~distcheck.parallel.step.contracts.TrainingStep.run_rank`), ``reference``
    (:func:`reference_step`, from every rank's records) and ``single`` when that argument is given (``single(case,
    tokens, labels, starts, target, initial)``: the single-device step in the case's precision,
    :func:`distcheck.parallel.step.single.device_step`, from the same records). ``record`` (the replay
    of a failure only): also ``trace``, every tensor of the step (:class:`~distcheck.parallel.step.trace.Recorder`),
    and on rank 0 ``reference_trace`` (:func:`reference_trace`). The model is built in the case's precision's
    master dtype (``layout.precision``: float64, or float32 for float32 and both bf16 recipes), and under
    ``bf16-autocast`` each micro-batch's forward and ``loss_fn`` run under ``torch.autocast``."""
    import logging
    import warnings

    import torch

    from distcheck.parallel.step.case import batch, weights
    from distcheck.parallel.step.hooks import StepInfo, as_float, call_model

    # DTensor's hints that two mesh dims could be flattened (performance only) would fill every report
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # FSDP2's warning that the root returned a view: the step and the default hooks read the logits out of place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # torch 2.13 warns on every slice of a flattened dim (mesh["dp_replicate", "dp_shard_cp"], torchtitan's idiom)
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    from distcheck.parallel.step.mapping import assemble_params, declared
    from distcheck.parallel.step.model import IGNORE_INDEX, TIED_NAMES, build_model, pipeline_stage
    from distcheck.parallel.step.pipeline import own_split, pipeline_step, schedule_step
    from distcheck.parallel.step.precision import autocast_for, get_precision
    from distcheck.parallel.step.trace import NoRecorder, Recorder, normalize

    layout = case.layout
    master = get_precision(layout.precision).master
    split = layout.pp > 1 and target.pipeline is not None  # the target's own pipeline split and schedule
    if layout.pp > 1:
        _pipeline_refused(ctx, target, layout)
    mesh = mesh_for(ctx, layout)
    d, c = layout.dp_index(ctx.rank), layout.coordinates(ctx.rank)["cp"]
    tokens, labels = (torch.from_numpy(a) for a in batch(case))
    chunk = cp_positions(case.seq_len, layout.cp, c)
    initial = None
    if target.model is None:
        model = build_model(case.config, weights(case), device=ctx.device, dtype=master)
    else:
        model = build_target_model(target.model, case.config, case.seed)
        initial = same_weights(model)
        model = floating_to(model.to(device=ctx.device), getattr(torch, master))
    shapes = {normalize(n): tuple(p.shape) for n, p in model.named_parameters()}  # the full tensors' shapes
    schedule, state = None, {"total": 0, "sums": [], "model": None}
    ties = _ties(model) if split else {}  # a weight tied in the whole model, each stage holding a copy of it
    if split:
        schedule, model = own_split(ctx, target, model, mesh, case, state)
    else:
        if layout.pp > 1:
            model = pipeline_stage(model, layout.coordinates(ctx.rank)["pp"], layout.pp)
        model = target.parallelize(model, mesh, layout)
    tied_pp = layout.pp > 1 and not split and target.model is None and case.config.tied
    alias = {TIED_NAMES[1]: TIED_NAMES[0]} if tied_pp else ties
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, **ADAMW)
    rec = Recorder(model, dp_index=d, pipelined=layout.pp > 1) if record else NoRecorder()
    steps = []
    for s in range(case.steps):
        rec.begin_step(s)
        opt.zero_grad()
        total = int((labels[s] != IGNORE_INDEX).sum())
        loss_sum = torch.zeros((), dtype=torch.float64)
        mine = torch.zeros((), dtype=torch.float64)
        if schedule is not None:
            loss_sum += schedule_step(ctx, target, schedule, model, mesh, case, tokens[s, d], labels[s, d], total,
                                       state)
            mine += int((labels[s, d] != IGNORE_INDEX).sum())
        elif layout.pp > 1:
            loss_sum += pipeline_step(ctx, target, model, mesh, case, tokens[s, d], labels[s, d], total)
            mine += int((labels[s, d] != IGNORE_INDEX).sum())
        for k in range(case.microbatches if layout.pp == 1 else 0):
            x, y = tokens[s, d, k], labels[s, d, k]
            if chunk is not None:  # this cp rank's head-tail chunks of every sequence
                x, y = x[:, chunk], y[:, chunk]
            x, y = x.to(ctx.device), y.to(ctx.device)
            n_k = int((y != IGNORE_INDEX).sum())
            pos = None if chunk is None else chunk.to(ctx.device)
            info = StepInfo(layout, mesh, total, n_k, case.microbatches, case.max_norm, k, target.loss, pos, model)
            rec.begin_microbatch(k)
            with target.accumulate(model, info):
                with autocast_for(layout.precision, ctx.device):
                    out = call_model(model, target.batch(x, y, info))
                    loss = target.loss_fn(out, y, info)
                target.backward(loss, model, info)
            with torch.no_grad():
                loss_sum += _sum64(target.loss(out, y, info))
            mine += n_k
        info = StepInfo(layout, mesh, total, 0, case.microbatches, case.max_norm, model=model)
        target.finalize_grads(model, info)
        loss, seen = target.report_loss(loss_sum, mine, info)
        rec.after_backward(model, loss, seen)
        params = [p for p in model.parameters() if p.grad is not None]
        before = [_local(p.grad) for p in params]
        norm = target.clip_grad_norm(model.parameters(), case.max_norm, info)
        rec.after_clip(model, norm)
        scale, resid, grad_max = _scale(before, [_local(p.grad) for p in params])
        opt.step()
        rec.after_optimizer(model, opt)
        steps.append({"loss": as_float(loss), "tokens": as_float(seen), "norm": as_float(norm), "scale": scale,
                      "residual": resid, "grad_max": grad_max, "local_tokens": int(mine),
                      "grad_dtype": str(before[0].dtype).removeprefix("torch.") if before else "",
                      **_record(model, opt, alias)})
    modules = [normalize(n) for n, _ in model.named_modules()]
    names = modules + [f"{n}:input" for n in modules] + [normalize(n) for n, _ in model.named_parameters()]
    from distcheck.parallel.step.records import gather_to_rank0, ship_once

    # an array a lower rank holds bitwise (every rank's full_tensor() of a DTensor) travels as a reference to it
    shipped = ship_once(steps)
    result: dict = {"steps": shipped, "dp_index": d, "cp_index": c, "device": ctx.device.type,
                    "shard_dims": declared(target.shard_dims, names), "own_split": split}
    if record:
        result["trace"] = rec.close()
    # the reference runs here, on rank 0, from every rank's records: never in the parent, which forks the next
    # world's ranks (a process that has run torch's thread pools does not fork safely)
    records = gather_to_rank0(ctx, result, every)
    if records is not None:  # rank 0
        # plain tp shards (Megatron style) as full tensors: the reference starts each step from the ranks' state
        starts = parallel_states(assemble_params(layout, records, shapes))
        own = target if target.model is not None else None
        result["reference"] = reference_step(case, tokens, labels, starts, own, initial)
        if single is not None:  # the single-device step in the case's precision, from the same states
            result["single"] = single(case, tokens, labels, starts, own, initial)
        if record:
            result["reference_trace"] = reference_trace(case, tokens, labels, starts, own, initial)
    return result


def _pipeline_refused(ctx: RankContext, target: StepTarget, layout: StepLayout) -> None:
    """Raise when a layout with pp > 1 cannot run: RuntimeError for a target replacing a micro-batch loop hook the
    schedule does not call, or a user model without a pipeline hook (the contract leaves pp out of such a
    target's axes); ProtocolError on the threaded backend, whose process group serves no device type that
    ``torch.distributed.pipelining``'s point-to-point sends need ("No backend type associated with device type
    cpu")."""
    from distcheck.engine.contracts.errors import ProtocolError

    if target.loop_hooks:
        raise RuntimeError(f"the target replaces {', '.join(target.loop_hooks)}, which the pipeline schedule does "
                           f"not call (layout {layout}): leave pp out of the target's axes")
    if target.model is not None and target.pipeline is None:
        raise RuntimeError(f"a user model has no pipeline split without a pipeline hook (StepTarget(pipeline=...)) "
                           f"(layout {layout}): give one or leave pp out of the target's axes")
    if getattr(ctx, "backend", "") == "threaded":
        raise ProtocolError("backend", "threaded", f"cannot run pipeline stages (layout {layout}): "
                            "torch.distributed.pipelining's sends need a process group with a device backend; use "
                            "--backend gloo or nccl, or leave pp out (--option axes=dp_replicate,dp_shard,tp)")


def cp_positions(seq_len: int, cp: int, index: int) -> Any:
    """The global positions (int64 tensor) of cp rank ``index``'s head-tail chunks of a sequence of ``seq_len``
    tokens (:func:`distcheck.parallel.cp.reference.load_balanced_positions`: chunks ``index`` and ``2 cp - 1 -
    index`` of ``2 cp``), None when cp = 1."""
    import torch

    from distcheck.parallel.cp.reference import load_balanced_positions

    if cp == 1:
        return None
    return torch.from_numpy(load_balanced_positions(seq_len, cp)[index].astype("int64"))


def parallel_states(results: list[dict]) -> list[dict]:
    """The state the parallel run reached after each step, from every rank's record (:func:`run_step`'s
    ``steps``): ``params`` and ``state`` by name, each parameter taken from the lowest rank that holds it (its
    pipeline stage's)."""
    out = []
    for s in range(len(results[0]["steps"])):
        params: dict = {}
        state: dict = {}
        for res in results:
            rec = res["steps"][s]
            for name, value in rec["params"].items():
                if value is not None and name not in params:
                    params[name] = value
                    state[name] = rec["state"].get(name, (None, None))
        out.append({"params": params, "state": state})
    return out


def start_model(case: StepCase, target: StepTarget, initial: dict | None, master: str, dtype: str) -> Any:
    """The model a reference starts from, on CPU with parameters of ``dtype``: the tiny Llama with the case's
    weights, or the target's factory loaded with ``initial``; either rounded to ``master`` first (the weights
    the ranks start from: the case's float64 weights cast to the master dtype)."""
    import torch

    from distcheck.parallel.step.case import weights
    from distcheck.parallel.step.model import build_model

    def rounded(value: Any) -> Any:
        value = torch.as_tensor(value)
        return value.to(getattr(torch, master)).to(value.dtype) if value.is_floating_point() else value

    if target.model is None:
        start = {k: rounded(v).numpy() for k, v in weights(case).items()}
        return build_model(case.config, start, dtype=dtype)
    model = build_target_model(target.model, case.config, case.seed)
    state = model.state_dict() if initial is None else {k: torch.as_tensor(v) for k, v in initial.items()}
    model.load_state_dict({k: rounded(v) for k, v in state.items()})
    return floating_to(model, getattr(torch, dtype))


def reference_step(case: StepCase, tokens: Any, labels: Any, starts: list[dict] | None = None,
                   target: StepTarget | None = None, initial: dict | None = None) -> list[dict]:
    """The single-device float64 step on the whole batch of each step: ``loss`` (token mean), ``tokens``,
    ``norm`` (before clipping), ``scale`` (min(1, max_norm / (norm + 1e-6))), ``params`` and ``state``.

    ``starts`` (:func:`parallel_states`): step s + 1 starts from the parameters and AdamW moments the parallel run
    reached after step s (step 1 from the case's weights), so that every step is held to the single-device step
    from the same state: a deviation within the bound is not compounded into later steps (AdamW's
    ``m / (sqrt(v) + eps)`` amplifies the rounding of a gradient that cancels by up to 1/eps), and each step's
    arithmetic is checked on its own (:mod:`distcheck.parallel.step.bound`). None: the reference's own
    trajectory. ``target`` (default: the tiny Llama and the default hooks) gives the model factory and the
    ``batch`` and ``loss`` hooks; a factory's model starts from ``initial`` (rank 0's initial ``state_dict``,
    numpy arrays or tensors by name; None: the factory's own seeded weights). Under a low precision (the case's
    ``layout.precision``) this is the float64 shadow: step 1 starts from the weights rounded to the master dtype,
    as the ranks do (:mod:`distcheck.parallel.step.precision`)."""
    import torch

    from distcheck.parallel.step.hooks import StepInfo, StepTarget, call_model
    from distcheck.parallel.step.model import IGNORE_INDEX, load_balance_loss, moe_layers
    from distcheck.parallel.step.precision import get_precision
    from distcheck.parallel.step.reference import StepLayout

    target = target or StepTarget(lambda model, mesh, layout: model)
    prec = get_precision(case.layout.precision)
    model = start_model(case, target, initial, prec.master, "float64")
    opt = torch.optim.AdamW(model.parameters(), lr=case.lr, **ADAMW)
    out = []
    for s in range(case.steps):
        if s and starts is not None:
            _load(model, opt, starts[s - 1])
        total = int((labels[s] != IGNORE_INDEX).sum())
        # the whole step's batch at once; a model with MoE layers one micro-batch index at a time (every dp rank's
        # sequences of it together), its load-balancing loss being over each global micro-batch
        parts = ([(tokens[s][:, k], labels[s][:, k]) for k in range(case.microbatches)] if moe_layers(model) else
                 [(tokens[s], labels[s])])
        opt.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for xk, yk in parts:
            x, y = xk.reshape(-1, case.seq_len), yk.reshape(-1, case.seq_len)
            info = StepInfo(StepLayout(precision=prec.name), None, total, int((y != IGNORE_INDEX).sum()), 1,
                            case.max_norm, 0, target.loss, None, model)
            ce = target.loss(call_model(model, target.batch(x, y, info)), y, info)
            part = ce / total
            aux = load_balance_loss(model)
            if not isinstance(aux, float):
                part = part + aux / len(parts)
            part.backward()
            loss_sum = loss_sum + ce.detach()
        loss = loss_sum / total
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), case.max_norm))
        opt.step()
        out.append({"loss": float(loss.detach()), "tokens": total, "norm": norm,
                    "scale": min(1.0, case.max_norm / (norm + 1e-6)), **_record(model, opt)})
    return out


def reference_trace(case: StepCase, tokens: Any, labels: Any, starts: list[dict] | None = None,
                    target: Any = None, initial: dict | None = None) -> dict:
    """The single-device float64 step recorded (:mod:`~distcheck.parallel.step.trace`): each dp rank's
    micro-batches run one at a time (``tokens``, ``labels``: ``(steps, dp, m, micro_batch_size, seq_len)``), the loss
    of each its per-token sum (the target's ``loss`` hook) times ``dp / T``, the gradients divided by dp after the
    last, torch's ``clip_grad_norm_`` and AdamW; step s + 1 from ``starts[s]``; ``target`` and ``initial`` as
    :func:`reference_step` takes them (the model factory, its ``batch`` and ``loss`` hooks, rank 0's initial
    weights). Returns ``{"events": [...], "tied": {name: [the other names of the same tensor]}}``."""
    import torch

    from distcheck.parallel.step.case import weights
    from distcheck.parallel.step.hooks import StepInfo, StepTarget, call_model
    from distcheck.parallel.step.model import IGNORE_INDEX, build_model
    from distcheck.parallel.step.reference import StepLayout
    from distcheck.parallel.step.trace import Recorder, tied_names

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
    return {"events": rec.close(), "tied": tied_names(model)}


def _load(model: Any, opt: Any, start: dict) -> None:
    """Set ``model``'s parameters and ``opt``'s AdamW moments (not its step count) to ``start``'s arrays by name;
    a name ``start`` lacks keeps the reference's own value."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if start["params"].get(name) is not None:
                p.copy_(torch.from_numpy(start["params"][name]))
            state = opt.state.get(p, {})
            for key, value in zip(("exp_avg", "exp_avg_sq"), start["state"].get(name, (None, None)), strict=True):
                if value is not None and key in state:
                    state[key].copy_(torch.from_numpy(value))
