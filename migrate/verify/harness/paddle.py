"""The Paddle adapter of the ``dpmigrate verify`` harness: installed when the script imports paddle.

It patches Paddle's classes, not the script's objects: the conversion wraps the model (``fleet.distributed_model``
is a ``paddle.DataParallel``) and the optimizer (``fleet.distributed_optimizer`` is a ``HybridParallelOptimizer``
whose ``step`` calls the script's own optimizer, its ``_inner_opt``), and a forgotten wrap must still be seen.

- Seeds Paddle's generator (:func:`dpmigrate.verify.harness.core.seed_for`).
- Dygraph steps (``paddle.Model.fit`` calls ``minimize``): ``step`` and ``minimize`` of ``paddle.optimizer``'s
  classes that define them, guarded so that a wrapper's step calling an inner one is one step. The counted
  object is the script's optimizer in both runs; its parameters in ``_parameter_list`` order, groups flattened.
- Static graph: Paddle's ``minimize`` and the runtime's CPU one (``backward`` + ``apply_gradients``) both end in
  ``_pir_create_optimization_pass`` / ``_create_optimization_pass``, where the program and its parameters
  (sorted by name: the two paths order them differently) are noted; a step is an ``Executor.run`` of that
  program (or of a ``CompiledProgram`` of it); parameters are read from the global scope; the first feed value
  is what the step consumed.
- Dropout off: the functional forms (``nn.Dropout``-like layers and attention call them through
  ``paddle.nn.functional``) ignore their probability in training; RNN layers get ``dropout = 0``.
- Shuffling off: ``RandomSampler`` yields in order (``DataLoader(shuffle=True)`` uses it);
  ``DistributedBatchSampler`` (the conversion's, and ``paddle.Model.fit``'s) is built without shuffling.
- Inputs: every batch a DataLoader iterator yields, and the first input of the outermost Layer with parameters
  in training mode (a ``DataParallel`` calls its inner layer: only the outer call counts).
- Names: from the Layers the script calls, inside their ``DataParallel``; owners: the layers holding them.

Layers are held weakly: keeping a ``DataParallel`` alive, or collecting it, changes what Paddle does (two
``paddle.Model`` over one layer crash once the first wrapper is collected); no ``gc`` call.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import threading
import weakref

from . import batch_scale, file_wrappers, repeats
from .fingerprint import arrays, first_array

_DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
_STEP_METHODS = ("step", "minimize")
_BUILD_METHODS = ("_pir_create_optimization_pass", "_create_optimization_pass")
_WRAPPERS = ("DataParallel", "TensorParallel", "ShardingParallel", "SegmentParallel", "NoPipelineParallel")


def install(paddle, recorder) -> None:
    recorder.framework = "paddle"
    paddle.seed(recorder.seed)
    # (a GeneratorState's repr is its address: its __getstate__ holds the seed, the offset and the engine's state)
    recorder.random_states.append(lambda: repr([state.__getstate__() for state in paddle.get_rng_state()]).encode())
    guard = _Guard()
    layers = _Layers(paddle, recorder)
    _count_dygraph_steps(paddle, recorder, layers, guard)
    _StaticSteps(paddle, recorder, guard)
    _no_dropout(paddle, recorder)
    if not recorder.shuffled:
        _no_shuffle(paddle, recorder)
    repeats.install_samplers(paddle.io, recorder)
    _record_loader_batches(paddle, recorder)
    batch_scale.install_paddle(paddle, recorder)
    file_wrappers.install_paddle(paddle, recorder)  # paddle.jit.save writes in C++; collectives order files


class _Guard(threading.local):
    """Set while a counted step runs: a wrapper's step that calls an inner optimizer's is one step."""

    busy = False


def _to_numpy(paddle):
    import numpy as np

    dense = getattr(paddle.base.core, "DenseTensor", ())

    def convert(value):
        if isinstance(value, paddle.Tensor):
            if value.ndim == 0:
                return None
            if value.dtype in (paddle.float16, paddle.bfloat16):
                value = value.astype("float32")
            return value.numpy()
        if isinstance(value, dense):
            value = np.array(value)
        if isinstance(value, np.ndarray):
            return value if value.ndim else None
        return None
    return convert


def _unwrapped(layer):
    """The script's layer inside Paddle's (or Fleet's) data-parallel wrappers, which hold it as ``_layers``."""
    while type(layer).__name__ in _WRAPPERS and hasattr(layer, "_layers"):
        layer = layer._layers
    return layer


def _has_parameters(layer) -> bool:
    return any(True for _ in layer.parameters())


class _Layers:
    """The outermost layers the script calls (its models, or their wrappers), and their inputs."""

    def __init__(self, paddle, recorder):
        self.paddle, self.recorder = paddle, recorder
        self.roots: dict[int, weakref.ref] = {}
        self.depth = 0
        self.convert = _to_numpy(paddle)
        self.rnn = paddle.nn.layer.rnn.RNNBase
        original = paddle.nn.Layer.__call__
        layers = self

        @functools.wraps(original)
        def call(layer, *inputs, **kwargs):
            layers.enter(layer, inputs, kwargs)
            layers.depth += 1
            try:
                return original(layer, *inputs, **kwargs)
            finally:
                layers.depth -= 1

        paddle.nn.Layer.__call__ = call

    def enter(self, layer, inputs, kwargs) -> None:
        if isinstance(layer, self.rnn) and getattr(layer, "dropout", 0):
            layer.dropout = 0.0
            self.recorder.changed(f"dropout off: {type(layer).__name__}")
        if self.depth or self.recorder.finished or not self.paddle.in_dynamic_mode():
            return
        model = _unwrapped(layer)
        if not _has_parameters(model):  # a loss or metric layer: its input is not a batch of samples
            return
        self.roots[id(layer)] = weakref.ref(layer)
        if model.training:
            self.recorder.consumed_from(lambda: first_array([*inputs, *kwargs.values()], self.convert), "model", dims=2)

    def models(self) -> list:
        """The live script layers (wrappers removed), once each, in the order they were first called."""
        found, seen = [], set()
        for ref in list(self.roots.values()):
            layer = ref()
            if layer is None:
                continue
            model = _unwrapped(layer)
            if id(model) not in seen:
                seen.add(id(model))
                found.append(model)
        return found

    def describe(self, optimizer) -> list:
        """The optimizer's parameters in its order, named from the layers that hold them."""
        names, owners = {}, {}
        models = self.models()
        batchnorm = _batchnorm_classes(self.paddle)
        for model in models:
            prefix = f"{type(model).__name__}." if len(models) > 1 else ""
            for name, p in model.named_parameters():
                names.setdefault(id(p), prefix + name)
            for name, layer in model.named_sublayers(include_self=True):
                for p in layer._parameters.values():
                    owners.setdefault(id(p), type(layer).__name__)
                if isinstance(layer, batchnorm):
                    self.recorder.note_batchnorm([prefix + (name or type(model).__name__)])
        return [(names.get(id(p)) or getattr(p, "name", None) or f"{type(optimizer).__name__}.param{j}",
                 list(p.shape), owners.get(id(p), ""), functools.partial(_read, self.paddle, p))
                for j, p in enumerate(_parameters_of(optimizer))]


def _batchnorm_classes(paddle) -> tuple:
    found = (getattr(paddle.nn.layer.norm, "_BatchNormBase", None), getattr(paddle.nn, "BatchNorm", None))
    return tuple(c for c in found if c is not None)  # SyncBatchNorm is a _BatchNormBase


def _parameters_of(optimizer) -> list:
    """``_parameter_list`` in its order, parameter groups (dicts) flattened, without what it never trains:
    ``stop_gradient`` parameters (BatchNorm's running ``_mean`` and ``_variance`` are parameters in Paddle,
    updated per rank by every forward; torch keeps them as buffers, outside the optimizer)."""
    listed = getattr(optimizer, "_parameter_list", None) or getattr(optimizer, "_param_groups", None) or []
    params = []
    for item in listed:
        params.extend(item["params"] if isinstance(item, dict) else [item])
    return [p for p in params if not getattr(p, "stop_gradient", False)]


def _read(paddle, p):
    if p.dtype in (paddle.float16, paddle.bfloat16):
        p = p.astype("float32")
    return p.numpy().copy()


# --- dygraph steps ------------------------------------------------------------------------------------


def _count_dygraph_steps(paddle, recorder, layers: _Layers, guard: _Guard) -> None:
    done: dict[int, int] = {}

    def counting(original):
        @functools.wraps(original)
        def step(optimizer, *args, **kwargs):
            if guard.busy or recorder.finished or not paddle.in_dynamic_mode():
                return original(optimizer, *args, **kwargs)
            guard.busy = True
            try:
                steps = lambda: done.get(id(optimizer), 0)  # noqa: E731
                if recorder.track(optimizer, lambda: layers.describe(optimizer), steps):
                    recorder.boundary(recorder.steps_total(), pending=True)
                result = original(optimizer, *args, **kwargs)
                done[id(optimizer)] = steps() + 1
                return result
            finally:
                guard.busy = False
        return step

    for cls in _optimizer_classes(paddle):
        for method in _STEP_METHODS:
            if method in cls.__dict__:
                setattr(cls, method, counting(cls.__dict__[method]))


def _optimizer_classes(paddle) -> list:
    base = paddle.optimizer.Optimizer
    return [base, *(c for c in vars(paddle.optimizer).values() if inspect.isclass(c) and issubclass(c, base)
                    and c is not base)]


# --- static graph steps -------------------------------------------------------------------------------


class _StaticSteps:
    """Programs on which ``minimize`` was called; a step is an ``Executor.run`` of one of them."""

    def __init__(self, paddle, recorder, guard: _Guard):
        self.paddle, self.recorder, self.guard = paddle, recorder, guard
        self.programs: list = []  # strong references: their ids must stay theirs
        self.parameters: dict[int, set[str]] = {}  # id(program) -> the names of the parameters it trains
        self.runs: dict[int, int] = {}
        self.convert = _to_numpy(paddle)
        base = paddle.optimizer.Optimizer
        for method in _BUILD_METHODS:
            if method in base.__dict__:
                setattr(base, method, self._noting(base.__dict__[method]))
        executor = paddle.static.Executor
        executor.run = self._counting(executor.__dict__["run"])

    def _noting(self, original):
        @functools.wraps(original)
        def build(optimizer, parameters_and_grads, *args, **kwargs):
            if not self.paddle.in_dynamic_mode():
                self.note(parameters_and_grads)
            return original(optimizer, parameters_and_grads, *args, **kwargs)
        return build

    def note(self, parameters_and_grads) -> None:
        pairs = parameters_and_grads["params"] if isinstance(parameters_and_grads, dict) else parameters_and_grads
        program = self.paddle.static.default_main_program()
        if not any(p is program for p in self.programs):
            self.programs.append(program)
            self.parameters[id(program)] = set()
        self.parameters[id(program)].update(param.name for param, _ in pairs)

    def _program_of(self, program):
        if program is None:
            program = self.paddle.static.default_main_program()
        if isinstance(program, self.paddle.static.CompiledProgram):
            program = program._program
        return next((p for p in self.programs if p is program), None)

    def _counting(self, original):
        @functools.wraps(original)
        def run(executor, *args, **kwargs):
            program = self._program_of(args[0] if args else kwargs.get("program"))
            if program is None or self.guard.busy or self.recorder.finished:
                return original(executor, *args, **kwargs)
            self.guard.busy = True
            try:
                self.before(program, args[1] if len(args) > 1 else kwargs.get("feed"))
                result = original(executor, *args, **kwargs)
                self.runs[id(program)] = self.runs.get(id(program), 0) + 1
                return result
            finally:
                self.guard.busy = False
        return run

    def before(self, program, feed) -> None:
        if isinstance(feed, dict):
            feed = list(feed.values())
        if feed:
            import numpy as np

            found = arrays(feed, self.convert) or [np.asarray(value) for value in feed]
            self.recorder.consumed(found, "feed")
        steps = lambda: self.runs.get(id(program), 0)  # noqa: E731
        if self.recorder.track(program, lambda: self.describe(program), steps):
            self.recorder.boundary(self.recorder.steps_total(), pending=True)

    def describe(self, program) -> list:
        described = []
        for name in sorted(self.parameters[id(program)]):
            read = functools.partial(self.read, name)
            described.append((name, list(read().shape), "", read))
        return described

    def read(self, name: str):
        import numpy as np

        return np.array(self.paddle.static.global_scope().find_var(name).get_tensor()).copy()


# --- randomness and order -----------------------------------------------------------------------------


def _no_dropout(paddle, recorder) -> None:
    F = paddle.nn.functional
    common = sys.modules.get("paddle.nn.functional.common")
    for name in _DROPOUT_FUNCTIONS:
        original = getattr(F, name, None)
        if original is None:
            continue
        replacement = _without_probability(original, name, recorder)
        setattr(F, name, replacement)
        if common is not None and getattr(common, name, None) is original:  # dropout2d calls common.dropout
            setattr(common, name, replacement)


def _without_probability(original, name, recorder):
    """``original`` with ``p = 0`` when training (at evaluation its result is left as it was)."""
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = []
    at_p = names.index("p") if "p" in names else 1
    at_training = names.index("training") if "training" in names else None

    @functools.wraps(original)
    def dropout(*args, **kwargs):
        training = kwargs.get("training", args[at_training] if at_training is not None and len(args) > at_training
                              else True)
        p = kwargs.get("p", args[at_p] if len(args) > at_p else 0.5)
        if training and not (isinstance(p, (int, float)) and p == 0):
            recorder.changed(f"dropout off: F.{name}")
            if len(args) > at_p:
                args = (*args[:at_p], 0.0, *args[at_p + 1:])
            else:
                kwargs["p"] = 0.0
        return original(*args, **kwargs)
    return dropout


def _no_shuffle(paddle, recorder) -> None:
    io = paddle.io
    shuffled = io.RandomSampler.__iter__

    @functools.wraps(shuffled)
    def in_order(self):
        if self.generator:  # the script's own index generator: its order is the script's
            return shuffled(self)
        n = len(self.data_source)
        recorder.changed("shuffling off: RandomSampler")
        return iter(itertools.islice(itertools.cycle(range(n)), self.num_samples) if n else ())

    io.RandomSampler.__iter__ = in_order
    init = io.DistributedBatchSampler.__init__

    @functools.wraps(init)
    def unshuffled(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.shuffle:
            self.shuffle = False
            recorder.changed("shuffling off: DistributedBatchSampler")

    io.DistributedBatchSampler.__init__ = unshuffled


def _record_loader_batches(paddle, recorder) -> None:
    from paddle.io.dataloader import dataloader_iter

    convert = _to_numpy(paddle)
    streams: dict[int, tuple[weakref.ref | None, int]] = {}
    counter = itertools.count()

    def stream_of(dataset) -> int:
        """Batches of one dataset are one stream: an evaluation set read between steps is another."""
        known = streams.get(id(dataset))
        if known is not None and (known[0] is None or known[0]() is dataset):
            return known[1]
        try:
            ref = weakref.ref(dataset)
        except TypeError:
            ref = None
        key = next(counter)
        streams[id(dataset)] = (ref, key)
        return key

    def recording(original):
        @functools.wraps(original)
        def next_batch(self):
            batch = original(self)
            if not recorder.finished:
                recorder.consumed_from(lambda: arrays(batch, convert), "loader", stream=stream_of(self._dataset))
            return batch
        return next_batch

    for cls in (dataloader_iter._DataLoaderIterSingleProcess, dataloader_iter._DataLoaderIterMultiProcess):
        if "__next__" in cls.__dict__:
            cls.__next__ = recording(cls.__dict__["__next__"])
