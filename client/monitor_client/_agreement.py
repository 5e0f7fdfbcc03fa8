"""One decision for every rank: act on the same action at the same call, or none does.

The sidecar of node 0 decides a run's actions once for every rank (a rollback plan, a
stop), and each rank learns of it through its own node's sidecar, at its own time. A rank
that reloads a checkpoint, or stops, while another takes its next step leaves the job
hung in the next collective or silently split (metaseq#521). So in a distributed job
(``torch.distributed`` initialised, world size > 1) an action is taken only at *agreed
calls*: every ``check_every``-th call of ``Monitor.rollback_plan()`` or
``Monitor.should_stop()`` (every rank calls them once per step, so the calls line up):

1. one ``all_reduce(MAX)`` of the newest action id each rank holds: the job's newest;
2. a rank that lacks that action asks its sidecar for it once (bounded);
3. one ``all_reduce(MAX)`` of ``[digest, -digest, missing, known]``: every rank acts now
   only if every rank holds the action and every rank's copy has the same content (the
   digest of its id, kind and plan): ids alone are not enough, two sidecars could each
   call different decisions "plan 1"; and, for a rollback plan, only if some rank of the
   job reported its checkpoint (``known``: this process called ``checkpoint_saved`` with
   that step and path; usually rank 0, which saves). A plan naming a checkpoint no rank of
   the job saved is not one to reload, whoever put it in the sidecar's ledger. Otherwise
   no rank acts, all look again at the next agreed call, and the ranks that lacked it (or
   held another content, or found no rank that saved its checkpoint) tell their sidecar
   (an ``agreement`` record), which pages that the action is held back and why.

Nothing diverges and nobody waits on a rank that never comes: a rank that cannot reach its
sidecar costs the job one bounded fetch per agreed call, not a deadlock.

Cost: one all_reduce of one int64 every ``check_every`` calls, plus one of four while an
action is pending. Each ``item()`` is a host sync, which is why it is not every step.

The digest of a plan is the same wherever it is computed::

    >>> a = {"id": 2, "action": "rollback", "plan": {"checkpoint_step": 300, "skip_to": 420}}
    >>> content_digest(a) == content_digest({**a, "message": "reworded when honoured"})
    True
    >>> content_digest(a) == content_digest({**a, "plan": {"checkpoint_step": 290,
    ...                                                     "skip_to": 420}})
    False
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any


def content_digest(action: dict[str, Any]) -> int:
    """A positive 62-bit digest of what an action asks (id, kind, plan): not its wording,
    nor whether it was honoured yet, which change after the decision."""
    canon = json.dumps([action.get("id"), action.get("action"), action.get("plan")],
                       sort_keys=True, separators=(",", ":"), default=str)
    return int.from_bytes(hashlib.sha256(canon.encode()).digest()[:8], "big") >> 2 or 1


@dataclass(frozen=True)
class Consensus:
    """What an agreed call decided: ``act``, or why not (``missing``: some rank lacks the
    action; ``mismatch``: ranks hold different contents under the same id; ``unreported``:
    no rank reported the checkpoint a rollback plan names)."""

    act: bool
    action_id: int = 0
    why: str = ""


def distributed() -> Any:
    """torch.distributed when a multi-process group is up (only if torch is imported)."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


def newest(dist: Any, action_id: int) -> int:
    """The largest action id any rank holds (0: none)."""
    return _all_reduce_max(dist, [action_id])[0]


def any_rank(dist: Any, *flags: bool) -> list[bool]:
    """For each flag, whether any rank raised it: one collective, so every rank decides
    the same (a loop whose ranks stop at different rounds would leave one waiting)."""
    return [bool(v) for v in _all_reduce_max(dist, [int(f) for f in flags])]


def unanimous(dist: Any, action_id: int, digest: int | None, known: bool = True) -> Consensus:
    """Whether every rank holds action ``action_id`` with the same content (``digest``;
    None: this rank lacks it or may not act on it) and some rank vouches for it (``known``:
    this rank reported the plan's checkpoint)."""
    mine = digest or 0
    top, neg_low, missing, vouched = _all_reduce_max(
        dist, [mine, -mine, 0 if digest else 1, 1 if known else 0])
    if missing:
        return Consensus(False, action_id, "missing")
    if top != -neg_low:
        return Consensus(False, action_id, "mismatch")
    if not vouched:
        return Consensus(False, action_id, "unreported")
    return Consensus(True, action_id)


def _all_reduce_max(dist: Any, values: list[int]) -> list[int]:
    import torch

    # NCCL reduces only device tensors; gloo and the others take host ones.
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]
