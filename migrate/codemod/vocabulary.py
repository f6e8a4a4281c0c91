"""What the engine and the shared rules need to know of a framework's API, as plain data.

Why: the engine, the analyses and the rules written once for every framework (printing, logging,
downloads, init placement, rank divergence) must never name a framework's API themselves. Each
framework's rule package (``dpmigrate.rules.<framework>``) declares one :class:`Vocabulary`, and
the registry (``dpmigrate.frameworks``) hands it to the engine with the framework's rules.

Names are qualified names, as libcst's ``QualifiedNameProvider`` gives them (``torch.optim.SGD``);
a ``*_prefixes`` field matches a name equal to a prefix or starting with ``prefix + "."``.
"""

from __future__ import annotations

import dataclasses

# The contract's names that every rank must reach, in every backend (see dpmigrate.runtime).
RUNTIME_COLLECTIVES = (
    "all_reduce", "all_gather", "broadcast", "barrier", "save", "main_process_first", "distributed_model",
)
RUNTIME_RANK_CALLS = ("rank", "local_rank", "is_main_process", "role")


# image files any framework's script writes with a general-purpose library: sample grids, plots of predictions
COMMON_IMAGE_WRITERS = frozenset({
    *(f"imageio.{v}{n}" for v in ("", "v2.", "v3.") for n in ("imwrite", "mimwrite", "mimsave", "imsave")),
    "cv2.imwrite", "matplotlib.pyplot.imsave",
})


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """One framework's API, as the codemod reads it."""

    framework: str  # "torch"
    display_name: str  # "PyTorch", for reports
    runtime_module: str  # "dpmigrate.runtime.torch": what converted files import
    default_generation: str  # "eager"
    generations: tuple[tuple[str, str], ...] = ()  # (qualified-name prefix, generation), first match wins
    # generations the runtime cannot serve (Paddle's fluid: gone from the Paddle the runtime needs); only
    # rules that name such a generation in their ``generations`` convert its files
    legacy_generations: tuple[str, ...] = ()
    # --- files left alone: written for data parallelism by hand, or starting processes themselves
    distributed_prefixes: tuple[str, ...] = ()
    distributed_description: str = ""  # "torch.distributed / DistributedDataParallel / DistributedSampler"
    multiprocessing_prefixes: tuple[str, ...] = ()
    multiprocessing_methods: tuple[str, ...] = ()  # methods whose call marks it too (``model.share_memory()``)
    multiprocessing_description: str = ""
    # --- what training looks like
    backward_methods: tuple[str, ...] = ()  # ``loss.backward()``
    optimizer_step_methods: tuple[str, ...] = ()  # ``optimizer.step()`` on a name that says "optim"
    data_loaders: frozenset[str] = frozenset()  # loader classes whose loops are followed
    optimizer_prefix: str = ""  # optimizers are classes under this module ("torch.optim.")
    not_optimizer_prefixes: tuple[str, ...] = ()  # schedulers and base classes under it
    parameter_methods: tuple[str, ...] = ()  # ``model.parameters()``: what an optimizer is given
    # optimizers that step through a closure (several forward/backward passes per step, a loss-based stop):
    # a wrapped model's one reduction per backward does not fit them; the distributed optimizer averages each pass
    closure_optimizers: frozenset[str] = frozenset()
    # learning-rate schedulers stepped with a metric (``ReduceLROnPlateau``): each rank's would decide on its own data
    plateau_schedulers: frozenset[str] = frozenset()
    # --- randomness: what draws from the framework's global generator, what seeds it (and what seeds Python's
    # random, NumPy and it at once), under which packages its tensor functions live, and which calls under them
    # build objects (models, layers, datasets, loaders, optimizers) rather than data
    random_draws: frozenset[str] = frozenset()
    random_seeds: frozenset[str] = frozenset()
    random_seeds_all: frozenset[str] = frozenset()
    tensor_packages: tuple[str, ...] = ()
    object_prefixes: tuple[str, ...] = ()
    batchnorm_classes: frozenset[str] = frozenset()  # batch normalisation layers (their statistics become per rank)
    dropout_calls: frozenset[str] = frozenset()  # dropout layers and functions (a new mask on each rank)
    dropout_layer_prefixes: tuple[str, ...] = ()  # layers that take dropout= (``torch.nn.LSTM(..., dropout=0.2)``)
    dropout_models: frozenset[str] = frozenset()  # library models with dropout inside (``vgg16()``)
    seed_call: str | None = None  # how a script seeds the framework's generator, for fixes (``torch.manual_seed``)
    # library models built of such layers (``paddle.vision.models.resnet18``, Keras applications), and those that
    # are only when given a keyword (Paddle's ``vgg16(batch_norm=True)``): their layers are not in the script
    batchnorm_models: frozenset[str] = frozenset()
    batchnorm_models_with: tuple[tuple[str, str], ...] = ()
    # how --sync-batchnorm synchronises them: "strategy" (dp.init(dp.Strategy(sync_batchnorm=True)): the runtime
    # converts every wrapped model's layers, where the framework runs its synchronised ones), or the keyword the
    # layers' constructor takes ("synchronized" for Keras); "" when dpmigrate knows no way
    sync_batchnorm: str = ""
    # the framework's gradient reducer waits for every parameter's gradient each step (torch DDP, Paddle's
    # DataParallel): a layer forward does not always call needs dp.Strategy(find_unused_parameters=True)
    reducer_waits_for_every_gradient: bool = False
    # model classes that wrap their network for data parallelism themselves (``paddle.Model``): the runtime's
    # distributed_model never sees their network, so Strategy(sync_batchnorm=True) cannot reach it
    self_distributing_models: frozenset[str] = frozenset()
    # methods of a hand-written training step that the conversion runs outside the strategy's replica context
    # (TF: a custom loop's apply_gradients; not inside a Keras train_step, which fit runs per replica): a layer's
    # own synchronisation has no replicas to synchronise with there
    steps_outside_replicas: tuple[str, ...] = ()
    save_calls: frozenset[str] = frozenset()  # ``torch.save``
    image_writers: frozenset[str] = frozenset()  # sample images written by every rank otherwise
    download_prefixes: tuple[str, ...] = ()  # calls that fetch files (``torch.hub.load_state_dict_from_url``)
    pretrained_prefixes: tuple[str, ...] = ()  # model constructors that download with pretrained=/weights=
    # --- rank-awareness
    rank_calls: frozenset[str] = frozenset()  # the framework's own ``get_rank()``...
    collectives: frozenset[str] = frozenset()  # the framework's calls every rank must reach
    collective_aliases: tuple[tuple[str, str], ...] = ()  # (prefix, short form) for messages

    @property
    def all_rank_calls(self) -> frozenset[str]:
        """The framework's rank queries and the runtime's own."""
        return self.rank_calls | {f"{self.runtime_module}.{n}" for n in RUNTIME_RANK_CALLS}

    @property
    def all_collectives(self) -> frozenset[str]:
        """The framework's collectives and the runtime's own (``dp.save`` is a meeting point)."""
        return self.collectives | {f"{self.runtime_module}.{n}" for n in RUNTIME_COLLECTIVES}

    def short_name(self, qualified: str) -> str:
        """``dist.all_reduce`` for ``torch.distributed.all_reduce``, ``dp.save`` for the runtime's."""
        for prefix, short in ((f"{self.runtime_module}.", "dp."), *self.collective_aliases):
            if qualified.startswith(prefix):
                return short + qualified[len(prefix):]
        return qualified

    def markers(self, generation: str) -> tuple[str, ...]:
        """The qualified-name prefixes that make a file of ``generation``."""
        return tuple(prefix for prefix, of in self.generations if of == generation)

    def generation(self, qualified: set[str]) -> str:
        for prefix, generation in self.generations:
            if any(matches(q, (prefix,)) for q in qualified):
                return generation
        return self.default_generation


def matches(name: str, prefixes: tuple[str, ...]) -> bool:
    """``name`` is one of ``prefixes`` or inside one of them (``torch.distributed.all_reduce``)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)
