"""Recorded upstream discrepancies of the checkpoint checks (:mod:`distcheck.parallel.checkpoint.checks`).

Each record is a :class:`distcheck.engine.findings.Finding`: the one check it explains, its exact symptom
(a regular expression that must match the FAIL row's whole detail), what is wrong upstream with the
smallest case, the torch versions it was seen on, a command that reproduces it, and where it is recorded.
:func:`distcheck.engine.findings.label_findings` applies them.
"""

from __future__ import annotations

from distcheck.engine.findings import Finding

__all__ = ["FINDINGS", "EMPTY_TP_SHARD"]

#: the name of the record of FSDP2's empty tp shard (the checkpoint contract avoids drawing its composition)
EMPTY_TP_SHARD = "torch.fully_shard.empty_tp_shard"

FINDINGS: tuple[Finding, ...] = (
    Finding(
        name=EMPTY_TP_SHARD,
        check="checkpoint.fsdp_tp.empty_tp_shard",
        # at 4 ranks (dp 2 x tp 2) rank 1, at 8 (dp 4 x tp 2) rank 1 too: the one rank whose placements give
        # it rows but whose tp piece has no column
        symptom=(r"a \(1, 1\) tensor under fsdp_tp \(tp along dim 1\) at (?:[4-9]|[1-9]\d+) ranks: "
                 r"rank (?P<r>\d+)'s local shard is \(0, 0\) where its placements "
                 r"\(Shard\(dim=0\), Shard\(dim=1\)\) give \(1, 0\)(?: \(also ranks \[[\d, ]+\]\))?; "
                 r"full_tensor\(\) then all-gathers unequal shards over tp and hangs"),
        summary=("torch's FSDP2 (fully_shard) over a tensor-parallel DTensor whose tp piece is empty on a rank "
                 "(a width-1 tensor sharded along dim 1 over tp=2) gives that rank a (0, 0) local shard "
                 "(_init_sharded_param narrows to length 0 when the piece has no element) where its placements "
                 "give (rows, 0); DTensor.full_tensor() then all-gathers shards of unequal sizes over tp, and "
                 "on gloo ranks 0 and 2 never return. Smallest case: a (1, 1) tensor, Shard(1) on tp of a "
                 "(dp=2, tp=2) mesh, then fully_shard on dp. The checkpoint contract does not draw it"),
        library="torch",
        seen_on=("2.13.0+cpu",),
        reproduce=("python docs/repro/torch_fsdp_tp_hang.py   # exit 1: ranks stuck in full_tensor(), stacks on "
                   "stderr; or: distcheck check --only layers --world-sizes {world_size} --backend {backend}"),
        reported=("not found as such in pytorch/pytorch's issue tracker (related by title, both closed: issues "
                  "129206 and 129229, full_tensor() of tensor-parallel + FSDP2 parameters on torch 2.4); the "
                  "narrowing is in torch/distributed/fsdp/_fully_shard/_fsdp_param.py "
                  "(FSDPParam._init_sharded_param); recorded in docs/LAYERS.md, section Checkpoints"),
    ),
)
