"""The expert and context axes of the ``training-step`` contract: ep borrowed from the data-parallel ranks in
torchtitan's and Megatron's placements, cp with head-tail chunks, the tiny Llama's MoE layers and RoPE, torch's
composition with them (examples/my_step.py, distcheck.parallel.step.plans) and the mutants of
examples/step_mutants.py that get them wrong."""

from __future__ import annotations

import re

import numpy as np
import pytest

from distcheck.core.errors import ConfigError
from distcheck.parallel.step.reference import StepLayout


def _groups(shape, dim):
    """The rank groups of mesh dim ``dim`` of a row-major mesh of ``shape`` (sorted lists)."""
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    rows = np.moveaxis(grid, dim, -1).reshape(-1, shape[dim])
    return sorted(sorted(int(r) for r in row) for row in rows)


def test_vocabulary_names_the_expert_placements():
    from distcheck.core.vocab import ExpertPlacement, names

    assert names(ExpertPlacement) == ("torchtitan", "megatron")


def test_layout_rules_for_cp_and_ep():
    from distcheck.parallel.step.contracts import parse_layout

    lay = StepLayout(dp_shard=2, cp=2, ep=4, ep_placement="torchtitan")
    assert (lay.world_size, lay.dp, lay.dp_cp, lay.expert_dp) == (4, 2, 4, 1)
    assert lay.shape == (1, 1, 2, 2, 1) and lay.expert_shape == (1, 1, 1, 4, 1)
    assert str(lay) == "dp_replicate=1, dp_shard=2, tp=1, pp=1, cp=2, ep=4 (torchtitan)"
    assert str(StepLayout(dp_shard=2)) == "dp_replicate=1, dp_shard=2, tp=1, pp=1"  # cp and ep shown above 1 only
    with pytest.raises(ConfigError, match="ep_placement"):
        StepLayout(dp_shard=2, ep=2)  # no placement
    with pytest.raises(ConfigError, match="ep_placement"):
        StepLayout(dp_shard=2, ep=2, ep_placement="deepspeed")
    with pytest.raises(ConfigError, match="must be empty when ep = 1"):
        StepLayout(dp_shard=2, ep_placement="megatron")
    # torchtitan borrows ep from dp_shard x cp (a multiple of cp); Megatron from every data-parallel rank
    with pytest.raises(ConfigError, match="dp_shard x cp"):
        StepLayout(dp_replicate=2, ep=2, ep_placement="torchtitan")
    with pytest.raises(ConfigError, match="multiple of cp"):
        StepLayout(dp_shard=2, cp=4, ep=2, ep_placement="torchtitan")
    assert StepLayout(dp_replicate=2, ep=2, ep_placement="megatron").expert_shape == (1, 1, 1, 2, 1)
    with pytest.raises(ConfigError, match="must divide dp\\*cp"):
        StepLayout(dp_shard=2, ep=4, ep_placement="megatron")
    assert parse_layout("dp_shard=2,ep=2") == StepLayout(dp_shard=2, ep=2, ep_placement="torchtitan")
    assert parse_layout("cp=2,ep=2,ep_placement=megatron") == StepLayout(cp=2, ep=2, ep_placement="megatron")
    with pytest.raises(ConfigError, match="without ep > 1"):
        parse_layout("dp_shard=2,ep_placement=megatron")
    with pytest.raises(ConfigError, match="option layout"):
        parse_layout("dp_replicate=2,ep=2")  # torchtitan's (the default) cannot borrow across replicas
    with pytest.raises(ConfigError, match="ep_placement must be one of"):
        parse_layout("dp_shard=2,ep=2,ep_placement=titan")


@pytest.mark.parametrize("world_size", [4, 8])
def test_expert_groups_are_the_named_placements(world_size):
    # the experts' mesh of every ep layout gives the ep groups distcheck.parallel.layout derives from each library's
    # documented layout: torchtitan's ParallelDims (ep blocks of the tp, cp, dp_shard ranks) and Megatron-core's
    # RankGenerator (ep blocks of the dp x cp ranks, order tp-cp-ep-dp-pp)
    from distcheck.parallel.layout import megatron_layout, torchtitan_layout
    from distcheck.parallel.step.contracts import layouts

    seen = set()
    for lay in layouts(world_size):
        if lay.ep == 1:
            continue
        mine = _groups(lay.expert_shape, 3)
        if lay.ep_placement == "torchtitan":
            want = torchtitan_layout(dp_replicate=lay.dp_replicate, dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep,
                                     world_size=world_size).groups("ep")
        else:
            want = megatron_layout(cp=lay.cp, dp=lay.dp, ep=lay.ep, world_size=world_size).groups("ep", expert=True)
        assert mine == sorted(sorted(g) for g in want), lay
        # the experts' data-parallel ranks: every rank holding the same experts
        held = {}
        for r in range(world_size):
            held.setdefault(lay.ep_index(r), []).append(r)
        assert sorted(held.values()) == sorted(
            sorted(g) for g in _groups((lay.expert_shape[1] * lay.expert_shape[2], lay.ep), 0)), lay
        seen.add(lay.ep_placement)
    assert seen == {"torchtitan", "megatron"}


