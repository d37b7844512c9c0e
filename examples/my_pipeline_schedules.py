r"""User-style pipeline action tables, right and wrong, for ``distcheck certify --contract pipeline-table``.

Each function takes ``(p, m)`` (ranks, micro-batches) and returns ``{rank: [Action, ...]}``:
the order in which each rank runs its forwards (F), backwards (B) or split backwards
(I: input gradient, W: weight gradient) of stage ``rank``.

    distcheck certify examples.my_pipeline_schedules:one_f_one_b \
        --contract pipeline-table --option schedule=1f1b
    distcheck certify examples.my_pipeline_schedules:one_f_one_b_deep_warmup \
        --contract pipeline-table --option schedule=1f1b
    distcheck certify examples.my_pipeline_schedules:zb_h1_weight_first \
        --contract pipeline-table --option schedule=zb_h1
"""

from distcheck.parallel.pp import Action


def one_f_one_b(p, m):
    """1F1B (PipeDream-Flush): p - r - 1 warm-up forwards, one forward one backward, then the rest."""
    table = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [Action("F", j, r) for j in range(warmup)]
        for k in range(m - warmup):
            row += [Action("F", warmup + k, r), Action("B", k, r)]
        row += [Action("B", j, r) for j in range(m - warmup, m)]
        table[r] = row
    return table


def one_f_one_b_deep_warmup(p, m):
    """Wrong: one warm-up forward too many on every rank. It still runs, but its order and its
    stash (one more micro-batch held on rank 0) are not 1F1B's."""
    table = {}
    for r in range(p):
        warmup = min(p - r, m)
        row = [Action("F", j, r) for j in range(warmup)]
        for k in range(m - warmup):
            row += [Action("F", warmup + k, r), Action("B", k, r)]
        row += [Action("B", j, r) for j in range(m - warmup, m)]
        table[r] = row
    return table


def zb_h1_weight_first(p, m):
    """Wrong: ZB-H1's split backward with each weight pass W run before its input pass I: the
    rank waits for an I it has not run yet."""
    table = {}
    for r in range(p):
        warmup = min(p - r - 1, m)
        row = [Action("F", j, r) for j in range(warmup)]
        for k in range(m - warmup):
            row += [Action("F", warmup + k, r), Action("W", k, r), Action("I", k, r)]
        for j in range(m - warmup, m):
            row += [Action("W", j, r), Action("I", j, r)]
        table[r] = row
    return table
