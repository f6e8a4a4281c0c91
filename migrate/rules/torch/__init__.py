"""PyTorch: its vocabulary and its conversion rules, in the order the engine runs them.

Order matters only for reading the converted file and the report (every rule reads the original
tree; see ``dpmigrate.codemod.plan``): init -> device -> model -> optimizer -> data -> saving,
printing, logging -> checks. The rules shared with every framework live in ``rules/common`` and
read this file's :data:`VOCABULARY`. To add a rule: write a module with one ``Rule`` subclass (a
kebab-case ``name`` and a docstring saying what, why, an example and what it leaves alone) and list
it here.
"""

from __future__ import annotations

from ...codemod.vocabulary import COMMON_IMAGE_WRITERS, Vocabulary
from ..common import (
    BatchNormStatistics,
    DownloadMainProcessFirst,
    EvaluationLoader,
    GlobalBatchSize,
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
    TrainingAverages,
    UnregisteredLayers,
    UnsplitDropout,
)
from .device_variable import DeviceVariable
from .distributed_model import DistributedModel
from .distributed_optimizer import DistributedOptimizer
from .distributed_save import DistributedSave
from .manual_batching import ManualBatching
from .rank_device import RankDevice
from .replace_data_parallel import ReplaceDataParallel
from .same_random_inputs import SameRandomInputs
from .shard_training_loader import ShardTrainingLoader

_DISTRIBUTED = "torch.distributed"
# torchvision.models built of BatchNorm2d layers (not AlexNet, the plain VGGs, SqueezeNet, the ViTs, ConvNeXt)
_BATCHNORM_MODELS = (
    *(f"resnet{d}" for d in (18, 34, 50, 101, 152)), "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d",
    "wide_resnet50_2", "wide_resnet101_2", *(f"vgg{d}_bn" for d in (11, 13, 16, 19)),
    *(f"densenet{d}" for d in (121, 161, 169, 201)), "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
    *(f"efficientnet_b{d}" for d in range(8)), "efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l",
    "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "inception_v3",
    "googlenet", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "ResNet", "DenseNet", "MobileNetV2",
    "MobileNetV3", "EfficientNet", "Inception3", "GoogLeNet",
    *(f"regnet_{k}_{v}" for k in ("x", "y") for v in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf")),
)

VOCABULARY = Vocabulary(
    framework="torch",
    display_name="PyTorch",
    runtime_module="dpmigrate.runtime.torch",
    default_generation="eager",
    distributed_prefixes=(
        _DISTRIBUTED,
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.utils.data.DistributedSampler",
        "torch.utils.data.distributed.DistributedSampler",
    ),
    distributed_description="torch.distributed / DistributedDataParallel / DistributedSampler",
    multiprocessing_prefixes=tuple(  # what starts processes, not e.g. set_sharing_strategy
        f"torch.multiprocessing.{n}" for n in ("Process", "spawn", "start_processes", "Pool", "get_context")
    ),
    multiprocessing_methods=("share_memory",),  # Hogwild's shared model
    multiprocessing_description="torch.multiprocessing (Hogwild-style training)",
    backward_methods=("backward",),
    optimizer_step_methods=("step",),
    data_loaders=frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}),
    optimizer_prefix="torch.optim.",
    not_optimizer_prefixes=("torch.optim.lr_scheduler", "torch.optim.swa_utils", "torch.optim.Optimizer"),
    parameter_methods=("parameters", "named_parameters"),
    closure_optimizers=frozenset({"torch.optim.LBFGS", "torch.optim.lbfgs.LBFGS"}),
    plateau_schedulers=frozenset({"torch.optim.lr_scheduler.ReduceLROnPlateau"}),
    random_draws=frozenset({"torch.randn", "torch.rand", "torch.randint", "torch.randn_like", "torch.rand_like",
                            "torch.normal", "torch.randperm", "torch.bernoulli", "torch.multinomial",
                            "torch.utils.data.random_split", "torch.utils.data.dataset.random_split"}),
    random_seeds=frozenset({"torch.manual_seed", "torch.random.manual_seed"}),
    random_seeds_all=frozenset({"lightning.seed_everything", "lightning.pytorch.seed_everything",
                                "pytorch_lightning.seed_everything", "lightning.fabric.seed_everything",
                                "transformers.set_seed", "accelerate.utils.set_seed"}),
    tensor_packages=("torch",),
    batchnorm_classes=frozenset({*(f"torch.nn.{n}" for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d",
                                                             "LazyBatchNorm2d", "LazyBatchNorm3d")),
                                 *(f"torch.nn.modules.batchnorm.{n}" for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"))}),
    batchnorm_models=frozenset(f"torchvision.models.{n}" for n in _BATCHNORM_MODELS),
    reducer_waits_for_every_gradient=True,
    sync_batchnorm="strategy",
    object_prefixes=("torch.nn", "torch.utils", "torch.optim", "torch.distributions", "torchvision.datasets",
                     "torchvision.models"),
    save_calls=frozenset({"torch.save"}),
    image_writers=frozenset({"torchvision.utils.save_image", *COMMON_IMAGE_WRITERS}),
    dropout_calls=frozenset({*(f"torch.nn.{n}" for n in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                                                          "FeatureAlphaDropout")),
                             *(f"torch.nn.functional.{n}" for n in ("dropout", "dropout1d", "dropout2d", "dropout3d",
                                                                    "alpha_dropout", "feature_alpha_dropout"))}),
    dropout_layer_prefixes=("torch.nn.",),
    dropout_models=frozenset(f"torchvision.models.{n}" for n in (
        "vgg11", "vgg13", "vgg16", "vgg19", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn", "alexnet", "mobilenet_v2",
        "mobilenet_v3_small", "mobilenet_v3_large", "googlenet", "inception_v3", "squeezenet1_0", "squeezenet1_1",
        *(f"efficientnet_b{i}" for i in range(8)))),
    seed_call="torch.manual_seed",
    download_prefixes=(
        "torch.hub.load_state_dict_from_url", "torch.hub.download_url_to_file", "torch.hub.load",
        "torch.utils.model_zoo.load_url", "torchvision.datasets.utils.download_url",
        "torchvision.datasets.utils.download_and_extract_archive", "torchtext.datasets.",
    ),
    pretrained_prefixes=("torchvision.models.", "timm.create_model", "transformers."),
    rank_calls=frozenset({f"{_DISTRIBUTED}.get_rank", f"{_DISTRIBUTED}.get_node_local_rank"}),
    collectives=frozenset({
        *(f"{_DISTRIBUTED}.{n}" for n in (
            "all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "gather",
            "gather_object", "scatter", "scatter_object_list", "broadcast", "broadcast_object_list", "barrier",
            "monitored_barrier", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
            "new_group",
        )),
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }),
    collective_aliases=((f"{_DISTRIBUTED}.", "dist."),),
)

RULES = (
    InitRuntime,
    RankDevice,
    DeviceVariable,
    ReplaceDataParallel,
    DistributedModel,
    DistributedOptimizer,
    ShardTrainingLoader,
    EvaluationLoader,
    TrainingAverages,
    GlobalBatchSize,
    BatchNormStatistics,
    UnregisteredLayers,
    ManualBatching,
    SummedLoss,  # (after the rules that shard hand-cut batches: it asks whether they did)
    SameRandomInputs,
    SharedRandomData,
    DownloadMainProcessFirst,
    DistributedSave,
    MainProcessPrint,
    MainProcessLogging,
    MainProcessOutput,
    SharedFolders,
    LocalStop,
    PlateauMetric,
    RankDivergence,
    UnsplitDropout,  # (last: it reads whether any rule split the data)
)
