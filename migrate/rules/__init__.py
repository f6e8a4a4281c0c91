"""The PyTorch conversion rules, one module each, run in the order :func:`all_rules` gives.

Order matters only for reading the converted file and the report (every rule reads the original
tree; see ``_plan.py``): init -> device -> model -> optimizer -> data -> saving, printing, logging ->
checks. To add a rule: write a module with one ``Rule`` subclass (a kebab-case ``name`` and a
docstring saying what, why, an example and what it leaves alone) and list it here.
"""

from __future__ import annotations

from ._base import Rule
from .distributed_model import DistributedModel
from .distributed_optimizer import DistributedOptimizer
from .distributed_save import DistributedSave
from .download_main_process_first import DownloadMainProcessFirst
from .evaluation_loader import EvaluationLoader
from .global_batch_size import GlobalBatchSize
from .init_runtime import InitRuntime
from .main_process_logging import MainProcessLogging
from .main_process_output import MainProcessOutput
from .main_process_print import MainProcessPrint
from .manual_batching import ManualBatching
from .rank_divergence import RankDivergence
from .rank_device import RankDevice
from .replace_data_parallel import ReplaceDataParallel
from .shard_training_loader import ShardTrainingLoader
from .training_averages import TrainingAverages


def all_rules() -> list[type[Rule]]:
    """Every rule class, in the order the engine runs them."""
    return [
        InitRuntime,
        RankDevice,
        ReplaceDataParallel,
        DistributedModel,
        DistributedOptimizer,
        ShardTrainingLoader,
        EvaluationLoader,
        TrainingAverages,
        GlobalBatchSize,
        ManualBatching,
        DownloadMainProcessFirst,
        DistributedSave,
        MainProcessPrint,
        MainProcessLogging,
        MainProcessOutput,
        RankDivergence,
    ]
