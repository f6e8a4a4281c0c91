"""PaddlePaddle: its vocabulary and its conversion rules, in the order the engine runs them.

Paddle 2.x/3.x dygraph and the high-level API (``paddle.Model``) are converted by the rules of the
``_DYGRAPH`` block (``generations = ("dygraph",)``), which leave static-graph and legacy ``fluid`` files (the
generation detection reads off :data:`VOCABULARY`'s markers) to the ``_STATIC`` block at the end of this file. Order
matters only for reading the converted file and the report (every rule reads the original tree):
init -> device -> model -> optimizer -> data -> saving, printing, logging -> checks. The rules
shared with every framework live in ``rules/common`` and read this file's :data:`VOCABULARY`; the
data-flow decisions shared with torch (evaluation loaders, dataset-wide training averages, the global
batch size) are subclassed from there, limited to dygraph files.
"""

from __future__ import annotations

from ...codemod.vocabulary import COMMON_IMAGE_WRITERS, Vocabulary, matches
from ..common import (
    BatchNormStatistics,
    DownloadMainProcessFirst,
    InitRuntime,
    LocalStop,
    MainProcessLogging,
    MainProcessOutput,
    MainProcessPrint,
    PlateauMetric,
    RankDivergence,
    SharedFolders,
    SharedRandomData,
    SummedLoss,
    UnregisteredLayers,
    UnsplitDropout,
)
from .distributed_model import PaddleDistributedModel
from .distributed_optimizer import PaddleDistributedOptimizer
from .distributed_save import PaddleDistributedSave
from .evaluation_loader import PaddleEvaluationLoader
from .fluid_fleet import FluidFleet
from .global_batch_size import PaddleGlobalBatchSize
from .graph_mode import PaddleGraphMode
from .hand_batches import PaddleHandBatches
from .high_level_api import PaddleHighLevelApi
from .high_level_checks import PaddleHighLevelChecks
from .legacy_parallel import LEGACY_DISTRIBUTED_DESCRIPTION, LEGACY_DISTRIBUTED_PREFIXES, LegacyParallel
from .manual_batching import PaddleManualBatching
from .random_samples import PaddleRandomSamples
from .rank_device import PaddleRankDevice
from .save_condition import PaddleSaveCondition
from .shard_training_loader import PaddleShardTrainingLoader
from .static_device_guard import StaticDeviceGuard
from .static_divergence import StaticRankDivergence
from .static_feed import StaticFeedShard
from .static_loader import StaticBatchDimension, StaticLoaderShard
from .static_local_stop import StaticLocalStop
from .static_optimizer import StaticDistributedOptimizer
from .static_pir import StaticPir
from .static_place import StaticPlace
from .static_save import StaticSave
from .training_averages import PaddleTrainingAverages
from .visualdl import PaddleVisualDL

_DISTRIBUTED = "paddle.distributed"
# paddle.vision.models built of BatchNorm2D layers (Paddle 3.3: resnet.py, mobilenetv*.py, densenet.py,
# inceptionv3.py, shufflenetv2.py; not LeNet, AlexNet, SqueezeNet, GoogLeNet)
_BATCHNORM_MODELS = (
    "ResNet", *(f"resnet{d}" for d in (18, 34, 50, 101, 152)),
    *(f"resnext{v}" for v in ("50_32x4d", "50_64x4d", "101_32x4d", "101_64x4d", "152_32x4d", "152_64x4d")),
    "wide_resnet50_2", "wide_resnet101_2", "MobileNetV1", "mobilenet_v1", "MobileNetV2", "mobilenet_v2",
    "MobileNetV3Small", "MobileNetV3Large", "mobilenet_v3_small", "mobilenet_v3_large",
    "DenseNet", *(f"densenet{d}" for d in (121, 161, 169, 201, 264)), "InceptionV3", "inception_v3",
    "ShuffleNetV2", *(f"shufflenet_v2_{v}" for v in ("x0_25", "x0_33", "x0_5", "x1_0", "x1_5", "x2_0", "swish")),
)
_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "alltoall", "alltoall_single", "broadcast",
    "broadcast_object_list", "barrier", "reduce", "reduce_scatter", "scatter", "scatter_object_list", "gather",
    "send", "recv", "isend", "irecv", "new_group", "wait",
)
# the datasets that fetch their files when built (their ``download`` defaults to True)
_DOWNLOADING_DATASETS = (
    *(f"paddle.vision.datasets.{n}" for n in ("MNIST", "FashionMNIST", "Cifar10", "Cifar100", "Flowers", "VOC2012")),
    *(f"paddle.text.datasets.{n}" for n in (
        "Conll05st", "Imdb", "Imikolov", "Movielens", "UCIHousing", "WMT14", "WMT16")),
    *(f"paddle.text.{n}" for n in ("Conll05st", "Imdb", "Imikolov", "Movielens", "UCIHousing", "WMT14", "WMT16")),
)