def test_cp_and_ep_are_drawn_at_four_ranks():
    from hypothesis import find

    from distcheck.certify import get_contract
    from distcheck.parallel.step.contracts import layouts

    four = layouts(4)
    assert {lay.cp for lay in four} == {1, 2, 4} and {lay.ep for lay in four} == {1, 2, 4}
    assert {lay.ep_placement for lay in four if lay.ep > 1} == {"torchtitan", "megatron"}
    assert StepLayout(dp_shard=1, tp=2, cp=2) in four and not any(lay.ep > 1 and lay.tp > 1 for lay in four)
    c = get_contract("training-step")
    # the dense step's axes unless cp and ep are named (a parallelize function that predates them is not held to them)
    assert {case.layout.cp * case.layout.ep for case in _some(c.cases(4, "float64", c.parse_options({})))} == {1}
    cases = c.cases(4, "float64", c.parse_options({"axes": "all"}))
    for want in (StepLayout(dp_replicate=2, dp_shard=2, ep=4, ep_placement="megatron"),
                 StepLayout(dp_shard=2, cp=2, ep=4, ep_placement="torchtitan"), StepLayout(cp=4),
                 StepLayout(tp=2, cp=2)):
        case = find(cases, lambda case, want=want: case.layout == want)
        assert case.seq_len % (2 * want.cp * want.tp) == 0
        assert case.config.rope == (want.cp > 1)  # positions matter under cp (the dense draw is unchanged)
        assert case.config.n_experts % want.ep == 0 and (want.ep == 1 or case.config.n_experts > 0)
        columns = c.composition(case)
        assert columns["layout"] == ", ".join(
            [f"{a}={getattr(want, a)}" for a in ("dp_replicate", "dp_shard", "tp", "pp", "cp") if getattr(want, a) > 1]
            + ([f"ep={want.ep} ({want.ep_placement})"] if want.ep > 1 else []))
        assert columns["model"].startswith("MoE" if want.ep > 1 else ("dense", "MoE"))
    # the MoE decoder is drawn on a dense layout too when ep is among the axes, never when it is not
    assert find(cases, lambda case: case.layout.ep == 1 and case.config.n_experts > 0).layout.tp == 1
    no_ep = c.cases(4, "float64", c.parse_options({"axes": "dp_shard,tp,cp"}))
    from hypothesis.errors import NoSuchExample

    with pytest.raises(NoSuchExample):
        find(no_ep, lambda case: case.config.n_experts > 0)


def _some(strategy, n=30):
    """``n`` examples of ``strategy`` (Hypothesis' own draw, derandomized)."""
    from hypothesis import HealthCheck, given, settings

    out = []

    @settings(max_examples=n, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case):
        out.append(case)

    collect()
    return out


def test_own_model_axes_leave_cp_and_ep_out():
    from distcheck.certify import get_contract
    from distcheck.parallel.step.hooks import StepTarget
    from distcheck.parallel.step.model import build_model
    from distcheck.parallel.step.plans import ddp

    c = get_contract("training-step")
    _, opts = c.resolve(StepTarget(ddp, model=build_model), None, c.parse_options({}))
    assert opts["axes"] == "dp_replicate,dp_shard,tp"
    _, named = c.resolve(StepTarget(ddp, model=build_model, axes=("dp_shard", "cp")), None, c.parse_options({}))
    assert named["axes"] == "dp_shard,cp"


def test_cp_positions_are_the_head_tail_chunks():
    from distcheck.parallel.cp.reference import load_balanced_positions
    from distcheck.parallel.step.harness import cp_positions

    assert cp_positions(8, 1, 0) is None
    got = [cp_positions(8, 2, c).tolist() for c in range(2)]
    assert got == [[0, 1, 6, 7], [2, 3, 4, 5]] == [p.tolist() for p in load_balanced_positions(8, 2)]


