"""What torch.distributed.checkpoint guarantees of a save that is killed, seen in one process.

``dcp.save`` with its ``FileSystemWriter`` writes each rank's ``__<rank>_0.distcp`` in place, then the
``.metadata`` file to ``.metadata.tmp`` and renames it (``FileSystemWriter.finish``): the rename is the
commit. So a save into a *new* ``checkpoint_id`` killed before it leaves a folder that does not load
(no ``.metadata``), and every earlier checkpoint (another folder) untouched: DCP's guarantee, when each
save gets a folder of its own. A save *over* an existing ``checkpoint_id`` rewrites the data files first:
killed before the commit, the old ``.metadata`` names the new data files. :func:`interrupted_saves` runs
both in this process (no process group: DCP saves and loads locally) with a writer whose ``finish`` is
interrupted, and says what a load then gives.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["interrupted_saves"]


class _Killed(BaseException):
    pass


def interrupted_saves(root: str | os.PathLike[str]) -> dict[str, str]:
    """``{"new_id": outcome, "same_id": outcome}``: what loading gives after a save of new values killed
    between its data files and its ``.metadata`` (module doc), into a new folder and over the old one.
    Each outcome is ``"old"`` (the previous checkpoint, whole), ``"new"``, ``"mixed"`` or ``"error: ..."``."""
    import warnings

    with warnings.catch_warnings():  # DCP warns that it runs in one process, and that it overwrites
        warnings.simplefilter("ignore")
        return _interrupted_saves(root)


def _interrupted_saves(root: str | os.PathLike[str]) -> dict[str, str]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import CheckpointException, FileSystemWriter

    class Interrupted(FileSystemWriter):
        def finish(self, metadata: Any, results: Any) -> None:
            raise _Killed

    old = {"a": torch.arange(8, dtype=torch.float64), "b": torch.arange(3, dtype=torch.float64)}
    new = {"a": -torch.arange(8, dtype=torch.float64) - 1, "b": -torch.arange(3, dtype=torch.float64) - 1}
    out = {}
    for case, second in (("new_id", "second"), ("same_id", "first")):
        first = os.path.join(root, case, "first")
        dcp.save(old, checkpoint_id=first)
        try:
            dcp.save(new, storage_writer=Interrupted(os.path.join(root, case, second)))
        except (_Killed, CheckpointException):  # DCP gathers a rank's exception into a CheckpointException
            pass
        got = {k: torch.zeros_like(v) for k, v in old.items()}
        try:
            dcp.load(got, checkpoint_id=first)
        except Exception as e:  # noqa: BLE001 (what the load raises is the outcome)
            out[case] = f"error: {type(e).__name__}"
            continue
        is_old = [torch.equal(got[k], old[k]) for k in old]
        is_new = [torch.equal(got[k], new[k]) for k in old]
        out[case] = "old" if all(is_old) else "new" if all(is_new) else "mixed"
    return out
