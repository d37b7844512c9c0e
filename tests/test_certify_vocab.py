"""The vocab-parallel embedding and cross-entropy: numpy references, closed forms, the derived bound, and the
contracts on real worlds: the example layers and torch's own are certified (or fail with evidence), and the
known-wrong ones (no all-reduce, no mask, a local max, a local softmax) fail with shrunk counterexamples."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from distcheck.certify.engine import certify
from distcheck.core.errors import ConfigError
from distcheck.parallel.tp import vocab

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------- references (no torch)


def test_vocab_range_follows_array_split():
    assert [vocab.vocab_range(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [vocab.vocab_range(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ConfigError, match="tp=5 must be <= 4"):
        vocab.vocab_range(4, 5, 0)


def test_embedding_is_the_lookup_bit_for_bit_and_each_part_holds_its_block():
    rng = np.random.default_rng(1)
    W = rng.normal(size=(7, 3))
    ids = np.array([[0, 6, 3], [3, 2, 5]])
    for tp in range(1, 8):
        log: list = []
        assert np.array_equal(vocab.vocab_parallel_embedding(ids, W, tp, log=log), W[ids])
        assert len(log) == 1 and log[0][1] == (2, 3, 3)
    parts = vocab.vocab_parallel_embedding_parts(ids, W, 2)  # blocks [0, 4) and [4, 7)
    assert np.array_equal(parts[0][0, 1], np.zeros(3)) and np.array_equal(parts[1][0, 1], W[6])
    with pytest.raises(ConfigError, match="ids=7 must lie in \\[0, 7\\)"):
        vocab.vocab_parallel_embedding([[7]], W, 2)


def test_embedding_weight_gradient_sums_the_tokens_of_each_id():
    g = np.arange(12, dtype=float).reshape(2, 2, 3)
    grad = vocab.embedding_weight_grad(np.array([[1, 1], [0, 3]]), g, 4)
    assert grad.tolist() == [[6.0, 7.0, 8.0], [3.0, 5.0, 7.0], [0.0, 0.0, 0.0], [9.0, 10.0, 11.0]]


def test_cross_entropy_sharded_equals_single_device_and_ignores_tokens():
    z = np.array([[[1.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0]]])
    t = np.array([[0, -100]])
    want = np.log(np.exp(z[0, 0]).sum()) - 1.0
    for tp in (1, 2, 3, 4):
        log: list = []
        got = vocab.vocab_parallel_cross_entropy(z, t, tp, ignore_index=-100, log=log)
        assert got[0, 1] == 0.0 and abs(got[0, 0] - want) < 1e-15
        assert len(log) == 3
    assert vocab.cross_entropy(z, t, ignore_index=-100, reduction="mean") == pytest.approx(want, abs=1e-15)
    grad = vocab.cross_entropy_grad(z, t, 2.0, ignore_index=-100, reduction="mean")
    p = np.exp(z[0, 0]) / np.exp(z[0, 0]).sum()
    assert np.allclose(grad[0, 0], 2.0 * (p - [1, 0, 0, 0]), atol=1e-15) and not grad[0, 1].any()
    with pytest.raises(ConfigError, match="for reduction='mean'"):
        vocab.cross_entropy(z, np.array([[-100, -100]]), ignore_index=-100, reduction="mean")


def test_a_local_max_is_not_a_common_shift():
    """The references' algebra: a shift common to all ranks leaves the loss alone, one per rank does not."""
    z, t = np.array([[[1.0, 0.0]]]), np.array([[0]])
    right = vocab.vocab_parallel_cross_entropy(z, t, 2)[0, 0]
    local = np.log(np.exp(z[0, 0, 0] - 1.0) + np.exp(z[0, 0, 1] - 0.0)) - 0.0  # each rank its own max
    assert right == pytest.approx(np.log(1 + np.exp(-1.0)), abs=1e-15)
    assert abs(local - right) > 0.37


# ----------------------------------------------------------------------------- the derived bound


