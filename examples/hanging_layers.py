"""Layers that never answer: their forward sleeps in a loop, as a deadlock looks from outside.

:class:`RowParallelSleeps` is :class:`examples.my_tp_layers.RowParallelLinear` whose forward never
returns (a rank waiting on a message that never comes looks the same). ``distcheck certify`` fails
it at the first step that outlives ``--timeout``, with every stuck rank's Python stack (which points
at the ``time.sleep`` line below), and skips the properties left ("a previous property hung"):

    distcheck certify examples.hanging_layers:RowParallelSleeps --contract row-parallel-linear --timeout 5

:class:`RowParallelSleepsWhenWide` hangs only on some cases (4 input features or more): a hang is shrunk
like any failure, so its reported case is the smallest that hangs (4 input features, one row, zeros), with
that case's stacks:

    distcheck certify examples.hanging_layers:RowParallelSleepsWhenWide --contract row-parallel-linear --timeout 5
"""

from __future__ import annotations

import time

from examples.my_tp_layers import RowParallelLinear


class RowParallelSleeps(RowParallelLinear):
    """Broken: the forward sleeps forever (one second at a time), on every rank."""

    def forward(self, x):
        while True:
            time.sleep(1.0)  # the line a stuck rank's stack names


class RowParallelSleepsWhenWide(RowParallelLinear):
    """Broken on some cases only: the forward sleeps forever when the layer has 4 input features or more."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=False):
        super().__init__(in_features, out_features, bias, input_is_parallel)
        self.in_features = in_features

    def forward(self, x):
        while self.in_features >= 4:
            time.sleep(1.0)  # the line a stuck rank's stack names
        return super().forward(x)