# what builds or runs a static graph under paddle.static: a file is static when it builds a program, not when it
# names a configuration class of the static module (InputSpec, which dygraph scripts give to paddle.jit.save, and
# BuildStrategy / ExecutionStrategy, which they give to paddle.jit.to_static), nor when it calls the run-time
# switch paddle.enable_static() (often under an option, in dygraph scripts: see graph_mode.py)
_STATIC_GRAPH = (
    "data", "Program", "program_guard", "Executor", "default_main_program", "default_startup_program", "nn",
    "save", "load", "save_inference_model", "load_inference_model", "CompiledProgram",
    "ParallelExecutor", "append_backward", "gradients", "global_scope", "scope_guard",
    "cpu_places", "cuda_places", "create_global_var", "create_parameter", "Variable", "name_scope", "py_func",
    "accuracy", "auc", "set_program_state", "load_program_state", "serialize_program", "deserialize_program",
    "normalize_program", "amp", "device_guard", "ipu_shard_guard", "Print",
)

_SWITCHES = ("paddle.enable_static", "paddle.framework.enable_static")


class _PaddleVocabulary(Vocabulary):
    """Paddle's vocabulary; one combination of markers decides beyond the first-match order.

    ``paddle.enable_static()`` is not a marker (a dygraph script may call it under an option: ``graph_mode.py``),
    but a file that calls it and builds its program with ``paddle.fluid`` pieces is a Paddle 2.x static-graph
    script (fluid 1.x had no such switch), converted onto the runtime like any static one.
    """

    def generation(self, qualified: set[str]) -> str:
        found = super().generation(qualified)
        if found == "fluid" and any(matches(name, _SWITCHES) for name in qualified):
            return "static"
        return found


# paddle.vision.models whose classifier drops out (Paddle 3.3: vgg.py, alexnet.py, mobilenetv2/v3.py, googlenet.py,
# inceptionv3.py, squeezenet.py)
_DROPOUT_MODELS = ("vgg11", "vgg13", "vgg16", "vgg19", "VGG", "alexnet", "AlexNet", "mobilenet_v2", "MobileNetV2",
                   "mobilenet_v3_small", "mobilenet_v3_large", "MobileNetV3Small", "MobileNetV3Large", "googlenet",
                   "GoogLeNet", "inception_v3", "InceptionV3", "squeezenet1_0", "squeezenet1_1", "SqueezeNet")

