"""Context parallelism: the reference (against full attention and finite differences), the closed forms'
proofs, the properties and their mutants (each killed by an edge case and by the generated search), and the
contract on gloo worlds (the plain torch.distributed ring of examples/my_ring_attention.py is certified, its
local-mask twin fails, torch's context_parallel is a skip without a GPU)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from distcheck.core.errors import ConfigError
from distcheck.core.results import FAIL, PASS
from distcheck.engine.mutants import mutants
from distcheck.engine.proofs import prove
from distcheck.engine.registry import properties
from distcheck.parallel.cp import reference as ref
from distcheck.parallel.cp import variants as var
from tests.package_checks import assert_mutant_killed, assert_property_holds

PROPERTIES = ["cp.ring.attention", "cp.all_gather.attention", "cp.ulysses.attention", "cp.merge.online_softmax",
              "cp.balance.equal_work"]
MUTANTS = ["cp.merge.no_max_subtraction", "cp.all_gather.local_causal_mask", "cp.balance.contiguous_chunks",
           "cp.ulysses.heads_not_divisible", "cp.ring.skip_last_rotation"]


def test_discovered_and_lazy_public_names():
    assert set(PROPERTIES) <= {p.name for p in properties()}
    assert {m.name for m in mutants() if m.name.startswith("cp.")} == set(MUTANTS)
    import distcheck.parallel.cp as cp
    import distcheck.strategies as public

    assert cp.ring_attention is var.ring_attention and set(cp.__all__) <= set(dir(cp))
    assert public.CPAttentionCase.__module__ == "distcheck.strategies"


@pytest.mark.parametrize("name", PROPERTIES)
def test_property_holds_for_the_reference(name):
    assert_property_holds(name)


@pytest.mark.parametrize("edge_cases", [True, False], ids=["edge", "generated"])
@pytest.mark.parametrize("name", MUTANTS)
def test_every_mutant_is_killed(name, edge_cases):
    assert_mutant_killed(name, edge_cases)


@pytest.mark.parametrize("name", ["proof.cp.ring_forward_equals_all_gather", "proof.cp.balanced_work_is_the_mean"])
def test_proofs(name):
    assert prove(name).verdict == PASS


def test_backward_by_finite_differences_and_head_tail_layout():
    rng = np.random.default_rng(1)
    q, do = rng.normal(size=(6, 4, 3)), rng.normal(size=(6, 4, 3))
    k, v = rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 2, 3))
    grads = ref.full_attention_backward(q, k, v, do)
    h = 1e-6
    for i in range(3):
        for flat in (3, 17, 30):
            plus, minus = [x.copy() for x in (q, k, v)], [x.copy() for x in (q, k, v)]
            plus[i].flat[flat] += h
            minus[i].flat[flat] -= h
            numeric = ((ref.full_attention(*plus) - ref.full_attention(*minus)) * do).sum() / (2 * h)
            assert abs(numeric - grads[i].flat[flat]) < 1e-6
    assert [p.tolist() for p in ref.load_balanced_positions(8, 2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert ref.causal_work(ref.load_balanced_positions(16, 4)) == [34] * 4
    assert ref.causal_work(ref.contiguous_positions(16, 4)) == [10, 26, 42, 58]


def test_merge_is_exact_on_equal_maxima_and_commutative():
    scores = np.where(np.array([[[1, 0, 1, 1]]]) > 0, 2.0, -np.inf)
    v = np.array([[[1.0]], [[5.0]], [[0.5]], [[0.25]]])
    a, b = ref.scores_partial(scores[..., :2], v[:2]), ref.scores_partial(scores[..., 2:], v[2:])
    ab = ref.merge_partials(a, b)
    assert ab.l.tolist() == [[3.0]] and ab.acc.tolist() == [[[1.75]]] and ab.m.tolist() == [[2.0]]
    ba = ref.merge_partials(b, a)
    assert all(np.array_equal(getattr(ab, f), getattr(ba, f)) for f in ("m", "l", "acc"))


@pytest.mark.parametrize("call, field", [
    (lambda: ref.load_balanced_positions(6, 2), "s"),
    (lambda: ref.contiguous_positions(5, 2), "s"),
    (lambda: var.check_ulysses(2, 4, 1), "cp"),
    (lambda: var.ring_attention([np.zeros((2, 1, 1))], [np.zeros((2, 1, 1))], [np.zeros((2, 1, 1))], [[0, 2]]),
     "positions"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.field == field


def _torch_refusal(ctx):
    """What torch's context_parallel raises on this rank of a CPU world ("" when it runs)."""
    import torch

    from distcheck.parallel.cp.plans import torch_context_parallel

    q = torch.randn(1, 4, 4, 8, requires_grad=True)
    k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(2))
    try:
        torch_context_parallel(q, k, v)
    except (NotImplementedError, RuntimeError, IndexError, ValueError) as exc:  # compared by the test
        return f"{type(exc).__name__}: {exc}"
    return ""


@pytest.mark.multiprocess
def test_ring_example_certified_local_mask_fails_torch_skipped_on_cpu():
    pytest.importorskip("torch")
    import torch

    from distcheck.certify.engine import certify
    from distcheck.parallel.cp.plans import CPU_REFUSAL, CPU_REFUSAL_ERROR, cpu_refusal
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        good = certify("examples.my_ring_attention:ring_attention", "context-parallel-attention", pool=pool, seed=0,
                       examples=5, dtypes=("float32",))
        bad = certify("examples.my_ring_attention:ring_attention_local_mask", "context-parallel-attention",
                      pool=pool, seed=0, examples=5, dtypes=("float64",))
        torch_cp = certify("distcheck.parallel.cp.plans:TORCH_CONTEXT_PARALLEL", "context-parallel-attention",
                           pool=pool, seed=0, examples=5, dtypes=("float32",))
        raised = pool.run(_torch_refusal)
    good.assert_certified()
    assert {v.property for v in bad.verdicts if v.verdict == FAIL} == {"forward", "grads"}
    if not torch.cuda.is_available():  # the skip quotes what every rank of a CPU world of two raises
        assert raised == [CPU_REFUSAL_ERROR] * 2 and cpu_refusal("cpu") == CPU_REFUSAL
        assert [(v.verdict, v.failure) for v in torch_cp.verdicts] == [("skip", CPU_REFUSAL)] * 2
    assert cpu_refusal("cuda") is None
