"""The first divergence of a failing training step (distcheck/parallel/step/trace.py, mapping.py, divergence.py):
the mapping of recorded pieces back to full tensors, the bound, the order of the report, the recorder on the tiny
decoder (one process, no world), the engine's replay of a failure (run only when a case fails), and on real worlds
the bugs placed inside a model named by their first divergence."""

from __future__ import annotations

import numpy as np
import pytest

from distcheck.engine.contracts.errors import ProtocolError
from distcheck.parallel.step import divergence, mapping, trace
from distcheck.parallel.step.reference import StepLayout
from tests.addition_contract import AdditionContract, add_without_carry, good_add

TP2 = StepLayout(tp=2)


def _dt(local, shape, placements, mesh, coord, mesh_shape=None):
    """A DTensor's piece as a rank records it."""
    return {"local": np.asarray(local, dtype=np.float64), "shape": tuple(shape), "placements": tuple(placements),
            "mesh": tuple(mesh), "mesh_shape": tuple(mesh_shape or (len(mesh),)), "coord": tuple(coord)}


# ---------------------------------------------------------------------------------------------- the mapping


def test_shard_pieces_are_concatenated_in_mesh_order_and_a_bad_entry_names_its_rank():
    full = np.arange(12.0).reshape(2, 6)
    # mesh ranks (3, 1): rank 3 is coordinate 0 and holds the first half of dim 1
    pieces = {3: _dt(full[:, :3], full.shape, [("shard", 1)], (3, 1), (0,)),
              1: _dt(full[:, 3:], full.shape, [("shard", 1)], (3, 1), (1,))}
    (c,) = mapping.assemble(pieces, full.shape, StepLayout(tp=4))
    assert np.array_equal(c.array, full) and c.ranks == [1, 3]
    pieces[1]["local"] = pieces[1]["local"] + np.array([[0, 0, 0], [0, 1, 0]])
    (c,) = mapping.assemble(pieces, full.shape, StepLayout(tp=4))
    fit = divergence.within(full, c.array, np.zeros(full.shape))
    assert not fit.ok and fit.index == (1, 4) and fit.expected == 10 and fit.got == 11
    assert set(c.owner[fit.bad].tolist()) == {1}


def test_two_mesh_dims_sharding_one_dim_are_undone_innermost_first():
    # DTensor's (Shard(0), Shard(0)) on a 2 x 2 mesh: coordinate (i, j) holds chunk(chunk(x, 2)[i], 2)[j]
    full = np.arange(8.0)
    mesh = (0, 1, 2, 3)
    pieces = {}
    for i in range(2):
        for j in range(2):
            pieces[2 * i + j] = _dt(np.array_split(np.array_split(full, 2)[i], 2)[j], (8,), [("shard", 0)] * 2,
                                    mesh, (i, j), (2, 2))
    (c,) = mapping.assemble(pieces, (8,), StepLayout(dp_shard=2, tp=2))
    assert np.array_equal(c.array, full)


def test_partial_pieces_are_summed_and_replicas_compared_one_by_one():
    a, b = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    summed = mapping.assemble({0: _dt(a, (2,), [("partial", "sum")], (0, 1), (0,)),
                             1: _dt(b, (2,), [("partial", "sum")], (0, 1), (1,))}, (2,), TP2)
    assert len(summed) == 1 and np.array_equal(summed[0].array, a + b) and (summed[0].owner == -1).all()
    avg = mapping.assemble({0: _dt(a, (2,), [("partial", "avg")], (0, 1), (0,)),
                          1: _dt(b, (2,), [("partial", "avg")], (0, 1), (1,))}, (2,), TP2)
    assert np.array_equal(avg[0].array, (a + b) / 2)
    replicas = mapping.assemble({0: _dt(a, (2,), [("replicate",)], (0, 1), (0,)),
                               1: _dt(b, (2,), [("replicate",)], (0, 1), (1,))}, (2,), TP2)
    assert sorted((c.ranks, c.array.tolist()) for c in replicas) == [([0], a.tolist()), ([1], b.tolist())]


