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
    assert {v.property: v.verdict for v in good.verdicts}["balance"] == PASS   # counted by the contract's mask
    # the local positions also reach the counting mask: its blocks leave out visible pairs
    assert {v.property for v in bad.verdicts if v.verdict == FAIL} == {"forward", "grads", "balance"}
    if not torch.cuda.is_available():  # the skip quotes what every rank of a CPU world of two raises
        assert raised == [CPU_REFUSAL_ERROR] * 2 and cpu_refusal("cpu") == CPU_REFUSAL
        assert [(v.verdict, v.failure) for v in torch_cp.verdicts] == [("skip", CPU_REFUSAL)] * 3
    assert cpu_refusal("cuda") is None


# ----------------------------------------------------------------------------- balance


def test_blockwise_scores_by_hand():
    # s = 8, cp = 2, chunks of 2: head-tail gives chunks {0, 3} and {1, 2}: 1 + 4 and 2 + 3 key chunks seen
    assert ref.blockwise_scores(ref.load_balanced_positions(8, 2), 2) == [20, 20]
    assert ref.blockwise_scores(ref.contiguous_positions(8, 2), 2) == [12, 28]      # (4 r + 3) blocks of 4
    with pytest.raises(ConfigError) as err:
        ref.blockwise_scores([[0, 2]], 2)
    assert err.value.field == "positions[0]"


def _counted(s, cp, blocks_per_rank, positions):
    """Rank results as the contract's counter leaves them: each rank's counted scores (the same in both passes)
    and every (query, key) pair of its queries covered."""
    out = []
    for n, pos in zip(blocks_per_rank, positions, strict=True):
        covered = np.zeros((s, s), dtype=bool)
        covered[pos] = True
        out.append({"scores": {"forward": n, "backward": n}, "covered": {"forward": covered, "backward": covered}})
    return out


def test_balance_holds_within_one_block_and_names_the_uneven_ranks():
    from distcheck.parallel.cp.contracts import balance
    from distcheck.parallel.cp.strategies import CPAttentionCase

    s, cp = 8, 2
    pos = ref.load_balanced_positions(s, cp)
    case = CPAttentionCase(q=np.zeros((s, 1, 1)), k=np.zeros((s, 1, 1)), v=np.zeros((s, 1, 1)),
                           dout=np.zeros((s, 1, 1)), cp=cp, causal=True, balanced=True)
    assert balance(case, pos, _counted(s, cp, [20, 20], pos)).ok
    assert balance(case, pos, _counted(s, cp, [18, 24], pos)).ok                  # within one block of 4
    uneven = balance(case, pos, _counted(s, cp, [20, 32], pos))                   # even ranks skip, odd do not
    assert not uneven.ok and uneven.ranks == (1,)
    assert uneven.message.startswith("scores per rank (forward [20, 32]; backward [20, 32]) differ from the balanced "
                                     "cp.scores_per_rank.balanced = (2 cp + 1) (s / 2 cp)^2 = 20 at s=8, cp=2")
    assert "forward: rank 1 computes 32 scores (8 blocks of 4)" in uneven.message
    holes = _counted(s, cp, [20, 20], pos)
    holes[0]["covered"]["forward"][7, 0] = False                                  # query 7 reads key 0: not counted
    left_out = balance(case, pos, holes)
    assert not left_out.ok and "rank 0's counted blocks leave out the visible (query, key) pairs [(7, 0)]" in \
        left_out.message
    nothing = balance(case, pos, _counted(s, cp, [0, 0], pos))
    assert not nothing.ok and "counted no score block" in nothing.message


def test_only_a_target_with_the_keyword_is_handed_the_counter():
    from distcheck.parallel.cp.contracts import takes_causal_mask

    def counted(q, k, v, causal_mask=None):
        return q

    def keyword_only(q, k, v, *, causal_mask):
        return q

    def plain(q, k, v):
        return q

    def anything(q, k, v, **kw):
        return q

    assert takes_causal_mask(counted) and takes_causal_mask(keyword_only)
    assert not takes_causal_mask(plain) and not takes_causal_mask(anything) and not takes_causal_mask(len)


@pytest.mark.multiprocess
def test_uneven_ring_and_the_plain_split_fail_balance_only_and_a_plan_without_the_keyword_skips_it():
    pytest.importorskip("torch")
    from distcheck.certify.engine import certify
    from distcheck.parallel.cp.contracts import ContextParallelAttention
    from distcheck.runners import RankPool

    contract = "context-parallel-attention"
    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        uneven = certify("examples.my_ring_attention:ring_attention_uneven_skip", contract, pool=pool, seed=0,
                         examples=5, dtypes=("float32",))
        plain = certify("examples.my_ring_attention:ring_attention_contiguous", contract, pool=pool, seed=0,
                        examples=5, dtypes=("float32",), options={"load_balance": False})
        gather = certify("distcheck.parallel.cp.plans:ALL_GATHER_ATTENTION", contract, pool=pool, seed=0,
                         examples=3, dtypes=("float32",))
    for cert in (uneven, plain):
        verdicts = {v.property: v for v in cert.verdicts}
        assert {p for p, v in verdicts.items() if v.verdict == FAIL} == {"balance"}
        assert verdicts["forward"].verdict == verdicts["grads"].verdict == PASS
    # the smallest counterexample: chunks of one token, 5 scores on the even rank and all 8 on the odd one
    failed = {v.property: v for v in uneven.verdicts}["balance"]
    assert "forward [5, 8]" in failed.failure and failed.ranks == [1]
    assert "forward [3, 7]" in {v.property: v for v in plain.verdicts}["balance"].failure
    skipped = {v.property: v for v in gather.verdicts}["balance"]
    assert skipped.verdict == "skip" and "takes no causal_mask keyword" in skipped.failure
    assert ContextParallelAttention().spec("balance").regime == "exact"
