"""Where a Paddle dygraph job's ranks' random streams part, for :class:`common.TrainingDraws`.

Why here: one hook, the first pass over a sharded training loader (``_paddle_data._TrainingLoader``, before its
workers start): only where the ranks read different samples may their draws differ (see ``_torch_draws``). Not
covered: ``paddle.Model.fit``, whose own loader shards a Dataset inside hapi: its draws stay alike on every rank, as
before.
Paddle's generator is reseeded from its seed and the rank (its state has no portable bytes), so a seeded job draws
alike from launch to launch. A static-graph program draws inside its ops, seeded by the program: left alone.
"""

from __future__ import annotations

import paddle

from . import common

_draws = common.TrainingDraws()


def training_started() -> None:
    """Part the ranks' generators now, if this is the first sign of training in a launched dygraph job."""
    if _draws.parted or not paddle.in_dynamic_mode():
        return
    world_size = paddle.distributed.get_world_size()
    if world_size > 1:
        _draws.start(paddle.distributed.get_rank(), world_size, _reseed_paddle)


def _reseed_paddle(rank: int) -> None:
    seed = paddle.get_rng_state()[0].current_seed()
    paddle.seed(common.derived_seed(f"paddle seed {seed}".encode(), rank) >> 1)


def _reset_for_tests() -> None:
    global _draws
    _draws = common.TrainingDraws()