def test_strided_shards_and_incomplete_meshes_are_not_mapped_with_the_reason():
    strided = {r: _dt(np.zeros(2), (4,), [("strided", 0, 2), ("shard", 0)], (0, 1, 2, 3), (r // 2, r % 2), (2, 2))
               for r in range(4)}
    with pytest.raises(mapping.Unmapped, match="_StridedShard"):
        mapping.assemble(strided, (4,), StepLayout(dp_shard=2, tp=2))
    with pytest.raises(mapping.Unmapped, match=r"only \[0\] recorded it"):
        mapping.assemble({0: _dt(np.zeros(2), (4,), [("shard", 0)], (0, 1), (0,))}, (4,), TP2)


def test_plain_tensors_are_mapped_over_each_tp_group_from_their_shapes():
    full = np.arange(24.0).reshape(2, 3, 4)
    lay = StepLayout(dp_replicate=2, tp=2)  # ranks 0, 1: replica 0's tp group; 2, 3: replica 1's
    seq = {r: {"local": full[:, :2] if r % 2 == 0 else full[:, 2:]} for r in range(4)}  # uneven sequence shards
    cands = mapping.assemble(seq, full.shape, lay)
    assert sorted(c.ranks for c in cands) == [[0, 1], [2, 3]] and all(np.array_equal(c.array, full) for c in cands)
    same = mapping.assemble({0: {"local": full}, 1: {"local": full}}, full.shape, TP2)
    assert [c.ranks for c in same] == [[0], [1]]
    with pytest.raises(mapping.Unmapped, match="split along one dim"):
        mapping.assemble({0: {"local": full[:, :2, :2]}, 1: {"local": full[:, 1:, 2:]}}, full.shape, TP2)


def test_declared_layouts_override_the_shapes():
    full = np.arange(8.0).reshape(2, 4)
    halves = {0: {"local": full[:, :2]}, 1: {"local": full[:, 2:]}}
    (c,) = mapping.assemble(halves, full.shape, TP2, 1)
    assert np.array_equal(c.array, full)
    with pytest.raises(mapping.Unmapped, match="split on dim 0"):
        mapping.assemble(halves, full.shape, TP2, 0)
    parts = {0: {"local": full - 1}, 1: {"local": np.ones_like(full)}}
    (c,) = mapping.assemble(parts, full.shape, TP2, "sum")
    assert np.array_equal(c.array, full)
    # a replicated gradient of one micro-batch may also be a partial sum over tp (a sequence-parallel norm's)
    own = mapping.assemble(parts, full.shape, TP2, alternative_sum=True)
    assert all(np.array_equal(c.alternative.array, full) for c in own)


def test_shard_dims_are_checked_and_evaluated():
    mapping.check_shard_dims({"layers.0.attention.wq.weight": 0, "layers.0.attention.wo": "sum"}, "t")
    mapping.check_shard_dims(lambda name: None, "t")
    with pytest.raises(ProtocolError, match=r"shard_dims\['w'\] = 'rows'"):
        mapping.check_shard_dims({"w": "rows"}, "t")
    with pytest.raises(ProtocolError, match="must be a dim"):
        mapping.check_shard_dims({"w": True}, "t")
    with pytest.raises(ProtocolError, match="1 positional argument"):
        mapping.check_shard_dims(lambda a, b: 0, "t")
    answer = mapping.declared(lambda n: 1 if n.endswith("wo.weight") else None, ["a.wo.weight", "b"])
    assert answer == {"a.wo.weight": 1}
    with pytest.raises(ProtocolError, match="must be a dim"):
        mapping.declared(lambda n: "x", ["a"])


def test_names_lose_the_wrappers_components():
    assert trace.normalize("module.layers.0._checkpoint_wrapped_module.attention") == "layers.0.attention"
    assert trace.normalize("module") == "" and trace.normalize("_orig_mod.output.weight") == "output.weight"


def test_plain_param_shards_become_full_tensors_for_the_check():
    case = _case(TP2)
    name = "layers.0.attention.wq.weight"
    w = np.arange(32.0).reshape(4, 8)  # its full shape, (4, 8), split on dim 0 over tp
    results = [{"steps": [{"params": {name: w[2 * r:2 * r + 2], "norm.weight": np.ones(8)},
                           "state": {name: (w[2 * r:2 * r + 2], None), "norm.weight": (None, None)}}]}
               for r in range(2)]
    out = mapping.assemble_params(case.layout, results, {name: (4, 8), "norm.weight": (8,)})
    assert all(np.array_equal(res["steps"][0]["params"][name], w) for res in out)
    assert all(np.array_equal(res["steps"][0]["state"][name][0], w) for res in out)
    assert results[0]["steps"][0]["params"][name].shape == (2, 8)  # the input is left as it was


# ---------------------------------------------------------------------------------------------- the bound


def test_the_bound_is_the_contracts_per_kind():
    ref = np.array([1.0, -4.0])
    # a tensor's value: 2^-32 (|v_ref| + S), S the largest magnitude of its kind in the step
    bound = divergence.recorded_bound(trace.OUTPUT, ref, 8.0)
    assert np.array_equal(bound, 2.0**-32 * np.array([1 + 8, 4 + 8]))
    assert divergence.within(ref, ref + 2.0**-32 * np.array([9, 12]), bound).ok
    fit = divergence.within(ref, ref + 2.0**-32 * np.array([10, 0]), bound)
    assert not fit.ok and fit.index == (0,) and fit.bound == 2.0**-32 * 9
    # a reported loss or norm (a sum of terms of one sign): 2^-31 |v_ref|; the tokens exact
    assert divergence.recorded_bound(trace.NORM, np.float64(3.0), 8.0) == 2.0**-31 * 3
    assert divergence.recorded_bound(trace.TOKENS, np.float64(3.0), 8.0) == 0
    assert not divergence.within(np.float64(3), np.nextafter(3.0, 4.0), np.zeros(())).ok
    assert not divergence.within(ref, np.array([np.nan, -4.0]), bound).ok


# ---------------------------------------------------------------------------------------------- the recorder


def _case(layout=None, tied=False, m=2):
    from distcheck.parallel.step.case import FREE_MAX_NORM, StepCase
    from distcheck.parallel.step.model import TinyConfig

    layout = layout or StepLayout()
    cfg = TinyConfig(dim=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=2, ffn_dim=4, vocab_size=8, tied=tied)
    lengths = tuple(tuple(tuple((2, 1) for _ in range(m)) for _ in range(layout.dp)) for _ in range(2))
    return StepCase(layout, cfg, m, 2, 3, lengths, FREE_MAX_NORM, 2.0**-4, 7)


def _traces(case, monkeypatch, perturb=None):
    """The reference's recorded step, and the same step run again as the ranks' (each dp rank keeping its own
    micro-batches), with ``perturb(model)`` applied to the ranks' decoder."""
    import torch

    from distcheck.parallel.step import harness
    from distcheck.parallel.step import model as model_module
    from distcheck.parallel.step.case import batch

    tokens, labels = (torch.from_numpy(a) for a in batch(case))
    ref = harness.reference_trace(case, tokens, labels)
    if perturb is not None:
        build = model_module.build_model

        def built(*args, **kwargs):
            m = build(*args, **kwargs)
            perturb(m)
            return m

        monkeypatch.setattr(model_module, "build_model", built)
    ranks = harness.reference_trace(case, tokens, labels)["events"]
    results = [{"trace": [ev for ev in ranks if ev[1] is None or ev[2] == case.layout.dp_index(r)]}
               for r in range(case.layout.world_size)]
    return ref, results


def test_the_recorder_keeps_execution_order(monkeypatch):
    pytest.importorskip("torch")
    ref, _ = _traces(_case(m=1), monkeypatch)
    first = [(ev[3], ev[4], ev[5]) for ev in ref["events"] if ev[0] == 0]
    outputs = [name for call, kind, name in first if kind == trace.OUTPUT]
    assert outputs[:5] == ["tok_embeddings", "layers.0.attention_norm", "layers.0.attention.wq",
                           "layers.0.attention.wk", "layers.0.attention.wv"]
    assert outputs[-3:] == ["norm", "output", ""]
    kinds = [kind for _, kind, _ in first]
    # forwards, then the loss's gradient, then the backward (modules' input grads and parameters' grads), then the
    # step's tensors in the order they are made
    assert kinds.index(trace.OUTPUT_GRAD) == len(outputs)
    assert {k for k in kinds[len(outputs) + 1:kinds.index(trace.LOSS)]} == {trace.INPUT_GRAD, trace.GRAD}
    assert [k for k in kinds if k not in trace.PER_MICROBATCH][:3] == [trace.LOSS, trace.TOKENS, trace.REDUCED_GRAD]
    order = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert order[order.index(trace.LOSS):] == [trace.LOSS, trace.TOKENS, trace.REDUCED_GRAD, trace.NORM,
                                               trace.CLIPPED_GRAD, trace.EXP_AVG, trace.EXP_AVG_SQ, trace.PARAM]


def test_the_same_step_has_no_divergence(monkeypatch):
    pytest.importorskip("torch")
    case = _case(StepLayout(dp_replicate=2))
    ref, results = _traces(case, monkeypatch)
    text = divergence.first_divergence(case, results, ref)
    assert text.startswith("first divergence: none of the ") and "skipped" not in text, text


def test_the_first_divergence_is_the_module_that_changed(monkeypatch):
    pytest.importorskip("torch")
    import torch

    def scale_w2(model):
        with torch.no_grad():
            model.layers["1"].feed_forward.w2.weight.mul_(1 + 2.0**-20)

    case = _case(StepLayout(dp_replicate=2))
    ref, results = _traces(case, monkeypatch, scale_w2)
    text = divergence.first_divergence(case, results, ref)
    # later outputs (feed_forward, layers.1, norm, the logits) diverge too: the first in call order is named
    assert text.startswith("first divergence: output of layers.1.feed_forward.w2, step 1, micro-batch 0, ranks 0-1: "
                           "error "), text


def test_a_tied_weight_is_named_with_its_other_name(monkeypatch):
    pytest.importorskip("torch")
    import torch

    def untie(model):
        model.output.weight = torch.nn.Parameter(model.output.weight.detach().clone())

    case = _case(tied=True)
    ref, results = _traces(case, monkeypatch, untie)
    text = divergence.first_divergence(case, results, ref)
    assert text.startswith("first divergence: grad of tok_embeddings.weight (tied to output.weight in the reference), "
                           "step 1, micro-batch 0, rank 0: "), text


def test_a_reported_value_is_a_divergence_and_tokens_are_exact():
    ev = [(0, None, None, 0, trace.TOKENS, "", 0, {"local": np.float64(5)})]
    results = [{"trace": ev}, {"trace": [(0, None, None, 0, trace.TOKENS, "", 0, {"local": np.float64(6)})]}]
    text = divergence.first_divergence(_case(StepLayout(dp_replicate=2)), results, {"events": ev, "tied": {}})
    assert text == "first divergence: the reported tokens, step 1, rank 1: expected 5, got 6 (exact); 0 recorded " \
                   "tensors matched before it"


def test_a_pipeline_schedules_micro_batches_are_its_last_calls():
    lay = StepLayout(pp=2)
    ref = [(0, k, 0, 0, trace.OUTPUT, "layers.1", 0, {"local": np.full(2, float(k))}) for k in range(2)]
    # the schedule's shape inference ran the stage once before the two micro-batches (micro-batch unknown: None)
    ran = [(0, None, 0, c, trace.OUTPUT, "layers.1", 0, {"local": np.full(2, v)}) for c, v in enumerate((9, 0, 1))]
    results = [{"trace": []}, {"trace": ran}]
    reference = {"events": ref, "tied": {}}
    text = divergence.first_divergence(_case(lay, m=2), results, reference)
    assert text.startswith("first divergence: none of the 2 ")
    ran[2] = (0, None, 0, 2, trace.OUTPUT, "layers.1", 0, {"local": np.full(2, 5.0)})
    assert divergence.first_divergence(_case(lay, m=2), results, reference).startswith(
        "first divergence: output of layers.1, step 1, micro-batch 1, rank 1: ")


def test_a_tensor_no_rank_mapped_is_said_skipped():
    ref = [(0, 0, 0, 0, trace.OUTPUT, "a", 0, {"local": np.zeros(4)}),
           (0, 0, 0, 0, trace.OUTPUT, "b", 0, {"local": np.zeros(4)})]
    ranks = [[(0, 0, 0, 0, trace.OUTPUT, "a", 0, {"local": np.zeros(3)}),
              (0, 0, 0, 0, trace.OUTPUT, "b", 0, {"local": np.ones(2)})],
             [(0, 0, 0, 0, trace.OUTPUT, "a", 0, {"local": np.zeros(3)}),
              (0, 0, 0, 0, trace.OUTPUT, "b", 0, {"local": np.zeros(2)})]]
    results = [{"trace": ranks[0]}, {"trace": ranks[1]}]
    text = divergence.first_divergence(_case(TP2, m=1), results, {"events": ref, "tied": {}})
    assert text.startswith("first divergence: output of b, step 1, micro-batch 0, rank 0: error 1.00e+00"), text
    assert text.endswith("; not mapped, skipped: output of a (the tp ranks' shapes [(3,), (3,)] are not the "
                         "reference's (4,) split along one dim over tp (StepTarget(shard_dims=...) can say how it is "
                         "laid out))")


# ---------------------------------------------------------------------------------------------- the engine's replay


REPLAYS: list = []


class ExplainedAddition(AdditionContract):
    """The addition contract that explains a failure by replaying its final case."""

    name = "test-addition-explained"

    def explain_rank(self, ctx, target, case, dtype, options):
        REPLAYS.append(case)
        return self.run_rank(ctx, target, case, dtype, options)

    def explain(self, case, results, world_size, dtype, options):
        return f"replayed f({case.a}, {case.b}) = {results[0][0]}"


class BrokenExplanation(ExplainedAddition):
    name = "test-addition-broken-explanation"

    def explain(self, case, results, world_size, dtype, options):
        raise ValueError("no explanation")


def test_only_a_failure_is_replayed_once_on_its_final_case_and_explained():
    from distcheck.certify import certify

    REPLAYS.clear()
    cert = certify(good_add, ExplainedAddition(), examples=30)
    assert cert.ok and REPLAYS == []  # a case that passes is never replayed
    cert = certify(add_without_carry, ExplainedAddition(), examples=100)
    (failed,) = [v for v in cert.verdicts if v.verdict == "FAIL"]
    assert failed.property == "sum" and len(REPLAYS) == 1
    assert repr(REPLAYS[0]) == failed.counterexample
    case = REPLAYS[0]
    assert failed.failure.endswith(f"; replayed f({case.a}, {case.b}) = {(case.a + case.b) % 16}")
    from distcheck.certify.certificate import Certificate

    assert f"replayed f({case.a}, {case.b})" in Certificate([cert], command="c").to_markdown()  # the certificate's


def test_an_explanation_that_raises_leaves_the_failure_standing():
    from distcheck.certify import certify

    cert = certify(add_without_carry, BrokenExplanation(), examples=100)
    (failed,) = [v for v in cert.verdicts if v.verdict == "FAIL"]
    assert failed.failure.endswith("; the recorded replay could not be explained (ValueError: no explanation); a "
                                   "distcheck defect, please report it")
    assert ExplainedAddition().explains() and not AdditionContract().explains()


# ---------------------------------------------------------------------------------------------- on real worlds

#: the bugs placed inside a model (examples/step_mutants.py): each fails params on two ranks, and its first divergence
#: names the module holding the bug
IN_MODEL_MUTANTS = [
    ("ROW_PARALLEL_NOT_REDUCED", "output of layers.0.feed_forward.w2, step 1, micro-batch 0, ranks 0-1: "),
    ("SP_NORM_NOT_SUMMED", "reduced grad of layers.0.ffn_norm.weight (after every micro-batch, before clipping), "
                           "step 1, "),
    ("TIE_LOST", "grad of tok_embeddings.weight (tied to output.weight in the reference), step 1, micro-batch 0, "),
]


def _failure(target, prop, layout, examples=10):
    from distcheck.certify import certify

    cert = certify(target, "training-step", world_sizes=[2], examples=examples, options={"layout": layout},
                   timeout_s=300)
    verdict = next(v for v in cert.verdicts if v.property == prop)
    assert verdict.verdict == "FAIL", verdict
    return verdict.failure


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("target", "diverges"), IN_MODEL_MUTANTS)
def test_a_bug_inside_the_model_is_named_by_the_first_divergence(target, diverges):
    failure = _failure(f"examples.step_mutants:{target}", "params", "tp=2")
    assert f"; first divergence: {diverges}" in failure, failure


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("target", "diverges"), [
    ("TIED_HEAD_NOT_RETIED", "grad of wte.weight (tied to lm_head.weight in the reference), step 1, micro-batch 0, "),
    ("LAYERNORM_OFF_PLAN", "reduced grad of h.0.ln_1.weight (after every micro-batch, before clipping), step 1, "),
])
def test_a_users_own_model_is_recorded_by_its_own_names(target, diverges):
    # the GPT-2-style decoder of examples/my_gpt.py (a model factory, its own module names) under a wrong plan
    failure = _failure(f"examples.gpt_mutants:{target}", "params", "tp=2")
    assert f"; first divergence: {diverges}" in failure, failure


