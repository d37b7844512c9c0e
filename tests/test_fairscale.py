"""fairscale's model-parallel layers certified on gloo worlds of 2 and 4 ranks (the optional extra
``distcheck[fairscale]``; every test here is marked ``fairscale`` and skipped cleanly without it).

Each test pins one line of the fairscale table of docs/CONTRACTS.md; ``python -m pytest -q -m fairscale`` reproduces it.
The adapter (``distcheck.engine.contracts.adapters``) calls ``initialize_model_parallel(world_size)`` on
every rank before the layer is built."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from distcheck.certify.engine import certify
from distcheck.engine.contracts.errors import ProtocolError
from distcheck.runners import RankPool

pytest.importorskip("torch")
fairscale = pytest.importorskip("fairscale")

pytestmark = [pytest.mark.fairscale, pytest.mark.multiprocess,
              pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # examples/fairscale_lm_head.py, as `distcheck certify` finds it from the repository root
    sys.path.insert(0, str(ROOT))

LAYERS = "fairscale.nn.model_parallel.layers"
CE = "fairscale.nn.model_parallel.cross_entropy:vocab_parallel_cross_entropy"


@pytest.fixture(scope="module", params=[2, 4])
def gloo(request):
    with RankPool(world_size=request.param, backend="gloo", timeout_s=120) as pool:
        yield pool


@pytest.mark.parametrize("target, contract, options", [
    (f"{LAYERS}:ColumnParallelLinear", "column-parallel-linear", {}),
    (f"{LAYERS}:ColumnParallelLinear", "column-parallel-linear", {"gather_output": False}),
    (f"{LAYERS}:RowParallelLinear", "row-parallel-linear", {}),
    (f"{LAYERS}:RowParallelLinear", "row-parallel-linear", {"input_is_parallel": True}),
    (f"{LAYERS}:VocabParallelEmbedding", "vocab-parallel-embedding", {}),
    (CE, "vocab-parallel-cross-entropy", {}),
    ("examples.fairscale_lm_head:FairscaleLMHeadLoss", "vocab-parallel-lm-head-loss", {}),
])
def test_fairscale_layers_are_certified(gloo, target, contract, options):
    cert = certify(target, contract, pool=gloo, examples=8, seed=5, options=options)
    cert.assert_certified()
    if target.startswith("fairscale."):
        assert cert.distribution == "fairscale" and cert.version == fairscale.__version__
    assert {v.dtype for v in cert.verdicts} == {"float64", "float32", "bfloat16"}
    assert all(v.examples == 8 and v.world_size == gloo.world_size for v in cert.verdicts)


def test_fairscale_cross_entropy_has_no_ignore_index(gloo):
    """fairscale's loss has no ignore_index (nor Megatron-LM's): a token whose target is -100 gets the
    full log-sum-exp instead of 0. Not a defect of fairscale, a convention the contract's option names."""
    cert = certify(CE, "vocab-parallel-cross-entropy", pool=gloo, examples=8, seed=5, dtypes=["float64"],
                   options={"ignore_index": -100})
    assert {v.property for v in cert.failures} == {"forward", "input_grad"}
    forward = next(v for v in cert.failures if v.property == "forward")
    assert "target=[[-100]]" in forward.counterexample and "expected [[0.0]]" in forward.failure


def test_fairscale_needs_a_process_backend():
    with RankPool(world_size=2, backend="threaded", timeout_s=60) as pool, \
            pytest.raises(ProtocolError, match="fairscale keeps its model-parallel group in module globals"):
        certify(f"{LAYERS}:ColumnParallelLinear", "column-parallel-linear", pool=pool, examples=2)


def test_a_users_module_built_from_fairscale_gets_the_set_up():
    importlib.import_module("examples.fairscale_lm_head")
    from distcheck.engine.contracts.adapters import library_of
    from distcheck.engine.contracts.targets import Target

    assert library_of(Target(ref="examples.fairscale_lm_head:FairscaleLMHeadLoss", kind="module")) == "fairscale"
