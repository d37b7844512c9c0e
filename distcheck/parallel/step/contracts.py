"""The ``training-step`` contract: a whole training step under composed parallelism (FSDP2 ``dp_shard`` x
HSDP ``dp_replicate`` x tensor parallelism ``tp`` x pipeline ``pp`` x context parallelism ``cp`` x expert
parallelism ``ep`` x gradient accumulation) against the single-device float64 step, with the token-mean loss,
the MoE layers' load-balancing loss, grad-norm clipping and AdamW's state.

Target: a torchtitan-style ``parallelize(model, mesh, layout) -> model`` (``model`` distcheck's tiny
Llama, :mod:`distcheck.parallel.step.model`; ``mesh`` a ``DeviceMesh`` of dims ``("pp", "dp_replicate",
"dp_shard", "cp", "tp")`` with torchtitan's flattened ``dp_shard_cp`` and ``dp_cp``; under ep the experts' mesh
is :func:`~distcheck.parallel.step.hooks.expert_mesh`; under pp > 1 ``model`` is already this rank's stage,
torchtitan's split, unless the target's own ``pipeline`` hook splits the whole model; ``layout`` a
:class:`~distcheck.parallel.step.reference.StepLayout`), or a :class:`~distcheck.parallel.step.hooks.StepTarget`
that also replaces the step's hooks (the loss of a
micro-batch, the reported loss and tokens, the grad-norm clipping) and may bring its own model: a factory
``model(config) -> nn.Module``, with the ``batch`` and ``loss`` hooks for its inputs and a loss it computes
itself (:mod:`distcheck.parallel.step.hooks`; its config fixes the vocabulary and caps the sequence length drawn;
under pp its own ``pipeline`` hook splits it and builds the schedule, torchtitan's ``pipeline_llm``: without one,
``pp`` is left out of its axes). distcheck runs the step
(:mod:`distcheck.parallel.step.harness`). Hypothesis draws the layout (every factorisation of the world
size into dp_replicate x dp_shard x tp x pp x cp, with ep borrowed from dp x cp in torchtitan's placement or
Megatron's (:func:`layouts`), whose axes above 1 are among ``--option axes=...`` (default: the dense step's
dp_replicate, dp_shard, tp and pp; ``all``: cp and ep too) or a :class:`~distcheck.parallel.step.hooks.StepTarget`'s
``axes``, or the one ``--option layout=...`` pins), the decoder's sizes
(tied or untied head, 1 or 2 layers, grouped-query heads, RoPE under cp (no positions otherwise); under
pp = 2 one layer per stage, untied unless ``--option tied_pp=true`` (then tied: the embedding on the first
stage and the head on the last are two copies of one weight, Megatron-LM's shared embedding, whose gradients
the target sums over the two stages, :func:`~distcheck.parallel.step.hooks.all_reduce_tied`), the
schedule ``ScheduleGPipe`` or ``Schedule1F1B`` of
``torch.distributed.pipelining``, pp with tp too: each stage under the tensor-parallel plan; with ep among the
axes and tp = pp = 1, MoE layers of ep or 2 ep experts, top-1 or top-2, always under ep > 1), the
micro-batches (gradient-accumulation steps), every sequence's non-ignored length (so token counts differ per
rank, per micro-batch and per cp chunk), a clipping threshold that binds or not, the learning rate and 2 or 3
steps. One world run per example serves every property. Worlds of at most 4 ranks run under the ``dev`` and
``ci`` profiles, 8 under ``thorough`` (``max_world_sizes``; a larger one is a skip with the reason).

Properties (each its own verdict):

* ``params``: after every step each rank's parameters and AdamW moments (``exp_avg``, ``exp_avg_sq``,
  gathered to full tensors) equal the reference's;
* ``loss``: the reported loss of every step equals the global token mean (:func:`~.reference.token_mean_loss`:
  every token weighs ``1/T``, ``step.loss.token_weight``);
* ``grad_norm``: the reported norm equals the global norm before clipping (replicated parameters counted
  once, ``step.grad_norm.copies``);
* ``clipping``: the factor each rank's gradients were multiplied by (measured on its local shards before
  and after the hook) is the reference's ``min(1, max_norm / (norm + 1e-6))`` (``step.clip.scale``), the
  same factor for every entry;
* ``tokens``: the reported token count is the step's, and the ranks' own counts (one per dp and cp index) add
  up to it. Exact (integers).

The bound (float64): :mod:`distcheck.parallel.step.bound`. Each parameter and AdamW moment is held to
``2^-32 (|v_ref| + S_kind)``, ``S_kind`` the largest magnitude of that kind of value anywhere in the step's
model (a floor from the magnitudes of the terms, so a value that cancels to 0 in the reference keeps the
rounding its terms carry), and each parameter also to its moments' bounds carried through AdamW's update
(exact, eps = 1e-8 amplifies a moment's deviation where ``v`` is near 0). The reported loss, grad norm and
clipping factor are sums of terms of one sign (per-token losses, squares, a quotient of them), so each is its
own magnitude: ``2^-31 |v_ref|``. The bound module's doc says what is proved and what is estimated.

Precision (``--dtypes``): float64 as above; float32, and bfloat16 mixed precision (``--option mixed_precision``:
FSDP2's ``MixedPrecisionPolicy``, which the target applies when ``layout.precision`` is ``bf16-fsdp``, and/or
autocast), each value held to the single-device step in the same precision: its own error against the float64
shadow, plus the composition's floor (:mod:`distcheck.parallel.step.precision` has the criterion and its argument).
float32 and bfloat16 draw the dense step's axes only: a draw that names cp or ep (the option, a target's axes, a
pinned layout) is a skip in them with the reason (:data:`~distcheck.parallel.step.axes.LOW_PRECISION_AXES`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.vocab import Axis, Schedule
from distcheck.engine.contracts.contract import Contract, Option, Outcome, PropertySpec
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.engine.contracts.targets import check_call_shape, make_target, resolve
from distcheck.parallel.step.axes import (
    ALL,
    AXES,
    DEFAULT_AXES,
    LOW_PRECISION_AXES,
    OWN_MODEL_AXES,
    PP_SCHEDULES,
    allowed,
    axes_option,
    layouts,
    low_precision_refused,
    parse_layout,
    target_axes,
)
from distcheck.parallel.step.bound import BOUND, param_bounds
from distcheck.parallel.step.case import BINDING_MAX_NORM, FREE_MAX_NORM, StepCase
from distcheck.parallel.step.compare import clipping, extra_params, tokens
from distcheck.parallel.step.compare import first as _first
from distcheck.parallel.step.compare import within as _within
from distcheck.parallel.step.divergence import explain_step
from distcheck.parallel.step.mapping import assemble_params, check_shard_dims
from distcheck.parallel.step.model import TinyConfig, stages_of
from distcheck.parallel.step.precision import get_precision, precision_bounds, precisions_for
from distcheck.parallel.step.records import restore
from distcheck.parallel.step.reference import StepLayout

if TYPE_CHECKING:
    from distcheck.engine.contracts.targets import Target
    from distcheck.engine.world import RankContext

__all__ = ["TrainingStep", "BOUND", "layouts", "parse_layout", "PP_SCHEDULES"]


_PROPERTIES = (
    PropertySpec("params", "after every step each rank's parameters and AdamW moments equal the single-device "
                           "float64 step's", "bounded"),
    PropertySpec("loss", "the reported loss of every step is the global token mean (sum of per-token losses / "
                         "non-ignored tokens of the whole step)", "bounded"),
    PropertySpec("grad_norm", "the reported grad norm is the global norm before clipping, replicated parameters "
                              "counted once", "bounded"),
    PropertySpec("clipping", "every rank's gradients are multiplied by the reference's min(1, max_norm / (norm + "
                             "1e-6))", "bounded"),
    PropertySpec("tokens", "the reported tokens are the step's non-ignored tokens, and the dp (and cp) ranks' own "
                           "counts add up to them", "exact"),
)

#: why a user model's axes leave pp out without its own pipeline hook
_NO_SPLIT = ("a user model has no pipeline split without its own pipeline hook: distcheck cuts only its own tiny "
             "Llama into stages (model.pipeline_stage), so pp is left out of the axes of a StepTarget with a model "
             "factory unless it gives StepTarget(pipeline=...), a pipeline(model, mesh, layout, info) -> (schedule, "
             "model_parts) of its own split (distcheck.parallel.step.hooks)")
def _cases(choices: list[StepLayout], config: Any = None, longest: int | None = None, spec: Any = None, *,
           one_token: bool = False, moe: bool = False, max_norms: tuple[float, ...] = (BINDING_MAX_NORM, FREE_MAX_NORM),
           precisions: tuple[str, ...] = ("float64",), tied_pp: bool = False) -> st.SearchStrategy[StepCase]:
    """The drawn examples on ``choices`` (module doc). ``config``: a user model's own (fixed; else the tiny
    Llama's sizes are drawn), ``longest`` its longest sequence (caps the drawn length), ``spec`` the resolved
    StepTarget each case carries (its reference runs the target's model and hooks); ``one_token``: every
    sequence keeps one token (the compositions in which values cancel exactly: a softmax over one key leaves the
    query and key projections' gradients exactly 0); ``moe``: the tiny Llama may be drawn with MoE layers on a
    layout with tp = pp = 1 (ep among the axes drawn; a layout with ep > 1 always has them); ``max_norms``: the
    clipping thresholds drawn from; ``precisions``: the precisions drawn from
    (:mod:`~distcheck.parallel.step.precision`; the layout carries it); ``tied_pp``: the head tied under pp > 1."""

    @st.composite
    def draw(draw: st.DrawFn) -> StepCase:
        layout = draw(st.sampled_from(choices))
        if len(precisions) > 1 or precisions[0] != layout.precision:
            layout = replace(layout, precision=draw(st.sampled_from(precisions)))
        tp, pp, cp = layout.tp, layout.pp, layout.cp
        n_kv = tp
        experts = 0
        if config is None and (layout.ep > 1 or (moe and tp == 1 and pp == 1 and draw(st.booleans()))):
            experts = max(layout.ep, 2) * draw(st.integers(1, 2))  # every ep rank holds 1 or 2 experts
        # under pp: one layer per stage, the head tied under the tied_pp option only (two copies on two stages)
        cfg = config if config is not None else TinyConfig(
            dim=8, n_layers=pp if pp > 1 else draw(st.integers(1, 2)), n_heads=n_kv * draw(st.integers(1, 2)),
            n_kv_heads=n_kv, head_dim=2, ffn_dim=4 * tp, vocab_size=4 * max(tp, 2),
            tied=draw(st.booleans()) if pp == 1 else tied_pp, n_experts=experts,
            top_k=draw(st.integers(1, 2)) if experts else 1, rope=cp > 1)
        # a sequence is cut into 2 cp head-tail chunks, each into tp sequence-parallel shards
        unit = tp * (2 * cp if cp > 1 else 1)
        low, high = (1, 2) if unit > 1 else (2, 4)
        seq_len = unit * draw(st.integers(low, high if longest is None else max(low, min(high, longest // unit))))
        schedule = draw(st.sampled_from(PP_SCHEDULES)) if pp > 1 else ""
        m = draw(st.integers(pp if schedule == Schedule.ONE_F_ONE_B else 1, max(3, pp)))  # 1F1B needs m >= pp
        mbs = draw(st.integers(1, 2))
        steps = draw(st.integers(2, 3))
        length = st.just(1) if one_token else st.integers(1, seq_len)
        lengths = tuple(tuple(tuple(tuple(draw(st.lists(length, min_size=mbs, max_size=mbs))) for _ in range(m))
                              for _ in range(layout.dp)) for _ in range(steps))
        max_norm = draw(st.sampled_from(max_norms))
        lr = draw(st.sampled_from((2.0**-7, 2.0**-4)))
        return StepCase(layout, cfg, m, mbs, seq_len, lengths, max_norm, lr, draw(st.integers(0, 2**16)), schedule,
                        spec)

    return draw()


def _unrecorded(case: StepCase) -> str:
    """Why the first-divergence replay does not cover ``case`` ("" when it does): the recorder maps tensors over dp
    and tp, its reference runs each dp rank's micro-batches alone: a line there could name a right tensor."""
    moe = isinstance(case.config, TinyConfig) and case.config.n_experts > 0
    tied = isinstance(case.config, TinyConfig) and case.config.tied and case.layout.pp > 1
    what = " and ".join(w for w, on in (("cp ranks' head-tail chunks", case.layout.cp > 1),
                                           ("MoE layers' load-balancing loss over the global micro-batch", moe),
                                           ("tied head's two copies on two pipeline stages", tied)) if on)
    return f"the recorder maps tensors over dp and tp only, not the {what}" if what else ""


def _single(case: StepCase) -> Any:
    """The single-device step rank 0 runs beside the reference in a low precision (None in float64)."""
    from distcheck.parallel.step.single import device_step

    return None if case.layout.precision == "float64" else device_step


class TrainingStep(Contract):
    """A whole training step under composed parallelism (see the module doc)."""

    name = "training-step"
    parallelism = "step"
    summary = ("a torchtitan-style parallelize(model, mesh, layout): parameters, AdamW state, loss, grad norm, "
               "clipping and tokens of every step equal the single-device float64 step's")
    properties: ClassVar[tuple[PropertySpec, ...]] = _PROPERTIES
    dtypes = ("float64",)
    min_world_size = 2
    min_world_reason = ("one rank is one device: dp_replicate = dp_shard = tp = 1, so every reduction of the step "
                        "(the loss over dp ranks, the norm over shards, the gradients over replicas) is the identity "
                        "and a step that forgets one is the single-device step there")
    max_world_sizes: ClassVar[dict[str, int]] = {"dev": 4, "ci": 4, "thorough": 8}
    max_world_reason = ("every example is a whole training step of every rank (a model built and parallelized, "
                        "2 or 3 steps, every parameter and AdamW moment gathered), seconds at 8 ranks")
    options = (
        Option("layout", "", str, "pin the composition, e.g. dp_shard=2,tp=2 (axes left out are 1; default: draw "
                                  "every factorisation of the world size)"),
        Option("axes", "", str, "the axes drawn above 1, e.g. dp_replicate,dp_shard,cp,ep, or all (the six: "
                                "dp_replicate, dp_shard, tp, pp, cp, ep; default: a StepTarget's own axes, else "
                                "the dense step's dp_replicate, dp_shard, tp and pp; a StepTarget with its own "
                                "model: dp_replicate, dp_shard and tp)"),
        Option("tied_pp", False, bool, "under pp the tiny Llama's head is tied: the embedding on the first stage and "
                                       "the head on the last are copies of one weight (Megatron-LM's shared "
                                       "embedding), whose gradients the target sums over the two stages"),
        Option("mixed_precision", "fsdp,autocast", str,
               "the bf16 recipes drawn under --dtypes bfloat16: fsdp (FSDP2 MixedPrecisionPolicy(param_dtype=bf16, "
               "reduce_dtype=fp32), which the target's parallelize applies when layout.precision is bf16-fsdp), "
               "autocast (torch.autocast around the forward, no policy), or both, comma-separated"),
    )

    def cannot_fail(self, world_size: int, options: dict) -> str | None:
        base = super().cannot_fail(world_size, options)
        if base:
            return base
        if not options.get("layout"):
            if not allowed(world_size, options):
                return (f"no layout of {world_size} ranks has only the axes {options.get('axes')} above 1 (tp in "
                        "{1, 2, 4}, pp in {1, 2}, cp in {1, 2, 4}, ep borrowed from dp x cp)")
            return None
        lay = parse_layout(options["layout"])
        if lay.world_size == 1:
            return (f"the pinned layout {lay} degenerates to one device: every reduction of the step is the "
                    "identity there")
        if lay.world_size != world_size:
            return f"the pinned layout {lay} needs {lay.world_size} ranks, not {world_size}"
        return None

    def composition(self, case: StepCase) -> dict[str, str]:
        """The "Compositions drawn" columns of ``case``: ``layout`` (the axes above 1, ``dp_shard=2, tp=2``; ep with
        its placement, ``cp=2, ep=4 (megatron)``), ``schedule`` (``-`` when pp = 1), ``micro-batches`` (m per dp
        rank, the gradient-accumulation steps), ``steps`` (optimizer steps), ``clip`` (``binds`` or ``free``) and
        ``model`` (``dense`` or ``MoE``, with ``RoPE``; ``own`` for a user's model); under a low precision also
        ``precision`` (``float32``, ``bf16-fsdp``, ``bf16-autocast``)."""
        lay = case.layout
        axes = [f"{a}={getattr(lay, a)}" for a in AXES if getattr(lay, a) > 1]
        if lay.ep > 1:
            axes[-1] += f" ({lay.ep_placement})"
        c = case.config
        model = ("own" if not isinstance(c, TinyConfig) else
                 ("MoE" if c.n_experts else "dense") + (", RoPE" if c.rope else ""))
        out = {"layout": ", ".join(axes) or "one device",
               "schedule": case.schedule or "-", "micro-batches (GA steps)": str(case.microbatches),
               "steps": str(case.steps), "clip": "binds" if case.clip_binds else "free", "model": model}
        if lay.precision != "float64":
            out["precision"] = lay.precision
        return out

    def statement(self, prop: str, dtype: str, options: dict) -> str:
        """The property's statement; in float32 and bfloat16 the values are held to the single-device step in the
        same precision (:mod:`distcheck.parallel.step.precision`)."""
        base = self.spec(prop).statement
        if dtype == "float64" or prop == "tokens":
            return base
        return (base.replace("the single-device float64 step's", f"the single-device {dtype} step's")
                + f" ({dtype}: within the single-device {dtype} step's own error against the float64 shadow, plus "
                  "the composition's floor)")

    def resolve(self, obj: Any, ref: str | None, options: dict) -> tuple[Target, dict]:
        from distcheck.parallel.step.hooks import StepTarget, check_hooks, user_config_limits

        shown = ref or repr(obj)
        given = axes_option(options["axes"]) if options.get("axes") else ()
        if isinstance(obj, StepTarget):
            check_hooks(obj, shown)
            check_shard_dims(obj.shard_dims, shown)
            own = target_axes(obj.axes, shown)
            user_config_limits(obj, shown)
            unsplit = obj.model is not None and obj.pipeline is None  # a user model without its pipeline hook
            if obj.model is not None:
                if Axis.PP.value in own and unsplit:
                    raise ProtocolError("target", shown, f"StepTarget axes={tuple(own)!r} name pp: {_NO_SPLIT}")
                own = own or (OWN_MODEL_AXES if unsplit else (*OWN_MODEL_AXES, Axis.PP.value))
            outside = sorted(set(given) - set(own or AXES))  # a target naming no axes may be given any
            if outside:
                why = f" ({_NO_SPLIT})" if unsplit and Axis.PP.value in outside else ""
                raise ConfigError("option axes", options["axes"], f"the target parallelizes only "
                                  f"{', '.join(own)}, not {', '.join(outside)}{why}")
            drawn = given or own or DEFAULT_AXES
            if obj.loop_hooks and Axis.PP.value in drawn:
                raise ProtocolError("target", shown, f"replaces {', '.join(obj.loop_hooks)}, which the pipeline "
                                    "schedule does not call: leave pp out of its axes (StepTarget(..., axes=...) "
                                    "or --option axes=...)")
            if own and not given:
                options = dict(options, axes=",".join(own))
        elif not callable(obj) or isinstance(obj, type):
            raise ProtocolError("target", shown, "must be parallelize(model, mesh, layout) -> model or a StepTarget")
        else:
            check_call_shape(obj, shown, "must be parallelize(model, mesh, layout) -> model", 3)
        precisions_for("bfloat16", options.get("mixed_precision", "fsdp,autocast"))  # a bad option, before any run
        # a pinned layout with no axes named (by the option or the target) is the draw: cp and ep may be pinned
        named = axes_option(options.get("axes", "") or (ALL if options.get("layout") else ""))
        if options.get("layout"):
            lay = parse_layout(options["layout"])
            outside_layout = [a for a in AXES if getattr(lay, a) > 1 and a not in named]
            if outside_layout:
                why = (f" ({_NO_SPLIT})" if Axis.PP.value in outside_layout and isinstance(obj, StepTarget)
                       and obj.model is not None and obj.pipeline is None else "")
                raise ConfigError("option layout", options["layout"], f"sets {', '.join(outside_layout)} above 1, "
                                  f"outside the axes {', '.join(named)}{why}")
        return make_target(obj, ref, "hooks" if isinstance(obj, StepTarget) else "parallelize"), options

    def skipped(self, target: Any, options: dict) -> dict[str, str]:
        """Every property of a target stepping under torch's ``context_parallel``
        (:data:`distcheck.parallel.step.plans.TORCH_CONTEXT_PARALLEL`, its ``accumulate`` hook) where torch refuses
        the attention op (without a GPU, torch 2.13): torch's refusal as the reason
        (:func:`distcheck.parallel.cp.plans.cpu_refusal`)."""
        from distcheck.parallel.step.hooks import StepTarget
        from distcheck.parallel.step.plans import torch_context_parallel

        obj = resolve(target)
        if not isinstance(obj, StepTarget) or obj.accumulate is not torch_context_parallel:
            return {}
        import torch

        from distcheck.parallel.cp.plans import cpu_refusal

        reason = cpu_refusal("cuda" if torch.cuda.is_available() else "cpu")
        return {} if reason is None else {p.name: reason for p in self.properties}

    def cases(self, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[StepCase] | None:
        drawn = self._precisions(dtype, options)
        if not drawn:
            return None
        moe = Axis.EP.value in axes_option(options.get("axes", ""))
        tied = bool(options.get("tied_pp", False))
        if options.get("layout"):
            return _cases([parse_layout(options["layout"])], moe=moe, precisions=drawn, tied_pp=tied)
        choices = allowed(world_size, options)
        return _cases(choices, moe=moe, precisions=drawn, tied_pp=tied) if choices else None

    @staticmethod
    def _precisions(dtype: str, options: dict) -> tuple[str, ...]:
        """The precisions drawn in ``dtype`` (:func:`~distcheck.parallel.step.precision.precisions_for`); none in
        a low precision when the draw names cp or ep (:data:`~distcheck.parallel.step.axes.LOW_PRECISION_AXES`)."""
        drawn = precisions_for(dtype, options.get("mixed_precision", "fsdp,autocast"))
        return () if dtype != "float64" and low_precision_refused(options) else drawn

    def cases_for(self, target: Any, world_size: int, dtype: str, options: dict) -> st.SearchStrategy[StepCase] | None:
        """:meth:`cases`; for a :class:`StepTarget` each case carries the target (its reference runs the target's
        model factory and ``batch`` and ``loss`` hooks), and a user model's own config is fixed (its vocabulary,
        its longest sequence capping the drawn length)."""
        from distcheck.parallel.step.hooks import StepTarget, user_config_limits

        obj = resolve(target)
        if not isinstance(obj, StepTarget):
            return self.cases(world_size, dtype, options)
        drawn = self._precisions(dtype, options)
        _, longest = user_config_limits(obj, target.ref)
        choices = ([parse_layout(options["layout"])] if options.get("layout") else allowed(world_size, options))
        moe = Axis.EP.value in axes_option(options.get("axes", ""))
        return (_cases(choices, obj.config, longest, target, moe=moe, precisions=drawn,
                       tied_pp=bool(options.get("tied_pp", False))) if choices and drawn else None)

    def skip_reason(self, world_size: int, dtype: str, options: dict) -> str:
        refused = low_precision_refused(options) if dtype in ("float32", "bfloat16") else []
        if refused:
            return (f"{self.name} in {dtype} draws dp_replicate, dp_shard, tp and pp only, and this draw names "
                    f"{' and '.join(refused)}: " + "; ".join(f"{a}: {LOW_PRECISION_AXES[a]}" for a in refused)
                    + " (float64 certifies them; leave them out of --option axes or --option layout to certify the "
                      f"rest in {dtype})")
        return (f"{self.name} is certified in float64, float32 and bfloat16 (bf16 mixed precision: "
                f"distcheck.parallel.step.precision), not {dtype}")

    def run_rank(self, ctx: RankContext, target: Target, case: StepCase, dtype: str, options: dict) -> dict:
        from distcheck.parallel.step.harness import run_step
        from distcheck.parallel.step.hooks import StepTarget

        obj = resolve(target)
        res = run_step(ctx, obj if isinstance(obj, StepTarget) else StepTarget(obj), case, single=_single(case),
                       every=True)
        if ctx.rank != 0:
            return {"checked_on_rank": 0}
        # checked here, where every rank's arrays and the reference already are: the parent gets the outcomes,
        # not every parameter and AdamW moment of every rank and of the reference (hundreds of MB a step for a
        # model of a few million parameters)
        results = [dict(res["every"][0], **{k: res[k] for k in ("reference", "single") if k in res})]
        try:
            return {"outcomes": self.check(case, results + res["every"][1:], ctx.world_size, dtype, options)}
        except ConfigError as exc:  # the parent raises it, as when it checks itself
            return {"check_error": exc}

    def explain_rank(self, ctx: RankContext, target: Target, case: StepCase, dtype: str, options: dict) -> dict:
        """The replay of a failure's shrunk case with every tensor recorded (:mod:`~distcheck.parallel.step.trace`);
        none under cp, with MoE layers or with a tied head under pp (:func:`_unrecorded`: every rank returns the
        reason, nothing runs), nor in a low precision (:meth:`explain`)."""
        from distcheck.parallel.step.harness import run_step
        from distcheck.parallel.step.hooks import StepTarget

        if case.layout.precision != "float64":
            return {}
        why = _unrecorded(case)
        if why:
            return {"unrecorded": why}
        obj = resolve(target)
        return run_step(ctx, obj if isinstance(obj, StepTarget) else StepTarget(obj), case, record=True)

    def explain(self, case: StepCase, results: list, world_size: int, dtype: str, options: dict) -> str:
        """The first tensor of the recorded replay that leaves its bound
        (:func:`~distcheck.parallel.step.divergence.explain_step`), or why none was recorded; float64 only: the
        replay's tensors are held to the float64 step, which a lower precision's own rounding leaves everywhere."""
        if case.layout.precision != "float64":
            return (f"first divergence: not traced in {case.layout.precision} (the recorded replay holds every tensor "
                    "to the float64 step, which the precision's own rounding leaves everywhere); the failing value "
                    "above, held to the single-device step in the same precision, is the finding")
        if results and results[0].get("unrecorded"):
            return f"no first divergence recorded: {results[0]['unrecorded']}"
        return explain_step(case, results)

    def check(self, case: StepCase, results: list, world_size: int, dtype: str, options: dict) -> dict[str, Outcome]:
        from distcheck.parallel.step.harness import ADAMW

        if results and "check_error" in results[0]:
            raise results[0]["check_error"]
        if results and "outcomes" in results[0]:  # checked on rank 0 (run_rank)
            return dict(results[0]["outcomes"])
        results = restore(results)  # the arrays a rank shipped as the same as a lower rank's (step.records)
        ref = results[0]["reference"]
        prec = get_precision(case.layout.precision)
        bounds: list[dict[str, Any]]
        if prec.name == "float64":
            bounds = [{"params": b} for b in param_bounds(ref, lr=case.lr, **ADAMW)]
        else:
            devices = sorted({res.get("device", "cpu") for res in results})
            if devices != ["cpu"]:
                raise ConfigError("dtypes", dtype, f"is certified on CPU worlds only (the ranks ran on {devices}): the "
                                  "single-device step runs on CPU and must run a rank's kernels")
            bounds = precision_bounds(ref, results[0]["single"], prec, case.layout.tp, lr=case.lr, **ADAMW)
        # plain tp shards (Megatron style) as full tensors, the reference's shapes
        results = assemble_params(case.layout, results, {n: np.shape(v) for n, v in ref[0]["params"].items()})
        out: dict[str, list[Outcome]] = {p.name: [] for p in _PROPERTIES}
        for s, r in enumerate(ref):
            # the tiny Llama's drawn sizes keep every norm above the binding threshold; a user model's may not
            # (its clipping is still checked against the reference's factor)
            if case.clip_binds and not r["norm"] > case.max_norm and isinstance(case.config, TinyConfig):
                raise RuntimeError(f"distcheck defect: a case drawn as 'clip binds' has norm {r['norm']} <= "
                                   f"max_norm {case.max_norm} at step {s}; please report it")
            at = f"step {s + 1}"
            b = bounds[s]
            mine = b.get("own", {})
            steps = [res["steps"][s] for res in results]
            for name, want in r["params"].items():
                # the ranks of the parameter's pipeline stages hold it (every rank when pp = 1; a tied head's
                # embedding: the first and the last stage, each its own copy); under a target's own split
                # (pipeline hook) the ranks whose part holds it, every rank when none does (each then holds nothing)
                if case.layout.pp == 1:
                    held = list(range(len(steps)))
                elif results[0].get("own_split") or not isinstance(case.config, TinyConfig):
                    held = [i for i in range(len(steps)) if name in steps[i]["params"]] or list(range(len(steps)))
                else:
                    held = [i for i in range(len(steps))
                            if case.layout.coordinates(i)["pp"] in stages_of(name, case.config, case.layout.pp)]
                errs = mine.get(name, (None, None, None))
                out["params"].append(_within(f"{at} {name}", want, [steps[i]["params"].get(name) for i in held], held,
                                             b["params"][name][0], errs[0], dtype))
                for j, moment in enumerate(("exp_avg", "exp_avg_sq")):
                    w = r["state"][name][j]
                    got = [steps[i]["state"].get(name, (None, None))[j] for i in held]
                    out["params"].append(_within(f"{at} AdamW {moment} of {name}", w, got, held,
                                                 b["params"][name][j + 1], errs[j + 1], dtype))
            out["params"].append(self._extra(at, r["params"], steps))
            scalar: dict[str, tuple[Any, Any]] = {k: b.get(k, (None, None)) for k in ("loss", "norm", "scale")}
            out["loss"].append(_within(f"{at} reported loss (global token mean)", r["loss"],
                                       [st_["loss"] for st_ in steps], None, scalar["loss"][0], scalar["loss"][1],
                                       dtype))
            out["grad_norm"].append(_within(f"{at} reported grad norm", r["norm"], [st_["norm"] for st_ in steps],
                                            None, scalar["norm"][0], scalar["norm"][1], dtype))
            out["clipping"].append(self._clipping(at, r, steps, scalar["scale"], dtype))
            out["tokens"].append(self._tokens(at, r["tokens"], steps, [(res["dp_index"], res.get("cp_index", 0))
                                                                       for res in results]))
        return {name: _first(outs) for name, outs in out.items()}

    # the comparisons beside the values' (distcheck.parallel.step.compare)
    _extra = staticmethod(extra_params)
    _clipping = staticmethod(clipping)
    _tokens = staticmethod(tokens)