@pytest.mark.multiprocess
@pytest.mark.slow
def test_declared_partial_sums_move_the_first_divergence_to_the_bug():
    # wo and w2 output partial sums by design (their blocks reduce them); layers.0's MLP never does. Declared, the
    # partial sums are added up and the MLP is named; undeclared, wo's partial output is taken for a wrong one
    declared = _failure("tests.plain_tp_targets:DECLARED", "params", "tp=2", examples=4)
    assert "; first divergence: output of layers.0.feed_forward, step 1, micro-batch 0, ranks 0-1: " in declared
    undeclared = _failure("tests.plain_tp_targets:UNDECLARED", "params", "tp=2", examples=4)
    assert "; first divergence: output of layers.0.attention.wo, step 1, micro-batch 0, " in undeclared


@pytest.mark.multiprocess
@pytest.mark.slow
def test_megatron_style_plain_tensors_are_certified():
    # hand-written tp with plain tensor shards (and DDP): the parameters are mapped back over tp for the check
    from distcheck.certify import certify

    cert = certify("examples.my_megatron_step:STEP", "training-step", world_sizes=[2], examples=4, timeout_s=300)
    cert.assert_certified()
    assert {r.columns["layout"] for r in cert.compositions} == {"tp=2", "dp_replicate=2"}


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize(("layout", "world_size"), [("tp=2", 2), ("dp_shard=2", 2), ("pp=2", 2),
                                                    ("dp_shard=2,tp=2", 4)])
