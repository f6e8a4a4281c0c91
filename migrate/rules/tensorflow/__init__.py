"""TensorFlow and Keras: the vocabulary and the conversion rules, in the order the engine runs them.

The target is ``dpmigrate.runtime.tensorflow`` (``MultiWorkerMirroredStrategy``). Keras
``compile``/``fit`` scripts get their models built under ``dp.scope()`` and the batch policy on
``fit``; hand-written ``GradientTape`` loops get averaged gradients and sharded ``tf.data``;
``multi_gpu_model`` (gone since TF 2.4) is replaced by the scope; TF1 graph code is recognised and
reported, the whole file left unchanged (the shared rules below skip it too: a half-converted graph
script would train N whole copies with its prints on the chief). The rules shared with every framework
live in ``rules/common`` and read this file's :data:`VOCABULARY`.
"""

from __future__ import annotations

from ...codemod.vocabulary import COMMON_IMAGE_WRITERS, Vocabulary
from ..common import (
    BatchNormStatistics,
    DownloadMainProcessFirst,
    InitRuntime,
    LocalStop,
    MainProcessLogging,
    MainProcessOutput,
    MainProcessPrint,
    RankDivergence,
    SharedFolders,
    SharedRandomData,
)
from ._keras import KERAS_PACKAGES, TF1_MARKERS
from .chief_writes import ChiefWrites
from .custom_loop import CustomLoop
from .keras_fit import KerasFit
from .keras_rank_divergence import KerasRankDivergence
from .keras_save import KerasSave
from .multi_gpu_model import MultiGpuModel
from .standalone_keras import StandaloneKeras
from .strategy_scope import StrategyScope
from .tf1_graph import Tf1Graph
from .train_step_override import TrainStepOverride

# keras.applications built of BatchNormalization layers (not VGG16/19, nor the ConvNeXts: LayerNormalization)
_BATCHNORM_APPLICATIONS = (
    "ResNet50", "ResNet101", "ResNet152", "ResNet50V2", "ResNet101V2", "ResNet152V2", "MobileNet", "MobileNetV2",
    "MobileNetV3Small", "MobileNetV3Large", *(f"EfficientNetB{d}" for d in range(8)),
    *(f"EfficientNetV2{v}" for v in ("B0", "B1", "B2", "B3", "S", "M", "L")), "DenseNet121", "DenseNet169",
    "DenseNet201", "InceptionV3", "InceptionResNetV2", "Xception", "NASNetMobile", "NASNetLarge",
)

VOCABULARY = Vocabulary(
    framework="tensorflow",
    display_name="TensorFlow",
    runtime_module="dpmigrate.runtime.tensorflow",
    default_generation="tf2",
    generations=(  # first match wins: graph-mode code first (a Session makes multi_gpu_model graph code too)
        *((name, "tf1-graph") for name in TF1_MARKERS),
        ("tensorflow.keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("keras.utils.multi_gpu_model", "keras-multi-gpu"),
        ("tensorflow.GradientTape", "tf2-custom-loop"),
        ("tensorflow.keras", "tf2-keras"),
        ("keras", "tf2-keras"),
    ),
    # TF1 graph files are left unchanged as a whole (a half-converted graph script would train N whole copies
    # with its prints on the chief): only the rule naming the generation (Tf1Graph) and the checks run on them
    legacy_generations=("tf1-graph",),
    distributed_prefixes=(
        "tensorflow.distribute", "tensorflow.contrib.distribute", "tensorflow.compat.v1.distribute",
        "horovod.tensorflow", "horovod.keras", "horovod.tensorflow.keras",
    ),
    distributed_description="tf.distribute strategies / Horovod",
    # what trains: Keras' fit, an optimizer applying gradients (a method of any object: the owner's name decides nothing)
    backward_methods=("fit", "fit_generator", "train_on_batch", "apply_gradients", "minimize"),
    random_draws=frozenset({
        *(f"tensorflow.random.{n}" for n in ("normal", "uniform", "shuffle", "truncated_normal", "categorical",
                                              "gamma", "poisson")),
        "tensorflow.random_normal", "tensorflow.random_uniform", "tensorflow.random_shuffle",
    }),
    random_seeds=frozenset({"tensorflow.random.set_seed", "tensorflow.set_random_seed",
                            "tensorflow.compat.v1.set_random_seed"}),
    random_seeds_all=frozenset(f"{p}.utils.set_random_seed" for p in KERAS_PACKAGES),
    tensor_packages=("tensorflow", "keras", "tf_keras"),
    object_prefixes=(*(f"{p}.{o}" for p in KERAS_PACKAGES for o in ("layers", "models", "Model", "Sequential",
                                                                     "optimizers", "Input", "applications",
                                                                     "callbacks", "metrics", "losses")),
                     "tensorflow.data", "tensorflow.Variable", "tensorflow.Module", "tensorflow.train"),
    save_calls=frozenset({"tensorflow.saved_model.save"}),
    batchnorm_classes=frozenset(f"{p}.layers.BatchNormalization" for p in KERAS_PACKAGES),
    batchnorm_models=frozenset(f"{p}.applications.{n}" for p in KERAS_PACKAGES for n in _BATCHNORM_APPLICATIONS),
    sync_batchnorm="synchronized",  # BatchNormalization(synchronized=True): all-reduced statistics on any device
    steps_outside_replicas=("apply_gradients", "minimize"),
    # written once, by the main process (every worker would write the same file)
    image_writers=frozenset({
        *(f"{p}.utils.{n}" for p in KERAS_PACKAGES for n in ("plot_model", "save_img")),
        *(f"{p}.preprocessing.image.save_img" for p in KERAS_PACKAGES),
        *COMMON_IMAGE_WRITERS,
    }),
    download_prefixes=(
        *(f"{p}.utils.get_file" for p in KERAS_PACKAGES),
        *(f"{p}.datasets." for p in KERAS_PACKAGES),
        "tensorflow_datasets.load", "tensorflow_datasets.builder",
    ),
    pretrained_prefixes=tuple(f"{p}.applications." for p in KERAS_PACKAGES),
    collectives=frozenset({"tensorflow.saved_model.save"}),
)


RULES = (
    InitRuntime,
    Tf1Graph,
    StandaloneKeras,
    MultiGpuModel,
    StrategyScope,
    KerasFit,
    TrainStepOverride,
    CustomLoop,
    DownloadMainProcessFirst,
    SharedRandomData,
    BatchNormStatistics,
    KerasSave,
    ChiefWrites,
    MainProcessPrint,
    MainProcessLogging,
    MainProcessOutput,
    SharedFolders,
    LocalStop,
    RankDivergence,
    KerasRankDivergence,
)