def test_the_bound_is_tight_enough_to_catch_a_local_max_and_holds_for_torch():
    torch = pytest.importorskip("torch")
    from distcheck.engine.contracts import bounds as tb
    from distcheck.parallel.tp.vocab_contracts import CECase, _tracked_cross_entropy

    case = CECase(tp=2, logits=np.array([[[1.0, 0.0]]]), target=np.array([[0]]), grad_output=np.array([[1.0]]))
    for dtype, most in (("float64", 1e-14), ("float32", 1e-5), ("bfloat16", 0.1)):
        low = _tracked_cross_entropy(case, tb.UNIT_ROUNDOFF[dtype], "none", None)
        assert 0 < low["loss"].e.max() < most  # below the 0.38 a local max costs on this case
    rng = np.random.default_rng(0)
    for _ in range(20):  # torch's own cross-entropy on a device, in each format, within the bound
        z = rng.integers(-4, 5, size=(2, 3, 8)) / 2
        t = rng.integers(0, 8, size=(2, 3))
        t[0, 0] = -100
        c = CECase(tp=1, logits=z, target=t, grad_output=np.array(1.0))
        for dtype in ("float32", "bfloat16"):
            tdt = getattr(torch, dtype)
            zt = torch.tensor(z, dtype=tdt, requires_grad=True)
            loss = torch.nn.functional.cross_entropy(zt.reshape(6, 8), torch.tensor(t).reshape(6), reduction="mean")
            loss.backward()
            low = _tracked_cross_entropy(c, tb.UNIT_ROUNDOFF[dtype], "mean", -100)
            exact = _tracked_cross_entropy(c, tb.UNIT_ROUNDOFF["float64"], "mean", -100)
            ref = vocab.cross_entropy(z, t, ignore_index=-100, reduction="mean")
            dz = vocab.cross_entropy_grad(z, t, 1.0, ignore_index=-100, reduction="mean")
            assert abs(float(loss.detach()) - ref) <= tb.final_bound(low["loss"].e, exact["loss"].e)
            assert (np.abs(zt.grad.double().numpy() - dz) <= tb.final_bound(low["dz"].e, exact["dz"].e)).all()


# ----------------------------------------------------------------------------- contracts on real worlds

torch = pytest.importorskip("torch")

if str(ROOT) not in sys.path:  # the examples/ package, as `distcheck certify` finds it from the repository root
    sys.path.insert(0, str(ROOT))

LAYERS, MUTANTS = "examples.my_vocab_layers", "examples.vocab_mutants"
TORCH = "examples.torch_vocab"


def failed(cert) -> set:
    return {v.property for v in cert.failures}


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
@pytest.mark.parametrize("target, contract, options", [
    (f"{LAYERS}:VocabParallelEmbedding", "vocab-parallel-embedding", {}),
    (f"{LAYERS}:vocab_parallel_cross_entropy", "vocab-parallel-cross-entropy", {}),
    (f"{LAYERS}:VocabParallelCrossEntropy", "vocab-parallel-cross-entropy", {}),
    (f"{LAYERS}:ParallelLMHeadLoss", "vocab-parallel-lm-head-loss", {}),
])
def test_correct_vocab_layers_are_certified_in_every_dtype(threaded2, target, contract, options):
    cert = certify(target, contract, pool=threaded2, examples=10, seed=3, options=options)
    cert.assert_certified()
    assert {v.dtype for v in cert.verdicts} == {"float64", "float32", "bfloat16"}
    assert all(v.examples == 10 for v in cert.verdicts)
    names = {v.property for v in cert.verdicts}
    assert ("input_grad" in names) == (contract != "vocab-parallel-embedding")  # ids have no gradient


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
@pytest.mark.parametrize("options", [{}, {"reduction": "mean", "ignore_index": -100},
                                     {"reduction": "sum", "ignore_index": -100, "divisible": False}])
