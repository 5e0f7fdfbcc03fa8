"""A tiny character-level GPT trained on CPU on the Python standard library's own source,
monitored by ``monitor_client``, with optional injected faults (the README demo uses it).

    python examples/train_gpt.py --url http://127.0.0.1:9400 --steps 300 \
        --inject nan --inject-step 200 --progress

The model, the faults (``--inject nan|lr-spike|frozen-layer|slow-data|leak``) and the loop
are ``monitor_agent/tools/demo_gpt.py``, where ``monitor-agent demo`` finds them from an installed
wheel; this script runs them from a checkout and lends its pieces to ``hf_trainer.py`` and
``lightning_train.py``. Exit status: 0 completed, 1 stopped on NaN, 3 stopped by the monitor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_REPO), str(_REPO / "client")]
import monitor_client  # noqa: E402
from monitor_agent.tools.demo_gpt import VOCAB, CharGPT, load_text, main  # noqa: E402

__all__ = ["VOCAB", "CharGPT", "framework_arguments", "framework_exit_status",
           "framework_settings", "load_text", "main"]


def framework_arguments(doc: str) -> argparse.ArgumentParser:
    """The command line the HF and Lightning examples share (``doc``: the script's
    docstring, whose first paragraph describes it)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:9400")
    p.add_argument("--run-id", default=None)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--inject-nan", type=int, default=0, help="step with an inf activation")
    p.add_argument("--linger", type=float, default=0.5, help="client batching delay (s)")
    p.add_argument("--spool-dir", default=None)
    return p


def framework_settings(args: argparse.Namespace) -> monitor_client.MonitorSettings:
    """The client settings those command lines choose."""
    return monitor_client.MonitorSettings(linger=args.linger, spool_dir=args.spool_dir)


def framework_exit_status(mon: monitor_client.Monitor) -> int:
    """For the HF and Lightning examples, whose callbacks stop the run themselves: print the
    client's counters; exit status 3 when the monitor stopped the run, else 0."""
    print(f"run {mon.run_id}: {mon.counters()}")
    if mon.should_stop():
        print(f"training stopped by the monitor: {mon.stop_reason()}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
