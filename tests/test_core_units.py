"""The lesson's and the ZeRO paper's byte figures in both units: GB = 1e9 and GiB = 2**30 bytes.

The sources print decimal GB; the same bytes in GiB (what nvidia-smi and
torch.cuda report) are about 7% smaller numbers. A budget stated in GiB is a
larger budget than the same number of GB, which can change a fit decision.
"""

from __future__ import annotations

import pytest

from distcheck.core.units import GB, GiB, bytes_to, format_bytes, parse_bytes
from distcheck.parallel.memory import min_gpus, min_tp, min_tp_pp, train_state_bytes
from distcheck.parallel.params import PRESETS, count_params
from distcheck.parallel.zero import model_state_bytes_per_gpu

P7 = count_params(PRESETS["lesson-7b-style"])
P70 = count_params(PRESETS["lesson-70b-style"])


@pytest.mark.parametrize(
    "n_bytes, gb, gib",
    [
        (train_state_bytes(P7), "107.81 GB", "100.41 GiB"),
        (train_state_bytes(P70), "1,103.61 GB", "1,027.81 GiB"),
        (train_state_bytes(P70, tp=8), "137.95 GB", "128.48 GiB"),
        (train_state_bytes(P70, tp=8, pp=2), "68.98 GB", "64.24 GiB"),
    ],
)
def test_lesson_state_in_gb_and_gib(n_bytes, gb, gib):
    assert format_bytes(n_bytes, "GB") == gb
    assert format_bytes(n_bytes, "GiB") == gib
    assert bytes_to(n_bytes, "GB") * GB == bytes_to(n_bytes, "GiB") * GiB == n_bytes  # exact both ways


def test_zero_paper_figure1_in_gb_and_gib():
    got = [model_state_bytes_per_gpu(7_500_000_000, 64, s) for s in range(4)]
    assert [format_bytes(b, "GB", 1) for b in got] == ["120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"]
    assert [format_bytes(b, "GiB", 2) for b in got] == ["111.76 GiB", "29.25 GiB", "15.50 GiB", "1.75 GiB"]


def test_a_gib_budget_is_larger_than_a_gb_budget():
    # 16 * 5.2e9 = 83.2e9 bytes: over 80 GB (80e9) but under 80 GiB (85.9e9)
    assert min_tp(5_200_000_000, "80 GB") == 2
    assert min_tp(5_200_000_000, "80 GiB") == 1
    assert min_tp(5_200_000_000, parse_bytes("80 GiB")) == min_tp(5_200_000_000, 80 * GiB) == 1
    assert min_tp_pp(P70, "80 GB", num_layers=80) == (8, 2)
    assert min_gpus("870 GB", "80 GB") == 11  # "Chapter 26: Distributed Training": "minimum 11"
    assert min_gpus(train_state_bytes(P70), "80 GB") == 14
    assert min_gpus(train_state_bytes(P70), "80 GiB") == 13
