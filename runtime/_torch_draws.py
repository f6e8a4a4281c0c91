"""Where a torch job's ranks' random streams part, for :class:`common.TrainingDraws`.

Why here: one hook, the first pass over a sharded training loader (``_torch_data._TrainingLoader.__iter__``). Only
there do the ranks read different samples, so only there can N ranks stand for one process drawing N times as
much: a loop that splits no data (hand-cut batches every rank reads whole, a dropout over the same samples) must
keep drawing alike, or each rank's step differs from the original's (issue 31's branch first parted at a wrapped
model's forward and a wrapped optimizer's step too, and the dropout fix that seeds every rank alike broke). The
hook runs before ``super().__iter__()``, where the iterator draws its workers' base seed from torch's generator,
so worker augmentation differs per rank too. The rank comes from the process group, so a module that joined none
(not launched) never parts anything.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import common

_draws = common.TrainingDraws()


def training_started() -> None:
    """Part the ranks' generators now, if this is the first sign of training in a launched job."""
    if _draws.parted or not dist.is_available() or not dist.is_initialized():
        return
    _draws.start(dist.get_rank(), dist.get_world_size(), _reseed_torch)


def _reseed_torch(rank: int) -> None:
    torch.manual_seed(common.derived_seed(torch.get_rng_state().numpy().tobytes(), rank))  # (and every CUDA device)


def _reset_for_tests() -> None:
    global _draws
    _draws = common.TrainingDraws()
