"""PaddlePaddle: the vocabulary only, so far (no rules yet: files are detected and left alone).

Detection uses it to say which API generation a file is written in.
"""

from __future__ import annotations

from ...codemod.vocabulary import Vocabulary

VOCABULARY = Vocabulary(
    framework="paddle",
    display_name="PaddlePaddle",
    runtime_module="dpmigrate.runtime.paddle",
    default_generation="dygraph",
    generations=(
        ("paddle.fluid", "fluid"),
        ("paddle.static", "static"),
        ("paddle.enable_static", "static"),
    ),
)

RULES = ()

# --- static graph and fluid (paddle-static) -------------------------------------------------------
# Paddle 2.x/3.x static graph (paddle.enable_static, Executor, minimize), legacy fluid 1.x (the seed's
# Fleet conversion: its files are of the legacy "fluid" generation, which only rules naming it convert,
# since the runtime cannot run where fluid does), and the retired multi-card APIs (reported). The common
# rules are added only where the rules above do not list them already.
import dataclasses as _dataclasses  # noqa: E402 - this block stays apart from the dygraph rules above

from ..common import (  # noqa: E402
    DownloadMainProcessFirst,
    InitRuntime,
    LocalStop,
    MainProcessLogging,
    MainProcessOutput,
    MainProcessPrint,
    RankDivergence,
    SharedFolders,
)
from .fluid_fleet import FluidFleet  # noqa: E402
from .legacy_parallel import LEGACY_DISTRIBUTED_DESCRIPTION, LEGACY_DISTRIBUTED_PREFIXES, LegacyParallel  # noqa: E402
from .static_divergence import StaticRankDivergence  # noqa: E402
from .static_feed import StaticFeedShard  # noqa: E402
from .static_optimizer import StaticDistributedOptimizer  # noqa: E402
from .static_pir import StaticPir  # noqa: E402
from .static_place import StaticPlace  # noqa: E402
from .static_save import StaticSave  # noqa: E402

_STATIC_RANK_CALLS = frozenset({
    "paddle.distributed.get_rank", "paddle.distributed.fleet.worker_index", "paddle.distributed.fleet.is_first_worker",
    "paddle.fluid.incubate.fleet.collective.fleet.worker_index",
    "paddle.fluid.incubate.fleet.collective.fleet.is_first_worker",
})
VOCABULARY = _dataclasses.replace(
    VOCABULARY,
    # paddle.enable_static / paddle.static exist from Paddle 2.0 on: a file using them is Paddle 2.x static graph
    # (converted onto the runtime) even when it also uses paddle.fluid pieces; fluid alone means fluid 1.x
    generations=tuple(sorted(VOCABULARY.generations, key=lambda generation: generation[1] == "fluid")),
    legacy_generations=(*VOCABULARY.legacy_generations, *(() if "fluid" in VOCABULARY.legacy_generations else ("fluid",))),
    distributed_prefixes=(*VOCABULARY.distributed_prefixes, *(
        p for p in (*(() if VOCABULARY.distributed_prefixes else ("paddle.distributed", "paddle.DataParallel")),
                    *LEGACY_DISTRIBUTED_PREFIXES) if p not in VOCABULARY.distributed_prefixes)),
    distributed_description=" / ".join(d for d in (
        VOCABULARY.distributed_description or "paddle.distributed / paddle.DataParallel", LEGACY_DISTRIBUTED_DESCRIPTION)),
    backward_methods=VOCABULARY.backward_methods or ("backward",),
    optimizer_step_methods=(*(VOCABULARY.optimizer_step_methods or ("step",)), *(
        () if "minimize" in VOCABULARY.optimizer_step_methods else ("minimize",))),
    rank_calls=VOCABULARY.rank_calls | _STATIC_RANK_CALLS,
)
_COMMON = (
    InitRuntime, DownloadMainProcessFirst, MainProcessPrint, MainProcessLogging, MainProcessOutput, SharedFolders,
    LocalStop, RankDivergence,
)
STATIC_RULES = (
    StaticPlace, StaticDistributedOptimizer, StaticFeedShard, StaticSave, StaticPir, FluidFleet, LegacyParallel,
    StaticRankDivergence,
)
RULES = (*RULES, *(r for r in _COMMON if r not in RULES), *STATIC_RULES)
