"""A rank SIGKILLed under torchrun names its node ``gone``, on real parts (issue 44): two
``torchrun`` "nodes" of two gloo ranks each on loopback (``--nnodes 2 --node-rank N``,
``--max-restarts 1``), the user-style script of docs/actions.md "Healing"
(tests/e2e/heal_train.py) with its real client posting to its own node's sidecar (real
``monitor-agent serve`` subprocesses: node 0's leads, node 1's forwards), one
Slack-protocol receiver. On the job's first launch rank 2 (node 1) SIGKILLs itself at step
12: no end record. Its peers' collectives lose it; torchrun relaunches the job, which
resumes from its newest save and completes. The leader names gpu-node-1 ``gone`` on its
API, and the page that tells the crash names rank 2 on gpu-node-1; the ranks that lost it
are victims, not the cause.

The agents watch their workers every 20 s (``--monitor-interval``; torchrun's default is
0.1 s), so that every survivor ends with its own words before its agent stops it: a
survivor stopped first is silent too, and silent ranks on two nodes are told apart only by
the address the victims' errors name, which on one loopback host every node shares. There
nobody is named (runs/attempt_end.py; tests/runs/test_attempt_end.py has those cases)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import test_multi_node
from tests.e2e.test_multi_node import TOKEN, Pair, get, text
from tests.eventually import eventually
from tests.sidecar_process import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
SCRIPT = Path(__file__).resolve().parent / "heal_train.py"
RUN = "gone-e2e"
pair = test_multi_node.pair  # the two nodes' sidecars (a module fixture)


@contextlib.contextmanager
def _job(pair: Pair, out: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    port, procs = free_port(), []
    out.mkdir()
    for node, sc in enumerate(pair.sidecars):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NODE_NAME": f"gpu-node-{node}",
               "MONITOR_AGENT_TOKEN": TOKEN, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
               "MONITOR_AGENT_SPOOL_DIR": str(out / f"spool-node{node}"),
               "PYTHONPATH": os.pathsep.join([str(REPO / "client"), str(REPO)])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "2", "--node-rank", str(node), "--max-restarts", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", RUN, "--monitor-interval", "20", str(SCRIPT), "--url", sc.url,
               "--run-id", RUN, "--out", str(out), "--steps", "30", "--ckpt-every", "5",
               "--fault", "kill", "--fault-rank", "2", "--fault-step", "12"]
        with (out / f"node{node}.log").open("wb") as log:
            procs.append(subprocess.Popen(cmd, env=env, cwd=out, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_a_rank_killed_under_torchrun_names_its_node_gone(pair: Pair, tmp_path):
    out = tmp_path / "job"
    with _job(pair, out) as procs:
        codes = [p.wait(300) for p in procs]
        logs = "\n".join((out / f"node{n}.log").read_text(errors="replace")[-4000:]
                         for n in (0, 1))
        assert codes == [0, 0], logs
        assert "exitcode: -9" in logs, logs  # rank 2 was killed, torchrun saw it

    def named() -> list[dict]:
        nodes = get(pair.leader, f"/v1/runs/{RUN}/nodes")["nodes"]
        assert nodes[1]["cause"] == "gone", nodes
        return nodes
    nodes = eventually(named, timeout=60, what="gpu-node-1 judged gone")
    assert [(v["node"], v["state"]) for v in nodes][0] == ("gpu-node-0", "healthy"), nodes
    assert nodes[1]["node"] == "gpu-node-1" and nodes[1]["state"] in ("suspect", "sick")
    assert "died without a word in attempt 1" in nodes[1]["words"], nodes

    said = eventually(lambda: [text(r) for r in pair.messages(RUN)
                               if "ended without a word" in text(r)] or None,
                      timeout=60, what="the page naming the dead rank")
    assert "on gpu-node-1 ended without a word" in said[0], said
    assert "rank 2" in said[0] or "ranks 2-3" in said[0], said
    victims = [text(r) for r in pair.messages(RUN) if "lost a peer" in text(r)]
    assert victims and all("not the cause" in v for v in victims), victims