def test_a_correct_step_recorded_has_no_divergence_and_maps_every_tensor(layout, world_size):
    # torch's composition recorded: sequence-parallel activations (plain shards), DTensor Shard/Partial/Replicate
    # pieces, FSDP2's strided shards over tp gathered whole, pipeline stages; nothing leaves its bound or is skipped
    from hypothesis import HealthCheck, Phase, given, settings

    from distcheck.certify.explain import explain_entry
    from distcheck.engine.contracts.contract import get_contract
    from distcheck.engine.contracts.targets import import_target
    from distcheck.parallel.step.contracts import _cases, parse_layout
    from distcheck.runners import RankPool

    contract = get_contract("training-step")
    obj, ref = import_target("examples.my_step:parallelize")
    target, options = contract.resolve(obj, ref, contract.parse_options({"layout": layout}))
    cases = []

    @settings(max_examples=2, database=None, phases=[Phase.generate], derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(_cases([parse_layout(layout)]))
    def collect(case):
        cases.append(case)

    collect()
    with RankPool(world_size, backend="gloo", timeout_s=300) as pool:
        for case in cases:
            results = pool.run(explain_entry, contract, target, case, "float64", options)
            text = contract.explain(case, results, world_size, "float64", options)
            assert text.startswith("first divergence: none of the ") and "skipped" not in text, (case, text)
