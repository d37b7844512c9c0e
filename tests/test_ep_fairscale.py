"""fairscale's ``MOELayer`` with ``Top2Gate`` under the ``moe-layer`` contract on a gloo world of two (the optional
extra ``distcheck[fairscale]``; marked ``fairscale`` and skipped cleanly without it).

fairscale 0.4's conventions, read from ``fairscale/nn/moe/top2gate.py`` and ``moe_layer.py``
(:data:`distcheck.parallel.ep.plans.FAIRSCALE_OPTIONS`): top-1 the argmax of the softmax, top-2 the argmax of
the logits plus Gumbel noise with the top-1 masked (a sampled second expert, not the second-largest logit);
capacity ``2 S // E`` per rank (S the rank's tokens, asserted a multiple of E: capacity factor 1, k = 2);
first choices fill the slots in token order before any second choice; the softmax over all experts taken in
float32 (``F.softmax(logits, dim=1, dtype=torch.float)``) and the kept gates divided by their sum
(``gates1_s /= denom_s``, the denominator clamped to float32's eps); ``l_aux = mean(me * ce)`` on each rank
(``me`` the mean softmax, ``ce`` the share of first choices); the output is the combine alone (no residual); the
gate's gradient is left to data parallelism.

Findings: with one expert per rank (E = 2 at ep = 2, the second expert forced) every property holds in float32;
with two per rank the sampled second expert differs from the second-largest logit's and ``forward`` FAILs; in
float64 ``MOELayer`` raises (its dispatch einsum mixes ``dispatch_mask.float()`` with the float64 tokens)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("fairscale")

pytestmark = [pytest.mark.fairscale, pytest.mark.multiprocess]

TARGET = "distcheck.parallel.ep.plans:FAIRSCALE_MOE"
FLOAT64_ERROR = "RuntimeError: expected scalar type Float but found Double"


def test_fairscale_moe_certified_one_expert_per_rank_second_expert_sampled_float64_refused():
    from distcheck.certify.engine import certify
    from distcheck.parallel.ep.plans import FAIRSCALE_OPTIONS
    from distcheck.runners import RankPool

    with warnings.catch_warnings(), RankPool(world_size=2, backend="gloo", timeout_s=90) as pool:
        warnings.simplefilter("ignore")
        one = certify(TARGET, "moe-layer", pool=pool, seed=0, examples=10, dtypes=("float32",),
                      options={**FAIRSCALE_OPTIONS, "local_experts": 1})
        two = certify(TARGET, "moe-layer", pool=pool, seed=0, examples=20, dtypes=("float32",),
                      options={**FAIRSCALE_OPTIONS, "local_experts": 2})
        f64 = certify(TARGET, "moe-layer", pool=pool, seed=0, examples=3, dtypes=("float64",),
                      options={**FAIRSCALE_OPTIONS, "local_experts": 1})
    one.assert_certified()
    verdicts = {v.property: v for v in two.verdicts}
    assert verdicts["forward"].verdict == "FAIL" and "output: " in verdicts["forward"].failure
    assert verdicts["aux_loss"].verdict == "pass" and verdicts["all_to_all.forward"].verdict == "pass"
    assert all(v.verdict == "FAIL" and FLOAT64_ERROR in v.failure for v in f64.verdicts)
