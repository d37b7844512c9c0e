"""The real libraries under the certify contracts (marker ``libs``; skipped when the libs extra is not installed).

Each test pins the convention distcheck names for a target and the recorded findings it must
reproduce exactly; ``test_readme_table_is_reproduced`` runs every target, as ``distcheck libs
--format markdown`` does, and compares with the README's table; ``test_one_target_under_distcheck_certify``
certifies one adapter alone, as a user would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distcheck.libs import run_libs
from distcheck.parallel.layout import EP_PLACEMENT_MEGATRON, EP_PLACEMENT_TORCHTITAN
from distcheck.report import FAIL, FINDING, PASS, SKIP

pytestmark = pytest.mark.libs
ROOT = Path(__file__).resolve().parent.parent


def _verdicts(rows):
    return {r.check: r.verdict for r in rows}


def test_deepspeed_zero_estimators():
    pytest.importorskip("deepspeed")
    # the estimator rows (the adapter's Ulysses rows on gloo worlds are test_deepspeed_ulysses_...'s)
    rows = [r for r in run_libs(["deepspeed"], max_examples=30) if r.check.startswith("libs.deepspeed.zero")]
    got = {r.check: r for r in rows}
    assert got["libs.deepspeed.zero2.fit"].extra["conventions"] == ["K = 16", "fp32 gradients on top of 16-bit ones"]
    assert got["libs.deepspeed.zero3.fit"].extra["conventions"] == ["K = 14", "fp32 gradients instead of 16-bit ones"]
    assert _verdicts(rows) == {
        "libs.deepspeed.zero2.fit": PASS, "libs.deepspeed.zero2.truncation": PASS,
        "libs.deepspeed.zero2.monotone_n": PASS, "libs.deepspeed.zero2.printed_unit": FINDING,
        "libs.deepspeed.zero3.fit": PASS, "libs.deepspeed.zero3.truncation": PASS,
        "libs.deepspeed.zero3.monotone_n": PASS, "libs.deepspeed.zero3.printed_unit": FINDING,
        "libs.deepspeed.zero.baseline_n1": FINDING, "libs.deepspeed.zero.stage_order": FINDING}


def test_accelerate_training_estimate():
    pytest.importorskip("accelerate")
    from distcheck.libs import certified_rows
    from distcheck.libs.findings import label
    from distcheck.libs.targets import target

    mod = target("accelerate")  # the estimator rows (the gradient-accumulation loops run on gloo worlds below)
    rows = label([r for attr, contract in mod.CERTIFY
                  for r in certified_rows(f"{mod.__name__}:{attr}", contract, max_examples=30, seed=0)])
    got = {r.check: r for r in rows}
    assert got["libs.accelerate.float32.fit"].extra["conventions"] == ["fp32 weights with no separate master copy"]
    assert got["libs.accelerate.float16.fit"].verdict == FINDING
    assert got["libs.accelerate.float16.printed_unit"].verdict == FINDING
    assert got["libs.accelerate.float16.monotone_n"].verdict == SKIP  # no data parallelism: N is not an input
    # an unknown dtype string gives -1 for every part, no error; the positive control (float16) passed first
    refused = got["libs.accelerate.training_usage.refused"]
    assert refused.verdict == FINDING and refused.detail.endswith(
        "Observed: python accepts dtype 'fp16' (an alias it does not know) -> {'model': -1, 'optimizer': -1, "
        "'gradients': -1, 'step': -1}; dtype 'int8' -> {'model': -1, 'optimizer': -1, 'gradients': -1, 'step': -1}")
    assert FAIL not in _verdicts(rows).values()


def test_megatron_rank_generator_and_memory():
    pytest.importorskip("megatron.core")
    rows = run_libs(["megatron"], max_examples=30)
    assert _verdicts(rows) == {"libs.megatron.rank_generator.groups": PASS,
                               "libs.megatron.rank_generator.refused": FINDING,
                               "libs.megatron.rank_generator.ep_placement": PASS,
                               "libs.megatron.theoretical_memory.import": SKIP}
    got = {r.check: r for r in rows}
    assert got["libs.megatron.rank_generator.ep_placement"].extra["conventions"] == [EP_PLACEMENT_MEGATRON]
    # not part of the megatron-core wheel: a skip naming what to install, never a finding
    assert got["libs.megatron.theoretical_memory.import"].detail.startswith(
        "not loaded: cannot import megatron.training.theoretical_memory_usage (ModuleNotFoundError")


@pytest.mark.slow
@pytest.mark.multiprocess  # run_libs(["torchtitan"]) also certifies the checkpoint manager on 2 gloo ranks
def test_torchtitan_parallel_dims_on_the_fake_backend():
    pytest.importorskip("torchtitan")
    rows = run_libs(["torchtitan"], max_examples=20)
    got = {r.check: r for r in rows}
    assert got["libs.torchtitan.parallel_dims.groups"].verdict == PASS
    assert got["libs.torchtitan.parallel_dims.groups"].detail == (
        "the groups of batch, cp, dp, dp_replicate, dp_shard, efsdp, ep, loss, pp, tp equal distcheck's layout for "
        "the same order")
    assert got["libs.torchtitan.parallel_dims.refused"].verdict == FINDING
    # torchtitan's ep placement is its own convention, not Megatron-core's: the row names which
    placement = got["libs.torchtitan.parallel_dims.ep_placement"]
    assert placement.verdict == PASS and placement.extra["conventions"] == [EP_PLACEMENT_TORCHTITAN]
    assert placement.detail.endswith(f"not {EP_PLACEMENT_MEGATRON}, which gives [[0, 2], [1, 3]]")


@pytest.mark.slow
def test_torchtitan_moe_debug_model_does_not_train_on_cpu_and_computes_its_experts_in_bf16():
    # item 4 of the step's real targets: torchtitan's MoE debug model under its own parallelize is a skip on gloo,
    # each reason probed (torchtitan 0.3, torch 2.13 CPU)
    pytest.importorskip("torchtitan")
    from distcheck.libs.targets.torchtitan_moe import expert_precision, moe_step_row

    row = moe_step_row()
    assert row.verdict == SKIP, row.detail
    for refusal in ("flex: NotImplementedError: FlexAttention does not support backward on CPU",
                    "flex_flash: ValueError: Flash backend of FlexAttention is only supported on Hopper or Blackwell",
                    "varlen: NotImplementedError: Could not run 'aten::_flash_attention_forward' with arguments from "
                    "the 'CPU' backend",
                    "sdpa: ValueError: sdpa is no longer supported for language models"):
        assert refusal in row.detail, row.detail
    assert -9.0 < expert_precision() < -6.0  # bf16's roundoff, not float64's


@pytest.mark.slow
def test_readme_table_is_reproduced():
    for mod in ("deepspeed", "accelerate", "megatron.core", "torchtitan", "transformers"):
        pytest.importorskip(mod)
    from distcheck.libs.table import summary_rows, to_markdown

    table = to_markdown(summary_rows(run_libs()))
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"\| target \| library \|.*?\n(?=\n)", readme, re.S)
    assert found is not None, "README has no real-library table"
    assert found.group(0) == table


def test_one_target_under_distcheck_certify(tmp_path, capsys):
    pytest.importorskip("deepspeed")
    import json

    from distcheck.cli import main

    path = tmp_path / "zero3.json"
    code = main(["certify", "distcheck.libs.targets.deepspeed:ZERO3", "--contract", "memory-estimator",
                 "--examples", "30", "--seed", "0", "--profile", "dev", "--certificate", str(path)])
    assert code == 1  # the printed unit: certify knows no recorded findings
    cert = json.loads(path.read_text())["certifications"][0]
    assert (cert["distribution"], cert["contract"], cert["backend"]) == ("deepspeed", "memory-estimator", "local")
    by = {v["property"]: v for v in cert["verdicts"]}
    assert [by[p]["verdict"] for p in ("fit", "truncation", "monotone_n", "printed_unit")] == [PASS, PASS, PASS, FAIL]
    assert "convention: K = 14" in by["fit"]["note"]
    assert "GiB printed as GB" in by["printed_unit"]["failure"]
    assert "distcheck.libs.targets.deepspeed:ZERO3" in capsys.readouterr().out


@pytest.mark.multiprocess
@pytest.mark.slow
def test_torchtitan_clip_grad_norm_certified_without_and_with_a_pp_mesh():
    # torchtitan's clip_grad_norm_ as its trainer calls it (pp_mesh under pp only), in torch's composition: every
    # property of the training-step contract passes on FSDP2 shards, tp shards and two pipeline stages
    pytest.importorskip("torchtitan")
    from distcheck.libs import world_rows
    from distcheck.libs.targets import target

    mod = target("torchtitan")
    clip = [run for run in mod.WORLD_CERTIFY if run.name.startswith("torchtitan.clip_grad_norm_")]
    rows = world_rows(mod, clip, max_examples=2, seed=0)
    props = ("params", "loss", "grad_norm", "clipping", "tokens")
    assert [(r.check, r.verdict, r.world_size, r.examples) for r in rows] == [
        (f"libs.torchtitan.clip_grad_norm_{name}.{p}", PASS, 2, 2) for name in ("fsdp", "tp", "pp") for p in props]
    assert rows[0].extra["reproduce"].startswith(
        "distcheck certify distcheck.libs.targets.torchtitan:CLIP_GRAD_NORM --contract training-step --world-sizes 2")


def test_torchtitan_clip_hook_passes_the_pp_mesh_only_under_pp(monkeypatch):
    # the hook calls torchtitan's function as its trainer does: foreach=True, pp_mesh=None without pp
    pytest.importorskip("torchtitan")
    import torchtitan.distributed.utils as tu

    from distcheck.libs.targets.torchtitan_llama import titan_clip_grad_norm
    from distcheck.parallel.step.hooks import StepInfo
    from distcheck.parallel.step.reference import StepLayout

    seen = []
    monkeypatch.setattr(tu, "clip_grad_norm_", lambda params, max_norm, **kw: seen.append((params, max_norm, kw)))
    titan_clip_grad_norm(iter(["p"]), 1.5, StepInfo(StepLayout(dp_shard=2), {"pp": "PP"}, 1, 1, 1, 1.5))
    titan_clip_grad_norm(iter(["p"]), 1.5, StepInfo(StepLayout(pp=2), {"pp": "PP"}, 1, 1, 1, 1.5))
    assert seen == [(["p"], 1.5, {"foreach": True, "pp_mesh": None}), (["p"], 1.5, {"foreach": True, "pp_mesh": "PP"})]


@pytest.mark.multiprocess
def test_deepspeed_ulysses_distributed_attention_certified():
    # DeepSpeed-Ulysses' DistributedAttention on head-tail shards: output and gradients within the bound at 2 and 4
    pytest.importorskip("deepspeed")
    from distcheck.libs import world_rows
    from distcheck.libs.targets import target

    mod = target("deepspeed")
    rows = world_rows(mod, [run for run in mod.WORLD_CERTIFY if run.name == "deepspeed.ulysses"], max_examples=3,
                      seed=0)
    # balance is a skip: DistributedAttention takes no causal_mask keyword, so no score block can be counted
    assert [(r.check, r.verdict, r.world_size, r.examples) for r in rows] == [
        (f"libs.deepspeed.ulysses.{p}", PASS if p != "balance" else SKIP, ws, 3 if p != "balance" else 0)
        for ws in (2, 4) for p in ("forward", "grads", "balance")]
    assert all("causal_mask" in r.detail for r in rows if r.verdict == SKIP), [r.detail for r in rows]


class _OptimizerNotLoaded:
    """torchtitan's manager told not to restore the optimizer (``checkpoint.exclude_from_loading =
    ["optimizer"]``): the negative control of the checkpoint row (built lazily: torchtitan may be absent)."""

    @staticmethod
    def _target():
        from distcheck.libs.targets.torchtitan import TorchtitanCheckpointManager

        return type("OptimizerNotLoaded", (TorchtitanCheckpointManager,), {"exclude_from_loading": ("optimizer",)})

    @classmethod
    def save(cls, state, path):
        cls._target().save(state, path)

    @classmethod
    def load(cls, state, path):
        cls._target().load(state, path)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchtitan_checkpoint_manager_on_gloo():
    """CheckpointManager saves at 2 gloo ranks under one layout and loads under another: certified; the same
    manager with the optimizer excluded from loading fails round_trip and next_step (the row can fail)."""
    pytest.importorskip("torchtitan")
    from distcheck.certify import certify

    def verdicts(ref):
        cert = certify(ref, "checkpoint", dtypes=["float32"], examples=4, seed=0)
        return {v.property: v for v in cert.verdicts}

    good = verdicts("distcheck.libs.targets.torchtitan:CHECKPOINT_MANAGER")
    assert {p: v.verdict for p, v in good.items()} == {"round_trip": PASS, "next_step": PASS, "bytes": PASS}
    bad = verdicts("tests.test_libs_targets:_OptimizerNotLoaded")
    assert bad["round_trip"].verdict == FAIL and "exp_avg" in bad["round_trip"].failure
    assert bad["next_step"].verdict == FAIL


MOE_PROPERTIES = ("forward", "grads", "tokens", "aux_loss", "all_to_all.forward", "all_to_all.backward")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_deepspeed_moe_layer_on_gloo():
    """DeepSpeed's MoE (k=2) on 2 gloo ranks: the libs row certified with one or two experts per rank; the same
    layer checked under GShard's all-choices aux counts fails aux_loss (the row can fail); with two experts per
    rank the router gradient's unchosen experts carry rounding-size values (DeepSpeed differentiates through the
    softmax over all experts), within the bound under renormalise, and the sampled second expert (DeepSpeed's
    default) fails forward; in float64 forward, grads and aux_loss fail by float32 roundings (the gate computes in
    float32)."""
    pytest.importorskip("deepspeed")
    import warnings

    from distcheck.certify.engine import certify
    from distcheck.libs import world_rows
    from distcheck.libs.targets import target
    from distcheck.libs.targets.deepspeed_moe import DEEPSPEED_OPTIONS
    from distcheck.runners import RankPool

    mod = target("deepspeed")
    rows = world_rows(mod, [run for run in mod.WORLD_CERTIFY if run.name == "deepspeed.moe"], max_examples=5, seed=0)
    assert [(r.check, r.verdict, r.world_size) for r in rows] == [
        (f"libs.deepspeed.moe.{p}", PASS, 2) for p in MOE_PROPERTIES]
    ref = "distcheck.libs.targets.deepspeed_moe:"
    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=120,
                                             preload=("deepspeed.moe.layer",)) as pool:
        warnings.simplefilter("ignore")

        def verdicts(attr, dtype="float32", **options):
            cert = certify(ref + attr, "moe-layer", pool=pool, seed=0, examples=5, dtypes=(dtype,),
                           options={**DEEPSPEED_OPTIONS, **options})
            return {v.property: v for v in cert.verdicts}

        counts = verdicts("MOE", local_experts=1, aux_counts="all_choices")
        f64 = verdicts("MOE", "float64", local_experts=1)  # the gate rounds in float32 whatever the dtype
        two = verdicts("MOE", local_experts=2)
        sampled = verdicts("MOE_SAMPLED", local_experts=2)
    assert {p: v.verdict for p, v in counts.items()} == {**dict.fromkeys(MOE_PROPERTIES, PASS), "aux_loss": FAIL}
    # two experts per rank: the router gradient at experts no token chose is rounded from terms that cancel (the
    # softmax over all experts, then the division by the kept sum), within the bound under renormalise
    assert {p: v.verdict for p, v in two.items()} == dict.fromkeys(MOE_PROPERTIES, PASS)
    assert sampled["forward"].verdict == FAIL and "output: " in sampled["forward"].failure
    assert {p: v.verdict for p, v in f64.items()} == {**dict.fromkeys(MOE_PROPERTIES, PASS), "forward": FAIL,
                                                      "grads": FAIL, "aux_loss": FAIL}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchtitan_dropless_moe_on_gloo():
    """torchtitan's router and AllToAllTokenDispatcher (counts exchanged, then all_to_all_single of the actual split
    sizes) with the contract's experts: the libs rows certified at 2 and 4 ranks under dropless=true and
    renormalise=true; under the default renormalise=false forward fails and names renormalise=true; in float64
    grads fails by the float32 scaling of the combine."""
    pytest.importorskip("torchtitan")
    import warnings

    from distcheck.certify.engine import certify
    from distcheck.libs import world_rows
    from distcheck.libs.targets import target
    from distcheck.runners import RankPool

    mod = target("torchtitan")
    rows = world_rows(mod, [run for run in mod.WORLD_CERTIFY if run.name == "torchtitan.moe"], max_examples=5, seed=0)
    assert [(r.check, r.verdict, r.world_size) for r in rows] == [
        (f"libs.torchtitan.moe.{p}", PASS, w) for w in (2, 4) for p in MOE_PROPERTIES]
    ref = "distcheck.libs.targets.torchtitan_moe:MOE"
    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=120) as pool:
        warnings.simplefilter("ignore")
        default = certify(ref, "moe-layer", pool=pool, seed=0, examples=5, dtypes=("float32",),
                          options={"dropless": True})
        f64 = certify(ref, "moe-layer", pool=pool, seed=0, examples=5, dtypes=("float64",),
                      options={"dropless": True, "renormalise": True})
    failed = {v.property: v for v in default.verdicts if v.verdict == FAIL}
    assert set(failed) == {"forward", "grads"}
    assert failed["forward"].failure.endswith("certify with --option renormalise=true")
    assert {v.property for v in f64.verdicts if v.verdict == FAIL} == {"grads"}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_gradient_accumulation_under_ddp():
    # accelerate's own loop (prepare, accumulate, backward, clip_grad_norm_, reduce) on two gloo ranks: the guide's
    # token-weighted loss is certified; the basic loop's mean loss per micro-batch is the recorded finding on every
    # property it moves (the tokens still add up)
    pytest.importorskip("accelerate")
    from distcheck.libs import world_rows
    from distcheck.libs.findings import label
    from distcheck.libs.targets import target

    mod = target("accelerate")
    rows = label(world_rows(mod, mod.WORLD_CERTIFY, max_examples=4, seed=0))
    props = ("params", "loss", "grad_norm", "clipping", "tokens")
    assert [(r.check, r.verdict, r.world_size) for r in rows] == [
        *((f"libs.accelerate.ga_token_sum.{p}", PASS, 2) for p in props),
        *((f"libs.accelerate.ga_mean_loss.{p}", PASS if p == "tokens" else FINDING, 2) for p in props)]
    found = next(r for r in rows if r.check == "libs.accelerate.ga_mean_loss.loss")
    assert "StepCase(dp_replicate=2, dp_shard=1, tp=1, pp=1, m=1," in found.detail, found.detail
    assert found.extra["finding"]["reproduce"].startswith(
        "distcheck certify distcheck.libs.targets.accelerate:GA_MEAN_LOSS --contract training-step --world-sizes 2")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accelerate_mean_loss_fails_with_equal_rank_counts_and_unequal_micro_batches(gloo2):
    # the accumulation bug alone: both ranks hold 3 tokens per step (so DDP's mean over ranks is right), but their
    # two micro-batches hold 1 and 2: the mean of the micro-batch means weighs tokens unequally. The guide's loop
    # holds on the same case
    pytest.importorskip("accelerate")
    from distcheck.certify import get_contract
    from distcheck.libs.targets.accelerate import GA_MEAN_LOSS, GA_TOKEN_SUM
    from distcheck.parallel.step.case import BINDING_MAX_NORM, StepCase
    from distcheck.parallel.step.harness import run_step
    from distcheck.parallel.step.model import TinyConfig
    from distcheck.parallel.step.reference import StepLayout

    cfg = TinyConfig(dim=8, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=False)
    lengths = ((((1,), (2,)), ((2,), (1,))),) * 2  # [step][dp rank][micro-batch][sequence]
    case = StepCase(StepLayout(dp_replicate=2), cfg, 2, 1, 2, lengths, BINDING_MAX_NORM, 2.0**-7, 0)
    contract = get_contract("training-step")
    outcomes = {}
    for name, t in (("mean", GA_MEAN_LOSS), ("token_sum", GA_TOKEN_SUM)):
        outcomes[name] = contract.check(case, gloo2.run(run_step, t, case, timeout_s=300), 2, "float64", {})
    assert {p: o.ok for p, o in outcomes["token_sum"].items()} == dict.fromkeys(
        ("params", "loss", "grad_norm", "clipping", "tokens"), True)
    mean = outcomes["mean"]
    assert {p: o.ok for p, o in mean.items()} == {"params": False, "loss": True, "grad_norm": False,
                                                  "clipping": False, "tokens": True}
    # the first step's gradient is already wrong; its reported loss (the mean of the ranks' token means) is right,
    # as the ranks' counts are equal, and stays right: each step of the reference starts from the state the ranks
    # reached, so the wrong update shows in the gradients, not again in the next step's loss
    assert mean["params"].message.startswith("step 1 "), mean["params"].message
    assert mean["grad_norm"].message.startswith("step 1 "), mean["grad_norm"].message