def test_torch_loss_parallel_is_certified_on_gloo(gloo2, options):
    """torch's loss_parallel, on gloo (the threaded backend is refused: see the test below)."""
    cert = certify("torch.distributed.tensor.parallel:loss_parallel", "vocab-parallel-cross-entropy", pool=gloo2,
                   examples=10, seed=3, options=options)
    cert.assert_certified()
    assert {v.dtype for v in cert.verdicts} == {"float64", "float32", "bfloat16"}
    assert all(v.examples == 10 for v in cert.verdicts)
    assert cert.options.get("split") == "chunk"  # DTensor's Shard placement, read from the target


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
@pytest.mark.parametrize("options", [{}, {"reduction": "mean", "ignore_index": -100}])
def test_torch_recipe_colwise_lm_head_and_loss_parallel_is_certified(gloo2, options):
    """nn.Linear with ColwiseParallel(use_local_output=False), F.cross_entropy inside loss_parallel()."""
    cert = certify("torch.distributed.tensor.parallel:loss_parallel", "vocab-parallel-lm-head-loss", pool=gloo2,
                   examples=10, seed=3, options=options)
    cert.assert_certified()
    assert {v.property for v in cert.verdicts} == {"forward", "input_grad", "param_grads", "collectives.forward",
                                                   "collectives.backward"}
    assert all(v.examples == 10 for v in cert.verdicts)


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_lm_head_without_megatrons_f_fails_on_its_input_gradient(threaded2):
    cert = certify(f"{MUTANTS}:LMHeadNoInputAllReduce", "vocab-parallel-lm-head-loss", pool=threaded2, seed=2,
                   dtypes=["float64"])
    assert failed(cert) == {"input_grad", "collectives.backward"}
    grad = next(v for v in cert.failures if v.property == "input_grad")
    assert "input gradient:" in grad.failure and "ranks disagree" in grad.failure
    assert grad.counterexample.startswith("HeadCase(tp=2, x=")
    coll = next(v for v in cert.failures if v.property == "collectives.backward")
    assert "differ from all_reduce x1" in coll.failure and "rank 0: none; rank 1: none" in coll.failure


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_torch_rowwise_embedding_gradient_is_replicated_not_sharded(threaded2):
    """torch's RowwiseParallel(input_layouts=Replicate()) on nn.Embedding: outputs and gradient values are
    right, but the table's gradient comes back as a Replicate DTensor of the whole table on every rank
    while the table is Shard(0); the class default (input_layouts=Shard(-1)) splits the ids instead."""
    cert = certify(f"{TORCH}:embedding_style", "vocab-parallel-embedding", pool=threaded2, examples=6, seed=1,
                   dtypes=["float64"])
    assert failed(cert) == {"param_grads"}
    (bad,) = cert.failures
    assert "placed (Replicate(),) while the parameter is placed (Shard(dim=0),)" in bad.failure
    assert "its values are checked on the parameter's placement" in bad.failure and bad.ranks == [0, 1]
    from torch.distributed.tensor.parallel import RowwiseParallel

    default = certify(RowwiseParallel, "vocab-parallel-embedding", pool=threaded2, examples=4, seed=1,
                      dtypes=["float64"])
    assert failed(default) == {"forward", "param_grads", "collectives.forward", "collectives.backward"}
    assert "rank 0: output shape (1, 2, 1), expected (1, 1, 1)" in default.failures[0].failure


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_embedding_without_the_all_reduce_fails_on_rank_1_and_on_its_collectives(threaded2):
    cert = certify(f"{MUTANTS}:EmbeddingNoAllReduce", "vocab-parallel-embedding", pool=threaded2, seed=2,
                   dtypes=["float32"])
    assert failed(cert) == {"forward", "collectives.forward"}
    forward = next(v for v in cert.failures if v.property == "forward")
    assert forward.ranks == [1]
    assert forward.counterexample == ("TPCase(tp=2, num_embeddings=2, embedding_dim=1, x=[[0]], weight=[[1.0], "
                                      "[1.0]], grad_output=[[[0.0]]])")
    assert "rank 1 differs from the reference (rank 0 matches); rank 1: expected [[[1.0]]], got [[[0.0]]]" in \
        forward.failure
    coll = next(v for v in cert.failures if v.property == "collectives.forward")
    assert "differ from all_reduce x1 (S=4 B)" in coll.failure and "rank 0: none; rank 1: none" in coll.failure


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_embedding_without_the_mask_adds_the_other_ranks_rows(threaded2):
    cert = certify(f"{MUTANTS}:EmbeddingNoMask", "vocab-parallel-embedding", pool=threaded2, seed=2,
                   dtypes=["bfloat16"])
    assert failed(cert) == {"forward", "param_grads"}
    forward = next(v for v in cert.failures if v.property == "forward")
    assert forward.ranks == [0, 1]
    assert "x=[[0]], weight=[[1.0], [1.0]]" in forward.counterexample
    assert "expected [[[1.0]]], got [[[2.0]]]" in forward.failure  # row 0 plus rank 1's clamped row 1


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_cross_entropy_with_a_local_max_fails_beyond_the_bound(threaded2, dtype):
    cert = certify(f"{MUTANTS}:cross_entropy_local_max", "vocab-parallel-cross-entropy", pool=threaded2, seed=2,
                   dtypes=[dtype])
    assert {"forward", "collectives.forward"} <= failed(cert)
    forward = next(v for v in cert.failures if v.property == "forward")
    assert "loss:" in forward.failure and "> bound" in forward.failure and "(derived bound)" in forward.failure
    assert forward.max_error > 0.1 > forward.bound  # a wrong sum of exponentials, far outside the bound
    coll = next(v for v in cert.failures if v.property == "collectives.forward")
    assert "all_reduce x2" in coll.failure  # the max is not all-reduced


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_cross_entropy_with_a_local_softmax_fails(threaded2):
    cert = certify(f"{MUTANTS}:cross_entropy_local_softmax", "vocab-parallel-cross-entropy", pool=threaded2, seed=2,
                   dtypes=["float32"])
    assert failed(cert) == {"forward", "input_grad", "collectives.forward"}
    forward = next(v for v in cert.failures if v.property == "forward")
    # the shrunk case: zero logits; each rank sums the exponentials of its own half only
    assert forward.counterexample.startswith("CECase(tp=2, logits=[[[0.0, 0.0]]], target=[[0]]")
    assert "expected [[0.6931471805599453]], got [[0.0]]" in forward.failure


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_a_cross_entropy_target_that_is_not_a_loss_function_is_bad_input():
    from distcheck.engine.contracts.errors import ProtocolError

    with pytest.raises(ProtocolError, match="must take \\(logits_shard, target\\)"):
        certify(lambda logits: logits, "vocab-parallel-cross-entropy", world_sizes=[2])
    with pytest.raises(ProtocolError, match="must be a loss function"):
        certify(3, "vocab-parallel-cross-entropy", world_sizes=[2])


def test_the_library_set_up_is_chosen_by_the_targets_package_or_its_modules_names():
    importlib.import_module("examples.my_vocab_layers")  # the module whose names are looked at
    from distcheck.engine.contracts.adapters import library_of
    from distcheck.engine.contracts.targets import Target

    assert library_of(Target(ref="fairscale.nn.model_parallel.layers:ColumnParallelLinear", kind="module")) == \
        "fairscale"
    assert library_of(Target(ref="examples.my_vocab_layers:ParallelLMHeadLoss", kind="module")) is None
    assert library_of(Target(ref="not.imported.here:X", kind="module")) is None


@pytest.mark.multiprocess
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_loss_parallel_is_refused_on_the_threaded_backend(threaded2):
    """Ranks that are threads share loss_parallel()'s process-global op handlers: one rank's exit removes
    them under the other (seen as a KeyError or a rank that never all-reduces). Bad input, not a hang."""
    from distcheck.engine.contracts.errors import ProtocolError

    for contract in ("vocab-parallel-cross-entropy", "vocab-parallel-lm-head-loss"):
        with pytest.raises(ProtocolError, match="process-global DTensor op handlers"):
            certify("torch.distributed.tensor.parallel:loss_parallel", contract, pool=threaded2, examples=2)
