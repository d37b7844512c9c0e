"""Two torchrun agents on this host, as two nodes of one world: the multi-node command of docs/TESTING.md.

Each agent is ``python -m torch.distributed.run --nnodes=2 --nproc-per-node=2 --node-rank=R`` with a
c10d rendezvous on 127.0.0.1 (node 0 hosts the store: ``--rdzv-conf is_host=1``; node 1 joins it;
``--local-addr=127.0.0.1`` keeps the workers' own rendezvous on loopback too), each running
``distcheck check --launcher torchrun --only distributed``: a gloo world of 4 ranks, 2 per agent.
One test checks rank 0's table and both exit codes; the other kills one agent mid-run, as a node
lost, and expects both agents to exit non-zero within the timeout, leaving no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distcheck.runners.procfs import children, proc_start_time, proc_stat

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 150  # each agent's run: about 50 s on 2 loaded cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open (0 where /proc cannot say)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    count = 0
    for fd in fds:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


class Agents:
    """The two agents of one launch: their processes, output files, and every process they started."""

    def __init__(self, tmp_path: Path, *args: str):
        port = _free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.procs: list[subprocess.Popen] = []
        self.out: list[Path] = []
        self.err: list[Path] = []
        self.seen: dict[int, str | None] = {}  # pid -> start time, of every descendant seen
        for node in (0, 1):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                   f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-id=distcheck-two-nodes", f"--rdzv-conf=is_host={int(node == 0)},join_timeout=90",
                   "--local-addr=127.0.0.1", "--max-restarts=0",
                   "-m", "distcheck", "check", "--launcher", "torchrun", "--only", "distributed", *args]
            self.out.append(tmp_path / f"agent{node}.out")
            self.err.append(tmp_path / f"agent{node}.err")
            with open(self.out[-1], "w") as out, open(self.err[-1], "w") as err:
                # a session of its own: its process group is the node's agent (its workers start sessions of theirs)
                self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err,
                                                   start_new_session=True))
            if node == 0:
                time.sleep(1.0)  # the store's host first

    def descendants(self, pid: int) -> list[int]:
        found, todo = [], [pid]
        while todo:
            kids = children(todo.pop())
            found += kids
            todo += kids
        for kid in found:
            self.seen.setdefault(kid, proc_start_time(kid))
        return found

    def workers(self, node: int) -> list[int]:
        """The node's live worker processes (the agent's children)."""
        return [p for p in children(self.procs[node].pid) if proc_stat(p)[:1] not in ([], ["Z"])]

    def wait(self, timeout_s: float) -> list[int | None]:
        """Every agent's exit code, None for one still running after ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and any(p.poll() is None for p in self.procs):
            for p in self.procs:
                self.descendants(p.pid)
            time.sleep(0.5)
        return [p.poll() for p in self.procs]

    def joined(self) -> bool:
        """Whether every worker of both nodes has joined the gloo world: each holds a socket to the store and
        one to each of its 3 peers (before ``init_process_group`` it holds none)."""
        workers = self.workers(0) + self.workers(1)
        return len(workers) == 4 and all(_sockets(pid) >= 4 for pid in workers)

    def kill_node(self, node: int) -> None:
        """SIGKILL the node: the agent's process group and each of its workers' (a node lost)."""
        groups = {self.procs[node].pid, *self.descendants(self.procs[node].pid)}
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def alive(self) -> list[int]:
        """Descendants seen during the run that are still running (not the same pid reused, not a zombie)."""
        return [pid for pid, start in self.seen.items()
                if proc_start_time(pid) == start and proc_stat(pid)[:1] not in ([], ["Z"])]

    def output(self, node: int) -> str:
        return self.out[node].read_text()

    def log(self) -> str:
        return "".join(f"\n--- agent {n} stdout:\n{self.out[n].read_text()[-2000:]}\n--- agent {n} stderr:\n"
                       f"{self.err[n].read_text()[-3000:]}" for n in (0, 1))

    def close(self) -> None:
        for node in (0, 1):
            if self.procs[node].poll() is None:
                self.kill_node(node)
            self.procs[node].wait()
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def agents(tmp_path):
    started: list[Agents] = []

    def launch(*args: str) -> Agents:
        started.append(Agents(tmp_path, *args))
        return started[-1]

    yield launch
    for a in started:
        a.close()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.nodes
@pytest.mark.timeout(300)
def test_two_torchrun_agents_run_one_world_and_rank_0_prints_the_table(agents):
    run = agents("--format", "json", "--timeout", "90")
    codes = run.wait(DEADLINE_S)
    assert codes == [0, 0], f"exit codes {codes}" + run.log()
    # rank 0 alone prints: one agent's stdout is exactly one report, the other's is empty. Rank 0 is on node 0
    # as a rule (the c10d rendezvous ranks the agents by address, then pid), but nothing here depends on it
    printed = [node for node in (0, 1) if run.output(node)]
    assert len(printed) == 1, run.log()
    rows = json.loads(run.output(printed[0]))
    assert rows and {(r["backend"], r["world_size"]) for r in rows} == {("gloo", 4)}  # one world over both nodes
    verdicts = {r["check"]: r["verdict"] for r in rows}
    for name in ("ddp.equal_shards.grads", "ddp.unequal_shards.plain.full_batch", "ddp.unequal_shards.hook.grads",
                 "ddp.unequal_shards.loss_scale.grads"):
        assert verdicts.get(name) == "pass", (name, verdicts)
    assert set(verdicts.values()) == {"pass"}, verdicts
    assert run.alive() == []


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.nodes
@pytest.mark.timeout(300)
def test_a_node_killed_mid_run_fails_both_agents_and_leaves_no_process(agents):
    run = agents("--timeout", "30")
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end and not run.joined():  # the rendezvous, then the gloo world of 4 ranks
        assert run.procs[0].poll() is None and run.procs[1].poll() is None, "an agent exited early" + run.log()
        for node in (0, 1):
            run.descendants(run.procs[node].pid)
        time.sleep(0.2)
    assert run.joined(), "the workers did not join one world" + run.log()
    time.sleep(2.0)  # the world runs its first properties (about 25 s of them on 2 cores)
    for node in (0, 1):
        run.descendants(run.procs[node].pid)
    assert run.procs[0].poll() is None, "node 0 finished before node 1 was killed" + run.log()
    run.kill_node(1)
    codes = run.wait(DEADLINE_S)
    assert codes[1] == -signal.SIGKILL
    assert codes[0] is not None, "node 0 still runs after node 1 was lost" + run.log()
    assert codes[0] != 0, "node 0 exited 0 after losing node 1" + run.log()
    deadline = time.monotonic() + 30  # the agent sends its workers SIGTERM, then SIGKILL
    while run.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert run.alive() == [], f"processes left behind: {run.alive()}" + run.log()
    assert len(run.seen) >= 4  # both agents' workers were seen, and are gone
