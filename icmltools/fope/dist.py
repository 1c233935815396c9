"""The one place fope-train reads its torchrun (DDP) role: rank, world size, local rank, and whether this
process writes (rank 0 saves checkpoints, evaluates and reports; the other ranks only train).

`process_info()` reads torchrun's environment (stdlib only, so a command can ask before importing torch);
`join(device)` joins the process group when the world is larger than one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from icmltools.core.device import exit_without_finalizing


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes checkpoints, evaluates and reports."""
        return self.rank == 0

    @property
    def writes(self) -> bool:
        """Whether this process may write anything (run folder, checkpoints, stdout)."""
        return self.main


def process_info(environ=None) -> Dist:
    """This process's role from torchrun's RANK / WORLD_SIZE / LOCAL_RANK (a plain run: rank 0 of 1)."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    return Dist(int(env.get("RANK", "0")), world, int(env.get("LOCAL_RANK", "0")))


def join(device: str) -> tuple[Dist, str]:
    """Join the torchrun job when WORLD_SIZE > 1: NCCL on CUDA (one GPU per local rank), gloo on CPU.
    Returns the role and the device this rank uses."""
    info = process_info()
    if info.world <= 1:
        return info, device
    import torch
    import torch.distributed as tdist

    if device.startswith("cuda"):
        device = f"cuda:{info.local_rank}"
        torch.cuda.set_device(info.local_rank)
    if not tdist.is_initialized():
        tdist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    exit_without_finalizing()  # the backend's threads outlive the group: see core.device
    return info, device


def leave(info: Dist) -> None:
    """Wait for every rank, then tear the process group down (no-op for a plain run)."""
    if info.world <= 1:
        return
    import torch.distributed as tdist

    tdist.barrier()
    tdist.destroy_process_group()