VOCABULARY = _PaddleVocabulary(
    framework="paddle",
    display_name="PaddlePaddle",
    runtime_module="dpmigrate.runtime.paddle",
    default_generation="dygraph",
    # paddle.static exists from Paddle 2.0 on: a file building its program with it is Paddle 2.x static graph
    # (converted onto the runtime) even when it also uses paddle.fluid pieces; fluid alone means fluid 1.x
    generations=(
        *((f"paddle.static.{name}", "static") for name in _STATIC_GRAPH),
        ("paddle.fluid", "fluid"),
    ),
    legacy_generations=("fluid",),
    distributed_prefixes=(
        f"{_DISTRIBUTED}.fleet", f"{_DISTRIBUTED}.init_parallel_env", f"{_DISTRIBUTED}.ParallelEnv",
        f"{_DISTRIBUTED}.parallel", f"{_DISTRIBUTED}.get_rank", f"{_DISTRIBUTED}.get_world_size",
        *(f"{_DISTRIBUTED}.{n}" for n in _COLLECTIVES),
        "paddle.DataParallel", "paddle.io.DistributedBatchSampler", *LEGACY_DISTRIBUTED_PREFIXES,
    ),
    distributed_description="paddle.distributed (fleet, init_parallel_env, collectives) / paddle.DataParallel / "
    f"DistributedBatchSampler / {LEGACY_DISTRIBUTED_DESCRIPTION}",
    multiprocessing_prefixes=(f"{_DISTRIBUTED}.spawn",),
    image_writers=COMMON_IMAGE_WRITERS,  # a GAN's sample grid (cv2.imwrite) written by every rank otherwise: round Q
    dropout_calls=frozenset({*(f"paddle.nn.{n}" for n in ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout",
                                                           "FeatureAlphaDropout")),
                             *(f"paddle.nn.functional.{n}" for n in ("dropout", "dropout2d", "dropout3d", "alpha_dropout",
                                                                     "feature_alpha_dropout"))}),
    dropout_layer_prefixes=("paddle.nn.",),
    dropout_models=frozenset(f"{m}.{n}" for m in ("paddle.vision.models", "paddle.vision") for n in _DROPOUT_MODELS),
    seed_call="paddle.seed",
    multiprocessing_description="paddle.distributed.spawn",
    # `model.fit(...)` of the high-level API trains as a backward pass does: a script calling it trains
    backward_methods=("backward", "fit", "train_batch"),
    optimizer_step_methods=("step", "minimize"),
    data_loaders=frozenset({"paddle.io.DataLoader", "paddle.io.reader.DataLoader"}),
    optimizer_prefix="paddle.optimizer.",
    not_optimizer_prefixes=("paddle.optimizer.lr", "paddle.optimizer.Optimizer", "paddle.optimizer.optimizer"),
    parameter_methods=("parameters", "named_parameters"),
    plateau_schedulers=frozenset({"paddle.optimizer.lr.ReduceOnPlateau"}),
    closure_optimizers=frozenset({"paddle.optimizer.LBFGS", "paddle.optimizer.lbfgs.LBFGS"}),
    random_draws=frozenset({
        *(f"paddle.{n}" for n in ("randn", "rand", "randint", "randint_like", "uniform", "normal", "standard_normal",
                                   "randperm", "bernoulli", "multinomial", "poisson")),
        *(f"paddle.tensor.random.{n}" for n in ("randn", "rand", "randint", "uniform", "normal", "randperm")),
        "paddle.io.random_split", "paddle.io.dataloader.dataset.random_split",
    }),
    random_seeds=frozenset({"paddle.seed", "paddle.framework.seed", "paddle.framework.random.seed"}),
    tensor_packages=("paddle",),
    batchnorm_classes=frozenset(f"{m}.{n}" for m in ("paddle.nn", "paddle.nn.layer.norm")
                                for n in ("BatchNorm", "BatchNorm1D", "BatchNorm2D", "BatchNorm3D")),
    batchnorm_models=frozenset(f"{m}.{n}" for m in ("paddle.vision.models", "paddle.vision") for n in _BATCHNORM_MODELS),
    batchnorm_models_with=tuple((f"{m}.{n}", "batch_norm") for m in ("paddle.vision.models", "paddle.vision")
                                for n in ("VGG", "vgg11", "vgg13", "vgg16", "vgg19")),
    reducer_waits_for_every_gradient=True,
    sync_batchnorm="strategy",  # dp.Strategy(sync_batchnorm=True): SyncBatchNorm.convert_sync_batchnorm on GPUs
    self_distributing_models=frozenset({"paddle.Model", "paddle.hapi.Model", "paddle.hapi.model.Model"}),
    object_prefixes=("paddle.nn", "paddle.io", "paddle.optimizer", "paddle.Model", "paddle.hapi", "paddle.vision",
                     "paddle.text", "paddle.metric", "paddle.static"),
    save_calls=frozenset({"paddle.save", "paddle.framework.save", "paddle.framework.io.save"}),
    download_prefixes=(
        "paddle.utils.download.", "paddle.hub.load", "paddle.hub.download", *_DOWNLOADING_DATASETS,
    ),
    pretrained_prefixes=("paddle.vision.models.", "paddlenlp.transformers."),
    rank_calls=frozenset({
        f"{_DISTRIBUTED}.get_rank", f"{_DISTRIBUTED}.fleet.worker_index", f"{_DISTRIBUTED}.fleet.is_first_worker",
        "paddle.fluid.incubate.fleet.collective.fleet.worker_index",
        "paddle.fluid.incubate.fleet.collective.fleet.is_first_worker",
    }),
    collectives=frozenset({
        *(f"{_DISTRIBUTED}.{n}" for n in _COLLECTIVES),
        "paddle.DataParallel", f"{_DISTRIBUTED}.fleet.distributed_model",
    }),
    collective_aliases=((f"{_DISTRIBUTED}.", "dist."),),
)

_DYGRAPH = (
    InitRuntime,
    PaddleRankDevice,
    PaddleDistributedModel,
    PaddleDistributedOptimizer,
    PaddleShardTrainingLoader,
    PaddleHandBatches,
    PaddleManualBatching,
    PaddleEvaluationLoader,
    PaddleTrainingAverages,
    PaddleGlobalBatchSize,
    SummedLoss,
    BatchNormStatistics,
    UnregisteredLayers,
    PaddleHighLevelApi,
    PaddleHighLevelChecks,
    DownloadMainProcessFirst,
    SharedRandomData,
    PaddleRandomSamples,
    PaddleDistributedSave,
    PaddleSaveCondition,
    PlateauMetric,
)

_CHECKS = (
    PaddleGraphMode,
    MainProcessPrint,
    MainProcessLogging,
    MainProcessOutput,
    PaddleVisualDL,
    SharedFolders,
    LocalStop,
    RankDivergence,
    UnsplitDropout,  # (last of the dygraph ones: it reads whether any rule split the data)
)

# Paddle 2.x/3.x static graph (paddle.enable_static, Executor, minimize), legacy fluid 1.x (the seed's Fleet
# conversion; its files are of the legacy "fluid" generation, which only rules naming it convert, since the
# runtime cannot run where fluid does) and the retired multi-card APIs (reported, never rewritten).
_STATIC = (
    StaticPlace, StaticDistributedOptimizer, StaticLoaderShard, StaticFeedShard, StaticBatchDimension, StaticSave,
    StaticPir, FluidFleet, LegacyParallel, StaticRankDivergence, StaticLocalStop, StaticDeviceGuard,
)

RULES = (*_DYGRAPH, *_CHECKS, *_STATIC)
