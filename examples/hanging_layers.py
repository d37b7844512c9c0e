"""A layer that never answers: its forward sleeps in a loop, as a deadlock looks from outside.

:class:`RowParallelSleeps` is :class:`examples.my_tp_layers.RowParallelLinear` whose forward never
returns (a rank waiting on a message that never comes looks the same). ``distcheck certify`` fails
it at the first step that outlives ``--timeout``, with every stuck rank's Python stack (which points
at the ``time.sleep`` line below), and skips the properties left ("a previous property hung"):

    distcheck certify examples.hanging_layers:RowParallelSleeps --contract row-parallel-linear --timeout 5
"""

from __future__ import annotations

import time

from examples.my_tp_layers import RowParallelLinear


class RowParallelSleeps(RowParallelLinear):
    """Broken: the forward sleeps forever (one second at a time), on every rank."""

    def forward(self, x):
        while True:
            time.sleep(1.0)  # the line a stuck rank's stack names
