"""torch 2.13: FSDP2 over tensor parallelism gives a rank an empty tp shard the wrong shape, and
``full_tensor()`` hangs (recorded finding ``torch.fully_shard.empty_tp_shard``; docs/LAYERS.md, Checkpoints).

A (1, 1) parameter, ``Shard(1)`` on the tp axis of a (dp=2, tp=2) DeviceMesh (tp rank 1 holds no column),
then ``fully_shard`` on the dp axis: rank 1's local shard is (0, 0) where its placements
``(Shard(0), Shard(1))`` give (1, 0). ``full_tensor()`` all-gathers over tp first, rank 0 sending 1 row and
rank 1 none; gloo then never completes ranks 0 and 2. Plain torch, 4 processes on gloo:

    python docs/repro/torch_fsdp_tp_hang.py [SECONDS]   # exit 1: ranks stuck SECONDS (default 60) in full_tensor(),
                                                        # their stacks on stderr; exit 0: it returned (torch fixed it)
"""

import faulthandler
import multiprocessing as mp
import os
import sys
import tempfile
import time


def rank(r, store, seconds, ready):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=r, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(distribute_tensor(torch.ones(1, 1), mesh["tp"], [Shard(1)]))
    fully_shard(model, mesh=mesh["dp"])
    print(f"rank {r}: local shard {tuple(model.w.to_local().shape)} under {model.w.placements}", flush=True)
    dist.barrier()
    ready.put(r)
    faulthandler.dump_traceback_later(seconds)  # a stuck rank prints its stack
    model.w.full_tensor()
    dist.barrier()  # ranks whose all-gather returned wait here for the others
    print(f"rank {r}: full_tensor() returned", flush=True)
    faulthandler.cancel_dump_traceback_later()
    dist.destroy_process_group()


def main(seconds, folder):
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    store = os.path.join(folder, "store")
    procs = [ctx.Process(target=rank, args=(r, store, seconds, ready), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)  # every rank built its shard (importing torch may take a while)
    deadline = time.monotonic() + seconds + 10  # the stacks come at `seconds`
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    for p in procs:
        p.join()
    print(f"stuck after {seconds:g} s: ranks {stuck}" if stuck else "no hang: full_tensor() returned on every rank")
    return 1 if stuck else 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        code = main(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0, folder)
    sys.exit(code)
