"""Training on several machines: the run directory they write (`check_run_directory`), and a machine that stops
(`lost_peer`: the others stop with one line instead of a gloo traceback, and --resume continues the run).

Planning the machines is `strategies/launch.py`'s, starting them `relaunch.py`'s; full fine-tuning's weights
written on each machine is `patches/transformers_5.py`'s. Imports no torch at module level.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hftoolkit.base.errors import UserError
from hftoolkit.training.strategies.launch import LaunchPlan, this_process


def check_run_directory(run_dir: Path, each_node: bool, launch: LaunchPlan) -> None:
    """On several machines, refuse a run directory that they would write wrongly: one that a machine cannot see
    (machine 0 writes the run and commits its checkpoints alone, so --resume elsewhere would find nothing), or,
    with training.save_on_each_node, one that machines share (each would write the same files into it). Each
    machine writing its own copy is for machines without a shared file system.

    Machine 0 makes a file of a random name in its run directory; every process says whether it sees it there.
    A collective call: every process raises alike, so none is left waiting for one that stopped.
    """
    if launch.num_machines == 1:
        return
    import uuid

    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, gather_object

    state = PartialState()
    name = broadcast_object_list([f".machines-check-{uuid.uuid4().hex}"])[0]  # machine 0's name, everywhere
    probe = Path(run_dir) / name
    if state.is_main_process:
        probe.touch()
    state.wait_for_everyone()
    seen = gather_object([(this_process().machine, probe.exists())])
    state.wait_for_everyone()
    if state.is_main_process:
        probe.unlink(missing_ok=True)  # (a machine that shares the folder may have removed it, refusing it)
    blind = sorted({machine for machine, sees in seen if not sees})
    sharing = sorted({machine for machine, sees in seen if sees and machine != 0})
    if blind and not each_node:
        raise UserError(f"--output: machine {', '.join(map(str, blind))} cannot see the run directory {run_dir} that "
                        "machine 0 writes, so its checkpoints would never be committed and --resume there would "
                        "find no run: put it on a file system all machines share, or set "
                        "training.save_on_each_node: true (one copy per machine)")
    if sharing and each_node:
        raise UserError(f"training.save_on_each_node: machine {', '.join(map(str, sharing))} shares the run directory "
                        f"{run_dir} with machine 0, and each machine would write the same files into it: give each "
                        "machine its own --output, or set training.save_on_each_node: false")


# What gloo and NCCL say when a peer's connection ends: the process behind it is gone (killed, its machine lost).
LOST_PEER = ("connection closed by peer", "connection reset by peer", "broken pipe", "nccl communicator was aborted")


def lost_peer(err: BaseException, launch: LaunchPlan) -> UserError | None:
    """The one-line error for a collective call that failed because another process of the run ended, or None
    for any other error. Every process still running gets it and stops, instead of waiting for the lost one."""
    if "torch" not in sys.modules or not isinstance(err, RuntimeError):
        return None
    import torch.distributed as dist

    said = (str(err).strip() or type(err).__name__).splitlines()[0]
    if not (isinstance(err, dist.DistNetworkError) or any(m in said.lower() for m in LOST_PEER)):
        return None
    said = re.sub(r"^\[[^\]]*\]\s*", "", said).split(". ")[0]  # gloo's first sentence, without its source line
    here = this_process()
    where = f"machine {here.machine}, " if launch.num_machines > 1 else ""
    lost = UserError(f"training stopped ({where}process {here.rank}): another process of the run "
                     f"ended, so this one cannot go on ({said}): see why in that process's output, then run the same "
                     "command with --resume on every machine")
    lost.consequence = True
    return lost