def _moe_model(**kw):
    import torch

    from distcheck.parallel.step.model import TinyConfig, build_model

    torch.manual_seed(0)
    cfg = TinyConfig(dim=4, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, ffn_dim=3, vocab_size=8, tied=False,
                     **kw)
    return build_model(cfg)


def test_moe_layer_is_dropless_top_k_with_a_shared_expert():
    # each token's output is the shared expert's plus its k chosen experts' (the softmax's k largest), each times its
    # probability, every token kept; the load-balancing loss is the ep package's reference (Switch Transformers)
    import torch
    import torch.nn.functional as F

    from distcheck.parallel.ep.reference import aux_loss

    model = _moe_model(n_experts=4, top_k=2)
    moe = model.layers["0"].moe
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    out = moe(x).reshape(-1, 4)
    flat = x.reshape(-1, 4)
    probs = F.softmax(flat @ moe.router.gate.weight.T, dim=-1)
    w1, w2, w3 = moe.experts.w1, moe.experts.w2, moe.experts.w3
    for t in range(flat.shape[0]):
        want = moe.shared_expert(flat[t])
        for e in torch.topk(probs[t], 2).indices.tolist():
            want = want + probs[t, e] * ((F.silu(flat[t] @ w1[e].T) * (flat[t] @ w3[e].T)) @ w2[e].T)
        assert torch.allclose(out[t], want, rtol=1e-13, atol=1e-14), t
    p, chosen = moe.routing
    assert float(moe.aux.detach()) == pytest.approx(aux_loss(p.detach().numpy(), chosen.numpy(), 4), rel=1e-14)
    # the gradient reaches every expert weight, the router and the shared expert
    from distcheck.parallel.step.model import load_balance_loss

    (out.sum() + load_balance_loss(model)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in moe.named_parameters()), [
        n for n, p in moe.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]


def test_rope_sees_relative_positions_only():
    # RoPE rotates queries and keys by their positions: shifting every position leaves the logits alone, and
    # positions 0 .. 2 in place of a head-tail rank's global ones (0, 1, 8) do not
    import torch

    model = _moe_model(rope=True)
    tokens = torch.randint(0, 8, (2, 6))
    base = model(tokens)
    assert torch.allclose(model(tokens, positions=torch.arange(6) + 5), base, rtol=1e-12, atol=1e-12)
    spread = torch.tensor([0, 1, 8])  # a head chunk and a tail chunk at their global positions
    assert not torch.allclose(model(tokens[:, :3], positions=spread), model(tokens[:, :3]), atol=1e-6)
    plain = _moe_model()
    assert torch.equal(plain(tokens, positions=torch.arange(6) + 3), plain(tokens))  # no RoPE: positions unused


def test_torch_context_parallel_is_a_skip_without_a_gpu():
    import torch

    from distcheck.certify import get_contract
    from distcheck.engine.contracts.targets import import_target
    from distcheck.parallel.cp.plans import CPU_REFUSAL

    c = get_contract("training-step")
    for name, skipped in (("TORCH_CONTEXT_PARALLEL", not torch.cuda.is_available()), ("fsdp2_tp", False)):
        obj, ref = import_target(f"distcheck.parallel.step.plans:{name}")
        target, opts = c.resolve(obj, ref, c.parse_options({}))
        assert c.skipped(target, opts) == ({p: CPU_REFUSAL for p in c.property_names()} if skipped else {})


def test_first_divergence_replay_declines_cp_and_moe():
    from distcheck.parallel.step.case import BINDING_MAX_NORM, StepCase
    from distcheck.parallel.step.contracts import _unrecorded
    from distcheck.parallel.step.model import TinyConfig

    dense = TinyConfig(dim=8, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=False)
    moe = TinyConfig(**{**dense.__dict__, "n_experts": 2})

    def case(layout, cfg):
        return StepCase(layout, cfg, 1, 1, 4, ((((1,),),) * layout.dp,) * 2, BINDING_MAX_NORM, 0.01, 0)

    assert _unrecorded(case(StepLayout(dp_shard=2), dense)) == ""
    assert "head-tail chunks" in _unrecorded(case(StepLayout(cp=2), dense))
    assert "load-balancing" in _unrecorded(case(StepLayout(dp_shard=2, ep=2, ep_placement="megatron"), moe))


