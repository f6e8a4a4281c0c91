"""Rules that are one idea in every framework, parametrized by the framework's vocabulary.

Printing, logging and other output from the main process only, downloads on the main process
first, ``dp.init()`` at the entry point, the rank-divergence check, and the data-flow decisions of
frameworks whose training loops iterate loaders (evaluation loaders, dataset-wide training averages, the
``--batch global`` batch size), which Paddle's rules narrow to its dygraph files. A framework's rule package
lists the ones it runs, in its own order, beside its own rules.
"""

from .batch_norm import BatchNormStatistics
from .download_main_process_first import DownloadMainProcessFirst
from .evaluation_loader import EvaluationLoader
from .global_batch_size import GlobalBatchSize
from .init_runtime import InitRuntime
from .local_stop import LocalStop
from .main_process_logging import MainProcessLogging
from .main_process_output import MainProcessOutput
from .main_process_print import MainProcessPrint
from .plateau_metric import PlateauMetric
from .rank_divergence import RankDivergence
from .shared_folders import SharedFolders
from .shared_random_data import SharedRandomData
from .summed_loss import SummedLoss
from .training_averages import TrainingAverages
from .unregistered_layers import UnregisteredLayers
from .unsplit_dropout import UnsplitDropout

__all__ = [
    "BatchNormStatistics", "DownloadMainProcessFirst", "EvaluationLoader", "GlobalBatchSize", "InitRuntime",
    "LocalStop", "MainProcessLogging", "MainProcessOutput", "MainProcessPrint", "PlateauMetric", "RankDivergence",
    "SharedFolders", "SharedRandomData", "SummedLoss", "TrainingAverages", "UnregisteredLayers", "UnsplitDropout",
]
