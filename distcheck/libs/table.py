"""One row per target: the README's table "What distcheck finds in real libraries".

:func:`summary_rows` folds the contract rows of :func:`distcheck.libs.run_libs` into one
:class:`TargetRow` per target (library, version, contract, verdict with the convention
named, smallest counterexamples, evidence); :func:`to_markdown` renders them.
A target's verdict is ``FAIL`` when any of its rows failed, ``finding`` when a recorded
finding explains every row that did not pass, ``certified`` when every row passed (a
property that does not apply, such as the printed unit of an estimator that prints
nothing, is ``skip`` and counted apart), ``skip`` when every row was skipped (nothing was
certified: a module that does not import, with what to install), and ``not installed``
when its library is absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from distcheck.core.results import FAIL, FINDING, PASS, SKIP, CheckResult

__all__ = ["UNITS", "TargetRow", "summary_rows", "to_markdown"]

#: (README row, library, certify contracts, check-name prefixes): one row per target of the issue
UNITS = (
    ("DeepSpeed ZeRO-2 estimator", "deepspeed", "memory-estimator", ("libs.deepspeed.zero2.",)),
    ("DeepSpeed ZeRO-3 estimator", "deepspeed", "memory-estimator; memory-estimator-stages (ZeRO-2 against ZeRO-3)",
     ("libs.deepspeed.zero3.", "libs.deepspeed.zero.")),
    ("DeepSpeed-Ulysses DistributedAttention (gloo, 2 and 4 ranks)", "deepspeed", "context-parallel-attention",
     ("libs.deepspeed.ulysses.",)),
    ("DeepSpeed MoE (TopKGate k=2, gloo, 2 ranks, one or two experts each)", "deepspeed", "moe-layer",
     ("libs.deepspeed.moe.",)),
    ("accelerate estimate-memory, training", "accelerate", "memory-estimator; bad-input",
     ("libs.accelerate.float32.", "libs.accelerate.float16.", "libs.accelerate.training_usage.")),
    ("accelerate gradient accumulation under DDP, basic loop (mean loss per micro-batch; gloo, 2 ranks)",
     "accelerate", "training-step (dp_replicate=2)", ("libs.accelerate.ga_mean_loss.",)),
    ("accelerate gradient accumulation under DDP, the guide's token-weighted loop (gloo, 2 ranks)", "accelerate",
     "training-step (dp_replicate=2)", ("libs.accelerate.ga_token_sum.",)),
    ("Megatron-core theoretical memory", "megatron-core", "memory-estimator", ("libs.megatron.theoretical_memory.",)),
    ("Megatron-core RankGenerator", "megatron-core", "rank-layout; bad-input", ("libs.megatron.rank_generator.",)),
    ("torchtitan ParallelDims (fake backend)", "torchtitan", "rank-layout; bad-input",
     ("libs.torchtitan.parallel_dims.",)),
    ("torchtitan clip_grad_norm_, without and with a pp mesh (gloo, 2 ranks)", "torchtitan",
     "training-step (layouts dp_shard=2, tp=2, pp=2)", ("libs.torchtitan.clip_grad_norm_",)),
    ("torchtitan CheckpointManager (gloo, CPU)", "torchtitan", "checkpoint", ("libs.torchtitan.checkpoint_manager.",)),
    ("torchtitan dropless MoE (TokenChoiceTopKRouter, AllToAllTokenDispatcher; gloo, 2 and 4 ranks)", "torchtitan",
     "moe-layer (dropless)", ("libs.torchtitan.moe.",)),
    ("torchtitan DeepSeek-V3 MoE debug model under its own parallelize (EP, FSDP2, TP)", "torchtitan",
     "training-step", ("libs.torchtitan.moe_step",)),
    ("torchtitan Llama 3 (debug-model architecture, small sizes) under its own parallelize_llama and pipeline_llm: "
     "FSDP2, TP, PP (gloo, 2 and 4 ranks; CPU meshes, SDPA for FlexAttention, float64 FSDP2 mixed precision)",
     "torchtitan", "training-step (layouts dp_shard=2, tp=2, dp_shard=2 x tp=2, pp=2 (GPipe, 1F1B), pp=2 x tp=2, "
     "dp_shard=2 x pp=2)", ("libs.torchtitan.llama_",)),
    ("transformers LlamaForCausalLM, tp_plan auto and FSDP2 through DistributedConfig (gloo, 2 and 4 ranks)",
     "transformers", "training-step (layouts tp=2, dp_shard=2, dp_shard=2 x tp=2)", ("libs.transformers.llama_",)),
    ("transformers MixtralForCausalLM (4 experts, top-2), tp_plan auto and FSDP2 (gloo, 2 ranks)", "transformers",
     "training-step (layouts tp=2, dp_shard=2)", ("libs.transformers.mixtral_",)),
)
_TARGET_OF = {"deepspeed": "deepspeed", "accelerate": "accelerate", "megatron-core": "megatron",
              "torchtitan": "torchtitan", "transformers": "transformers"}


@dataclass(frozen=True)
class TargetRow:
    """One README row."""

    target: str
    library: str
    version: str
    contract: str
    verdict: str
    counterexamples: tuple[str, ...]
    evidence: tuple[str, ...]


def _observed(r: CheckResult) -> str:
    marker = "Observed: "
    return r.detail.split(marker, 1)[1] if r.verdict == FINDING and marker in r.detail else r.detail


def summary_rows(rows: list[CheckResult]) -> list[TargetRow]:
    """One :class:`TargetRow` per target in :data:`UNITS` whose library was run or skipped."""
    from distcheck.libs.targets import dist_version

    out = []
    for title, dist, contract, prefixes in UNITS:
        mine = [r for r in rows if r.check.startswith(prefixes)]
        skipped = [r for r in rows if r.check == f"libs.{_TARGET_OF[dist]}" and r.verdict in (SKIP, FAIL)]
        version = dist_version(dist) or "not installed"
        if skipped and not mine:
            out.append(TargetRow(title, dist, version, contract, "not installed" if skipped[0].verdict == SKIP
                                 else "FAIL: not installed", (), (skipped[0].detail,)))
            continue
        if not mine:
            continue
        conventions = sorted({c for r in mine if r.verdict == PASS for c in r.extra.get("conventions", [])})
        named = f"; convention: {' = '.join(conventions)}" if conventions else ""
        if any(r.verdict == FAIL for r in mine):
            verdict = "FAIL"
        elif any(r.verdict == FINDING for r in mine):
            verdict = "finding"
        elif all(r.verdict == SKIP for r in mine):
            verdict = "skip"  # nothing was certified: never "certified"
        else:
            verdict = "certified"
        passed = sum(r.verdict == PASS for r in mine)
        n_skipped = sum(r.verdict == SKIP for r in mine)
        apart = f", {n_skipped} skipped" if n_skipped else ""
        verdict += f" ({passed}/{len(mine) - n_skipped} checks pass{apart}{named})"
        notable = [r for r in mine if r.verdict in (FAIL, FINDING)]
        if verdict.startswith("skip"):
            verdict += ": " + "; ".join(dict.fromkeys(r.detail for r in mine))
        counter = tuple(f"{r.check.removeprefix('libs.')}: {_observed(r)}" for r in notable)
        evidence = tuple(dict.fromkeys(
            [str(r.extra["finding"]["reproduce"]) for r in notable if isinstance(r.extra.get("finding"), dict)]
            + [f"distcheck libs --target {_TARGET_OF[dist]}"]))
        out.append(TargetRow(title, dist, version, contract, verdict, counter, evidence))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(targets: list[TargetRow]) -> str:
    """The README table (GitHub Markdown), one row per target."""
    lines = ["| target | library | version | contract | verdict | smallest counterexample | evidence |",
             "|---|---|---|---|---|---|---|"]
    for t in targets:
        counter = "<br>".join(_cell(c) for c in t.counterexamples) or "none"
        evidence = "<br>".join(f"`{_cell(e)}`" for e in t.evidence)
        lines.append(f"| {t.target} | `{t.library}` | {t.version} | {t.contract} | {_cell(t.verdict)} | {counter} | "
                     f"{evidence} |")
    return "\n".join(lines) + "\n"