# ------------------------------------------------------------------------------------------------- real worlds


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_composition_certified_with_ep_and_cp(world_size):
    # torch's composition (FSDP2, distcheck's ring over cp, torchtitan's ExpertParallel over the experts' mesh) on
    # the layouts that draw cp and ep (dp kept among the axes: ep is borrowed from dp x cp)
    from distcheck.certify import certify

    cert = certify("examples.my_step:parallelize", "training-step", world_sizes=[world_size], examples=8,
                   options={"axes": "dp_replicate,dp_shard,cp,ep"}, timeout_s=600)
    cert.assert_certified()
    drawn = {r.columns["layout"] for r in cert.compositions}
    assert any("cp=" in lay for lay in drawn) and any("ep=" in lay for lay in drawn), drawn
    assert any(r.columns["model"].startswith("MoE") for r in cert.compositions)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_own_ring_attention_certified_in_the_step():
    # the user's own ring (examples/my_ring_attention.py, its hand-written backward) as the attention core over cp
    from distcheck.certify import certify

    cert = certify("examples.my_step:parallelize_own_ring", "training-step", world_sizes=[4], examples=3,
                   options={"layout": "dp_shard=2,cp=2"}, timeout_s=600)
    cert.assert_certified()
    assert {r.columns["layout"] for r in cert.compositions} == {"dp_shard=2, cp=2"}


@pytest.mark.multiprocess
@pytest.mark.slow
def test_distcheck_ring_attention_certified_as_a_layer():
    from distcheck.certify import certify

    certify("distcheck.parallel.cp.plans:RING_ATTENTION", "context-parallel-attention", world_sizes=[2],
            examples=6, timeout_s=300).assert_certified()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_torch_context_parallel_target_skips_with_torch_reason():
    import torch

    from distcheck.certify import certify
    from distcheck.parallel.cp.plans import CPU_REFUSAL

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: torch's context_parallel runs there")
    cert = certify("distcheck.parallel.step.plans:TORCH_CONTEXT_PARALLEL", "training-step", world_sizes=[2],
                   examples=2, options={"layout": "cp=2"}, timeout_s=300)
    assert {v.verdict for v in cert.verdicts} == {"skip"} and {v.failure for v in cert.verdicts} == {CPU_REFUSAL}


#: each mutant of the expert and context axes, the property it must fail, the layout pinned and as shown
AXES_MUTANTS = [
    ("AUX_LOSS_PER_RANK", "grad_norm", "dp_shard=2,ep=2", "dp_shard=2, ep=2 (torchtitan)"),
    ("ROUTER_NOT_REDUCED_OVER_EP", "grad_norm", "dp_shard=2,ep=2", "dp_shard=2, ep=2 (torchtitan)"),
    ("EXPERT_GRADS_OVER_EXPERT_DP", "grad_norm", "dp_shard=2,ep=2,ep_placement=megatron",
     "dp_shard=2, ep=2 (megatron)"),
    ("CP_LOSS_MEAN_OF_CHUNKS", "grad_norm", "cp=2", "cp=2"),
    ("LOCAL_POSITIONS", "loss", "cp=2", "cp=2"),
]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("target", "prop", "layout", "shown"), AXES_MUTANTS)
def test_axes_mutant_fails_naming_the_composition(target, prop, layout, shown):
    from distcheck.certify import certify

    cert = certify(f"examples.step_mutants:{target}", "training-step", world_sizes=[2], examples=10,
                   options={"layout": layout}, timeout_s=300, profile="ci")
    verdict = next(v for v in cert.verdicts if v.property == prop)
    assert verdict.verdict == "FAIL", verdict
    assert verdict.counterexample.startswith("StepCase(dp_replicate="), verdict
    assert shown.split(", ")[-1] in verdict.counterexample, verdict.counterexample
    assert {r.columns["layout"] for r in cert.compositions} == {shown}
    assert any(r.verdicts[prop] == "FAIL" for r in cert.compositions), cert.compositions
    # the first-divergence replay does not map cp chunks or the global load-balancing loss: it says so, never a line
    # that could name a right tensor
    assert "no first divergence recorded: the recorder maps tensors over dp and tp only" in verdict.failure
    failure = verdict.failure.split("; no first divergence recorded")[0]
    for error, bound in re.findall(r"error ([0-9.e+-]+) > bound ([0-9.e+-]+)", failure):
        assert float(bound) > 0 and float(error) > 2**10 * float(bound), verdict.failure
