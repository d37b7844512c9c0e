"""Training-state memory: the lesson's and chapter's figures, references vs closed forms."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from distcheck.core.errors import ConfigError
from distcheck.core.units import GB, bytes_to
from distcheck.parallel.memory import (
    CONVENTIONS,
    BytesPerParam,
    bytes_per_param,
    grads_bytes,
    min_gpus,
    min_tp,
    min_tp_pp,
    optimizer_bytes,
    train_state_bytes,
    weights_bytes,
)
from distcheck.parallel.memory import forms as F

P7 = 6_738_149_376      # lesson 7B-style
P70 = 68_975_329_280    # lesson 70B-style
P13 = 13 * 10**9        # lesson 13B-style exercise (raw count)


def gb2(n_bytes) -> float:
    """Round to 2 decimals in GB, as the lesson prints."""
    return round(float(bytes_to(n_bytes, "GB")), 2)


def test_convention_totals():
    totals = {k: v.total for k, v in CONVENTIONS.items()}
    assert totals == {"mixed_adamw": 16, "mixed_adamw_fp32_grads": 18, "adam_8bit": 10,
                      "sgd_momentum": 12, "moments_only": 12}
    m = bytes_per_param("mixed_adamw")
    assert (m.weights, m.grads, m.master, m.momentum, m.variance, m.optimizer) == (2, 2, 4, 4, 4, 12)
    assert bytes_per_param("moments_only").master == 0
    assert bytes_per_param("sgd_momentum").variance == 0


def test_eight_bit_adam_exercise():
    # lesson section 4: moments 1 byte each instead of 4 -> 16 - 2*3 = 10
    assert bytes_per_param("adam_8bit").total == 16 - 2 * (4 - 1) == 10
    assert train_state_bytes(P7, "adam_8bit") == 67_381_493_760


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_convention_forms_match(name):
    form = F.BYTES_PER_PARAM[name]
    assert form.name == f"memory.bytes_per_param.{name}"
    assert form() == CONVENTIONS[name].total
    assert form.source and form.description


def test_lesson_7b_style():
    state = train_state_bytes(P7)
    assert state == 107_810_390_016
    assert gb2(state) == 107.81
    # + 0.822 GB of activations (the lesson's given figure) -> 108.63 GB, over 80 GB
    with_act = state + Fraction(822, 1000) * GB
    assert gb2(with_act) == 108.63 and with_act > 80 * GB
    # plain DP leaves it unchanged; tp = 8 divides the state
    per_gpu = train_state_bytes(P7, tp=8)
    assert per_gpu == 13_476_298_752
    assert gb2(per_gpu) == 13.48


def test_lesson_70b_style():
    state = train_state_bytes(P70)
    assert state == 1_103_605_268_480
    assert gb2(state) == 1103.61
    assert gb2(train_state_bytes(P70, tp=8)) == 137.95
    assert train_state_bytes(P70, tp=8) > 80 * GB
    t8p2 = train_state_bytes(P70, tp=8, pp=2)
    assert t8p2 == 68_975_329_280 and gb2(t8p2) == 68.98 and t8p2 <= 80 * GB


def test_lesson_13b_exercise():
    assert train_state_bytes(P13) == 208 * GB
    assert min_tp(P13, 80 * GB) == 4
    assert train_state_bytes(P13, tp=4) == 52 * GB
    assert train_state_bytes(P13, tp=2) > 80 * GB
    assert F.MIN_TP_POW2(params=P13, budget_bytes=80 * GB) == 4


def test_lesson_smallest_split_of_70b():
    # whole layers per stage (80 layers): (8, 2); ties at product 16 broken toward the largest tp
    assert min_tp_pp(P70, 80 * GB, num_layers=80) == (8, 2)
    assert min_tp_pp(P70, 80 * GB, pp_pow2=True) == (8, 2)
    # any pp: product 14 suffices (78.83 GB); (2, 7) beats (1, 14) by the tie-break
    assert min_tp_pp(P70, 80 * GB) == (2, 7)
    assert gb2(train_state_bytes(P70, tp=2, pp=7)) == 78.83
    assert min_tp_pp(P70, 80 * GB, max_pp=1) is None


def test_min_tp_none_when_nothing_fits():
    assert min_tp(P70, 80 * GB) is None
    assert min_tp(P70, 80 * GB, max_tp=16) == 16
    assert min_tp(1, 16) == 1
    assert min_tp(1, 15) == 2  # 16 bytes on a 15-byte budget needs tp = 2


def test_chapter_figures():
    # "Chapter 26: Distributed Training": 70B weights 140 GB, Adam states 560 GB (8 B/param: no master), grads 140 GB
    p = 70 * 10**9
    mo = bytes_per_param("moments_only")
    assert weights_bytes(p, mo) == 140 * GB
    assert optimizer_bytes(p, mo) == 560 * GB
    assert grads_bytes(p, mo) == 140 * GB
    assert train_state_bytes(p, "moments_only") == 840 * GB
    assert train_state_bytes(p, "mixed_adamw") == 1120 * GB  # what the lesson's convention gives
    assert min_gpus(870 * GB, 80 * GB) == 11
    assert min_gpus(5030 * GB, 80 * GB) == 63
    assert min_gpus(80 * GB, 80 * GB) == 1
    assert min_gpus(80 * GB + 1, 80 * GB) == 2


def test_components_sum_and_fractions():
    for name, conv in CONVENTIONS.items():
        parts = weights_bytes(P7, name, 2, 3) + grads_bytes(P7, name, 2, 3) + optimizer_bytes(P7, name, 2, 3)
        assert parts == train_state_bytes(P7, conv, tp=2, pp=3) == train_state_bytes(P7, conv.total, 2, 3)
    assert train_state_bytes(1, 16, tp=32) == Fraction(1, 2)
    assert isinstance(train_state_bytes(3, 16, tp=2), int)
    assert train_state_bytes(3, Fraction(21, 2)) == Fraction(63, 2)


@settings(max_examples=60, deadline=None)
@given(
    p=st.integers(1, 10**13), b=st.integers(1, 40), t=st.integers(1, 16), pp=st.integers(1, 16),
    conv=st.sampled_from(sorted(CONVENTIONS)),
)
def test_reference_equals_forms(p, b, t, pp, conv):
    assert train_state_bytes(p, b, t, pp) == F.TRAIN_STATE_BYTES(params=p, bytes_per_param=b, tp=t, pp=pp)
    c = CONVENTIONS[conv]
    assert weights_bytes(p, conv, t, pp) == F.WEIGHTS_BYTES(params=p, weight_bytes=c.weights, tp=t, pp=pp)
    assert grads_bytes(p, conv, t, pp) == F.GRADS_BYTES(params=p, grad_bytes=c.grads, tp=t, pp=pp)
    assert optimizer_bytes(p, conv, t, pp) == F.OPTIMIZER_BYTES(params=p, optimizer_bytes_per_param=c.optimizer,
                                                                tp=t, pp=pp)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 10**13), b=st.integers(1, 20), budget=st.integers(1, 10**12))
@example(p=2**31 + 1, b=1, budget=1)  # one above a power of two: sympy's ceiling(log(n, 2)) said 2^31
def test_min_tp_reference_equals_form(p, b, budget):
    ref = min_tp(p, budget, b, max_tp=2**60)
    assert ref == F.MIN_TP_POW2(params=p, bytes_per_param=b, budget_bytes=budget)
    assert train_state_bytes(p, b, tp=ref) <= budget
    if ref > 1:
        assert train_state_bytes(p, b, tp=ref // 2) > budget


@settings(max_examples=60, deadline=None)
@given(total=st.integers(1, 10**13), gpu=st.integers(1, 10**11))
def test_min_gpus_reference_equals_form(total, gpu):
    n = min_gpus(total, gpu)
    assert n == F.MIN_GPUS(total_bytes=total, gpu_bytes=gpu)
    assert n * gpu >= total > (n - 1) * gpu


def test_min_tp_pow2_exact_powers():
    # b P / budget exactly a power of two, and one above it
    assert F.MIN_TP_POW2(params=2**50, bytes_per_param=16, budget_bytes=16) == 2**50
    assert F.MIN_TP_POW2(params=2**50 + 1, bytes_per_param=16, budget_bytes=16) == 2**51


def test_form_names():
    names = {f.name for f in (F.TRAIN_STATE_BYTES, F.WEIGHTS_BYTES, F.GRADS_BYTES, F.OPTIMIZER_BYTES,
                              F.MIN_GPUS, F.MIN_TP_POW2)}
    assert names == {"memory.train_state_bytes", "memory.weights_bytes", "memory.grads_bytes",
                     "memory.optimizer_bytes", "memory.min_gpus", "memory.min_tp_pow2"}


@pytest.mark.parametrize("call, message", [
    (lambda: train_state_bytes(P7, 16.0), "bytes_per_param=16.0 must be an int or Fraction"),
    (lambda: train_state_bytes(P7, 0), "bytes_per_param=0 must be > 0"),
    (lambda: train_state_bytes(P7, "adam"), "convention='adam' must be one of mixed_adamw"),
    (lambda: train_state_bytes(0), "params=0 must be >= 1"),
    (lambda: train_state_bytes(P7, tp=0), "tp=0 must be >= 1"),
    (lambda: train_state_bytes(P7, pp=1.5), "pp=1.5 must be an integer"),
    (lambda: weights_bytes(P7, "fp8"), "convention='fp8' must be one of"),
    (lambda: min_tp(P7, 0), "budget_bytes=0 must be > 0"),
    (lambda: min_tp(P7, 80 * GB, max_tp=0), "max_tp=0 must be >= 1"),
    (lambda: min_tp_pp(P7, 80 * GB, num_layers=0), "num_layers=0 must be >= 1"),
    (lambda: min_tp_pp(P7, 80 * GB, pp_pow2=1), "pp_pow2=1 must be a bool"),
    (lambda: min_gpus(870e9, 80 * GB), "total_bytes=870000000000.0 must be an int or Fraction"),
    (lambda: min_gpus(1, -1), "gpu_bytes=-1 must be > 0"),
    (lambda: BytesPerParam(2, 2, -4, 4, 4), "master=-4 must be an integer >= 0"),
])
def test_errors(call, message):
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value).startswith(message)


# ---- min_tp_pp: the direct search agrees with trying every pp; huge bounds do not loop


def _min_tp_pp_by_trying(params, budget, bpp, max_tp, max_pp, num_layers, pp_pow2):
    best, tp = None, 1
    while tp <= max_tp:
        for pp in range(1, max_pp + 1):
            if (num_layers is not None and num_layers % pp) or (pp_pow2 and pp & (pp - 1)):
                continue
            if Fraction(bpp * params, tp * pp) <= budget:
                if best is None or (tp * pp, -tp) < (best[0] * best[1], -best[0]):
                    best = (tp, pp)
                break
        tp *= 2
    return best


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 10**4), st.integers(1, 2000), st.integers(1, 20), st.integers(1, 16), st.integers(1, 40),
       st.none() | st.integers(1, 60), st.booleans())
def test_min_tp_pp_matches_trying_every_split(params, budget, bpp, max_tp, max_pp, num_layers, pp_pow2):
    assert min_tp_pp(params, budget, bpp, max_tp, max_pp, num_layers, pp_pow2) == \
        _min_tp_pp_by_trying(params, budget, bpp, max_tp, max_pp, num_layers, pp_pow2)


def test_min_tp_pp_with_huge_bounds_answers_without_enumerating():
    assert min_tp_pp(10**12, "80 GB", 16, max_tp=8, max_pp=2**60) == (8, 25)  # 16e12 / 80e9 = 200 = 8 * 25
    # 10**12 - 1 = 3**3 * 7 * 11 * 13 * 37 * 101 * 9901: tp=2 needs pp >= 100 -> 101 (product 202)
    # beats tp=8, pp >= 25 -> 27 (216) and tp=4, pp >= 50 -> 63 (252)
    assert min_tp_pp(10**12, "80 GB", 16, max_tp=8, max_pp=2**60, num_layers=10**12 - 1) == (2, 101)
    with pytest.raises(ConfigError, match="num_layers=.* must be <= 1000000000000"):
        min_tp_pp(10**12, "80 GB", num_layers=10**13)
