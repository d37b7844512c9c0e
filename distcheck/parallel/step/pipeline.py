"""The pipeline side of the ``training-step`` contract's step (torch imported inside the functions): under pp > 1
either distcheck cuts its own tiny Llama into stages and drives ``torch.distributed.pipelining`` itself
(:func:`pipeline_step`), or a target's own ``pipeline`` hook splits the whole model and returns its schedule
(:func:`own_split`, then :func:`schedule_step` each step). :func:`~distcheck.parallel.step.harness.run_step` calls
them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distcheck.engine.world import RankContext
    from distcheck.parallel.step.case import StepCase
    from distcheck.parallel.step.hooks import StepTarget

__all__ = ["own_split", "merge_inputs", "schedule_step", "pipeline_step"]


def own_split(ctx: RankContext, target: StepTarget, model: Any, mesh: Any, case: StepCase, state: dict) -> Any:
    """The target's ``pipeline(model, mesh, layout, info)`` hook called on the whole ``model``
    (:class:`~distcheck.parallel.step.hooks.PipelineInfo`: m, the micro-batch size, the device, the drawn schedule
    and the stage loss below). Returns ``(schedule, part)``, this rank's one model part. The stage loss of a
    micro-batch is the target's ``loss_fn``; the target's ``loss`` hook's token sum of it is appended to
    ``state["sums"]`` (``state["total"]``: the step's global tokens, set by :func:`schedule_step`). Raises
    ProtocolError naming the hook when it does not return ``(schedule, [nn.Module])`` or returns several parts on
    this rank (an interleaved schedule: distcheck steps one stage per rank)."""
    import torch

    from distcheck.core.vocab import Schedule
    from distcheck.engine.contracts.errors import ProtocolError
    from distcheck.parallel.step.hooks import PipelineInfo, StepInfo
    from distcheck.parallel.step.model import IGNORE_INDEX

    layout, m = case.layout, case.microbatches

    def loss(out: Any, y: Any) -> Any:
        info = StepInfo(layout, mesh, state["total"], int((y != IGNORE_INDEX).sum()), m, case.max_norm, 0,
                        target.loss, None, state["model"])
        with torch.no_grad():
            value = target.loss(out, y, info)
            value = value.full_tensor() if hasattr(value, "full_tensor") else value
            state["sums"].append(value.detach().to(device="cpu", dtype=torch.float64))
        return target.loss_fn(out, y, info)

    info = PipelineInfo(m, case.micro_batch_size, ctx.device, Schedule(case.schedule).value, loss)
    hook = target.pipeline
    if hook is None:
        raise RuntimeError("distcheck defect: own_split called for a target without a pipeline hook")
    got = hook(model, mesh, layout, info)
    shown = _named(hook)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not isinstance(got[1], (tuple, list)) or not all(
            isinstance(p, torch.nn.Module) for p in got[1]) or not hasattr(got[0], "step"):
        raise ProtocolError("pipeline", shown, f"the pipeline hook must return (schedule, model_parts): a "
                            f"torch.distributed.pipelining schedule and a list of nn.Module, not {_shape(got)}")
    if len(got[1]) != 1:
        raise ProtocolError("pipeline", shown, f"the pipeline hook returned {len(got[1])} model parts on rank "
                            f"{ctx.rank}: distcheck steps exactly one pipeline stage per rank (GPipe, 1F1B)"
                            + (", not an interleaved schedule's several" if got[1] else ""))
    stage = getattr(got[0], "_stage", None)  # a single-stage schedule's PipelineStage (no public accessor)
    if stage is not None and getattr(stage, "submod", got[1][0]) is not got[1][0]:
        runs, part = type(stage.submod).__name__, type(got[1][0]).__name__
        raise ProtocolError("pipeline", shown, "the pipeline hook's schedule runs " + (
                            f"another {runs} than the one" if runs == part else f"a {runs}, not the {part}") +
                            f" it returned as the part on rank {ctx.rank}: return the module its PipelineStage "
                            "wraps, which distcheck steps with AdamW and records")
    if getattr(got[0], "_loss_fn", info.loss) is None:
        raise ProtocolError("pipeline", shown, "the pipeline hook's schedule has no loss_fn: build it with "
                            "loss_fn=info.loss (distcheck's stage loss)")
    count = getattr(got[0], "_n_microbatches", m)  # torch's schedules keep it there (no public accessor)
    if count != m:
        raise ProtocolError("pipeline", shown, f"the pipeline hook's schedule runs {count} micro-batches, the step "
                            f"{m} (info.microbatches): build it with n_microbatches=info.microbatches, each "
                            f"micro-batch info.microbatch_size sequences (the step's loss and tokens are counted per "
                            f"micro-batch)")
    state["model"] = got[1][0]
    return got[0], got[1][0]


def _named(hook: Any) -> str:
    """A hook as a user names it: ``module:qualname`` (a ``functools.partial``'s function), else its repr."""
    fn = getattr(hook, "func", hook)
    name = getattr(fn, "__qualname__", None)
    return f"{getattr(fn, '__module__', '?')}:{name}" if name else repr(hook)


def _shape(value: Any) -> str:
    """What a hook returned, by type: ``(ScheduleGPipe, FSDPLM)``, ``None``."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(f"[{', '.join(type(p).__name__ for p in v)}]" if isinstance(v, (tuple, list))
                          else type(v).__name__ for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return type(value).__name__


def merge_inputs(inputs: list) -> tuple[tuple, dict]:
    """The ``batch`` hook's inputs of the m micro-batches as one call's ``(args, kwargs)``: each tensor
    concatenated along dim 0 (the schedule splits it into the m micro-batches again), anything else the first
    micro-batch's (a schedule passes it whole to every micro-batch)."""
    import torch

    def cat(values: list) -> Any:
        return torch.cat(values, dim=0) if isinstance(values[0], torch.Tensor) else values[0]

    first = inputs[0]
    if isinstance(first, dict):
        return (), {k: cat([i[k] for i in inputs]) for k in first}
    if isinstance(first, tuple):
        return tuple(cat([i[j] for i in inputs]) for j in range(len(first))), {}
    return (cat(inputs),), {}


def schedule_step(ctx: RankContext, target: StepTarget, schedule: Any, model: Any, mesh: Any, case: StepCase,
                   tokens: Any, labels: Any, total: int, state: dict) -> Any:
    """One step of the target's own pipeline ``schedule`` (:func:`own_split`) on this dp rank's micro-batches
    (``tokens``, ``labels``: ``(m, micro_batch_size, seq_len)``): the first stage (pp coordinate 0) given the
    ``batch`` hook's inputs of each micro-batch (:func:`merge_inputs`), the last the labels as ``target``. Returns the
    summed per-token losses of the step (the last m of the stage loss's sums; 0 off the last stage)."""
    import torch

    from distcheck.parallel.step.hooks import StepInfo
    from distcheck.parallel.step.model import IGNORE_INDEX
    from distcheck.parallel.step.precision import autocast_hooks

    layout, m = case.layout, case.microbatches
    stage = layout.coordinates(ctx.rank)["pp"]
    state["total"], state["sums"] = total, []
    args: tuple = ()
    kwargs: dict = {}
    if stage == 0:
        inputs = []
        for k in range(m):
            x, y = tokens[k].to(ctx.device), labels[k].to(ctx.device)
            info = StepInfo(layout, mesh, total, int((y != IGNORE_INDEX).sum()), m, case.max_norm, k, target.loss,
                            None, model)
            inputs.append(target.batch(x, y, info))
        args, kwargs = merge_inputs(inputs)
    last = stage == layout.pp - 1
    if last:
        kwargs["target"] = labels.reshape(m * case.micro_batch_size, case.seq_len).to(ctx.device)
    hooks = autocast_hooks(model, layout.precision, ctx.device)  # the stage's forwards under autocast
    try:
        schedule.step(*args, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    if last and len(state["sums"]) < m:
        from distcheck.engine.contracts.errors import ProtocolError

        raise ProtocolError("pipeline", _named(target.pipeline), f"the schedule's loss_fn called info.loss "
                            f"{len(state['sums'])} times for {m} micro-batches on the last stage: build the schedule "
                            "with loss_fn=info.loss, or call it from yours (distcheck counts the step's loss there)")
    zero = torch.zeros((), dtype=torch.float64)
    return sum(state["sums"][-m:], zero) if last else zero


def pipeline_step(ctx: RankContext, target: StepTarget, model: Any, mesh: Any, case: StepCase, tokens: Any,
                   labels: Any, total: int) -> Any:
    """One step's forwards and backwards of this rank's stage through ``torch.distributed.pipelining``
    (``PipelineStage`` on the mesh's pp group, ``ScheduleGPipe`` or ``Schedule1F1B`` over the m micro-batches,
    ``scale_grads=False``: the loss hook already weighs each token). ``tokens``, ``labels``: this dp rank's
    ``(m, micro_batch_size, seq_len)``. Returns the summed per-token losses (0 off the last stage)."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from distcheck.core.vocab import Schedule
    from distcheck.parallel.step.hooks import StepInfo
    from distcheck.parallel.step.model import IGNORE_INDEX, token_loss_sum
    from distcheck.parallel.step.precision import autocast_hooks

    layout, m = case.layout, case.microbatches
    stage = layout.coordinates(ctx.rank)["pp"]
    sums: list = []

    # called on the last stage once per micro-batch, and on a schedule's first step once more before them (its
    # shape inference runs the loss on the whole target): the step's losses are the last m calls
    def loss(out: Any, y: Any) -> Any:
        sums.append(token_loss_sum(out.detach(), y).cpu())
        info = StepInfo(layout, mesh, total, int((y != IGNORE_INDEX).sum()), m, case.max_norm)
        return target.loss_fn(out, y, info)

    pipe = PipelineStage(model, stage, layout.pp, ctx.device, group=mesh.get_group("pp"))
    cls = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}[Schedule(case.schedule)]
    schedule = cls(pipe, n_microbatches=m, loss_fn=loss, scale_grads=False)
    x, y = (a.reshape(m * case.micro_batch_size, case.seq_len).to(ctx.device) for a in (tokens, labels))
    last = stage == layout.pp - 1
    hooks = autocast_hooks(model, layout.precision, ctx.device)  # the stage's forwards under autocast
    try:
        schedule.step(*((x,) if stage == 0 else ()), **({"target": y} if last else {}))
    finally:
        for hook in hooks:
            hook.remove()
    return sum(sums[-m:], torch.zeros((), dtype=torch.float64)) if last else torch.zeros((), dtype=torch.float64)
