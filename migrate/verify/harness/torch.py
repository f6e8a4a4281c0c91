"""The torch adapter of the ``dpmigrate verify`` harness: installed when the script imports torch.

- Seeds torch's generator (:func:`dpmigrate.verify.harness.core.seed_for`).
- Counts steps with torch's global optimizer step hooks, so any ``torch.optim.Optimizer`` is seen, wrapped
  by the conversion or not; every step counts, and a snapshot is taken before each (the pre-hook of step
  ``K + 1`` ends the run).
- Dropout off: every ``nn.Dropout``-like module, RNN and attention module gets ``p = 0`` as it is called
  (a global forward pre-hook), and the functional forms ignore their probability.
- Shuffling off: ``RandomSampler`` yields indices in order and ``DistributedSampler`` is built without
  shuffling, so batch ``k`` of one process is the union of batch ``k`` of the ranks.
- Inputs: every batch a DataLoader yields (its first tensor), and the first tensor the outermost module
  receives in training mode (for data batched by hand).
"""

from __future__ import annotations

import functools
import itertools
import weakref

from . import batch_scale, file_wrappers, repeats

_DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


def install(torch, recorder) -> None:
    recorder.framework = "torch"
    torch.manual_seed(recorder.seed)
    recorder.random_states.append(lambda: torch.random.get_rng_state().numpy().tobytes())
    models = _Models(torch, recorder)
    _count_steps(torch, recorder, models)
    _no_dropout(torch, recorder)
    if not recorder.shuffled:
        _no_shuffle(torch, recorder)
    repeats.install_samplers(torch.utils.data, recorder)
    _record_loader_batches(torch, recorder)
    batch_scale.install_torch(torch, recorder)
    file_wrappers.install_torch(torch, recorder)  # torch.save to a path writes in C++; collectives order files


def _to_numpy(torch):
    def convert(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.layout == torch.strided:  # not sparse
            tensor = value.detach().cpu()
            if tensor.dtype in (torch.bfloat16, torch.float16):
                tensor = tensor.float()
            return tensor.numpy()
        return None
    return convert


class _Models:
    """The outermost modules the script calls (its models, or their DDP wrappers), and their inputs."""

    def __init__(self, torch, recorder):
        self.torch, self.recorder = torch, recorder
        self.roots: weakref.WeakSet = weakref.WeakSet()
        self.depth = 0
        self.convert = _to_numpy(torch)
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        register_module_forward_pre_hook(self._enter)
        register_module_forward_hook(self._leave)

    def _enter(self, module, args):
        if self.depth == 0 and next(module.parameters(), None) is not None:  # a model, not a loss module
            self.roots.add(module)
            if module.training and not self.recorder.finished:
                from .fingerprint import first_array

                self.recorder.consumed_from(lambda: first_array(args, self.convert), "model", dims=2)
        self.depth += 1

    def _leave(self, module, args, output):
        self.depth = max(0, self.depth - 1)

    def reset_depth(self) -> None:
        """A step boundary is outside every forward (a forward that raised never called the exit hook)."""
        self.depth = 0

    def describe(self, optimizer) -> list:
        """The optimizer's parameters in its order, named from the models that hold them."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return self.describe_parameters(params, type(optimizer).__name__)

    def describe_parameters(self, params: list, unnamed: str) -> list:
        """``(name, shape, owner, read)`` of each parameter, named from the models that hold it."""
        torch = self.torch
        names, owners = {}, {}
        roots = [r for r in list(self.roots)]
        inner = [_unwrapped(r) for r in roots]
        several = len({id(m) for m in inner}) > 1
        for model in inner:
            prefix = f"{type(model).__name__}." if several else ""
            for name, p in model.named_parameters():
                names.setdefault(id(p), prefix + name)
            for module in model.modules():
                for p in module.parameters(recurse=False):
                    owners.setdefault(id(p), type(module).__name__)
            self.recorder.note_batchnorm(
                prefix + name for name, module in model.named_modules()
                if isinstance(module, torch.nn.modules.batchnorm._NormBase))
        described = []
        for j, p in enumerate(params):
            read = functools.partial(_read, p)
            described.append((names.get(id(p), f"{unnamed}.param{j}"), list(p.shape),
                              owners.get(id(p), ""), read))
        return described


def _unwrapped(module):
    while hasattr(module, "module") and type(module).__name__ in ("DistributedDataParallel", "DataParallel"):
        module = module.module
    return getattr(module, "_orig_mod", module)


def _read(p):
    tensor = p.detach().cpu()
    if tensor.dtype.is_floating_point and tensor.element_size() < 4:
        tensor = tensor.float()
    return tensor.numpy().copy()


def _count_steps(torch, recorder, models: _Models) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    done: dict[int, int] = {}
    created = _count_optimizers(torch)
    _count_backward_passes(torch, recorder, models, created)

    def before(optimizer, args, kwargs):
        if recorder.finished:
            return
        if recorder.track(optimizer, lambda: models.describe(optimizer), lambda: done.get(id(optimizer), 0)):
            models.reset_depth()
            recorder.boundary(recorder.steps_total(), pending=True)

    def after(optimizer, args, kwargs):
        done[id(optimizer)] = done.get(id(optimizer), 0) + 1

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)


def _count_optimizers(torch) -> list[int]:
    """How many ``torch.optim.Optimizer`` objects were made (one counter in a list, shared by reference)."""
    created = [0]
    init = torch.optim.Optimizer.__init__

    @functools.wraps(init)
    def counting(self, *args, **kwargs):
        created[0] += 1
        return init(self, *args, **kwargs)

    torch.optim.Optimizer.__init__ = counting
    return created


class _BackwardPasses:
    """Steps of a script that moves its weights by hand (``w -= lr * w.grad``, an optimizer class of its own):
    with no ``torch.optim`` optimizer made before the first ``backward()``, each backward pass is a step,
    and the trained parameters are the leaves of the first loss's graph, in their models' order."""

    def __init__(self, models: _Models):
        self.models, self.calls, self.leaves = models, 0, None

    def describe(self) -> list:
        leaves = self.leaves or []
        wanted = {id(t) for t in leaves}
        ordered, seen = [], set()
        for root in list(self.models.roots):
            for p in _unwrapped(root).parameters():
                if id(p) in wanted and id(p) not in seen:
                    ordered.append(p)
                    seen.add(id(p))
        ordered += [t for t in leaves if id(t) not in seen]
        return self.models.describe_parameters(ordered, "tensor")


def _graph_leaves(tensors) -> list:
    """The tensors a backward pass from ``tensors`` accumulates gradients into, in a fixed order."""
    order, visited = [], set()
    stack = [t.grad_fn for t in reversed(tensors) if getattr(t, "grad_fn", None) is not None]
    while stack:
        fn = stack.pop()
        if fn in visited:
            continue
        visited.add(fn)
        variable = getattr(fn, "variable", None)
        if variable is not None:
            order.append(variable)
            continue
        stack.extend(nxt for nxt, _ in reversed(fn.next_functions) if nxt is not None)
    return order


def _count_backward_passes(torch, recorder, models: _Models, created: list[int]) -> None:
    original = torch.autograd.backward
    passes = _BackwardPasses(models)

    @functools.wraps(original)
    def backward(tensors, *args, **kwargs):
        if not recorder.finished and created[0] == 0:
            if passes.leaves is None:
                roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
                passes.leaves = _graph_leaves(roots)
            if recorder.track(passes, passes.describe, lambda: passes.calls):
                models.reset_depth()
                recorder.boundary(recorder.steps_total(), pending=True)
                recorder.changed("steps counted as backward passes (no torch.optim optimizer)")
        try:
            return original(tensors, *args, **kwargs)
        finally:
            passes.calls += 1

    torch.autograd.backward = backward


def _no_dropout(torch, recorder) -> None:
    nn, F = torch.nn, torch.nn.functional
    dropout_modules = tuple(c for c in (getattr(nn, n, None) for n in (
        "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")) if c)

    def zero(module, args):
        if isinstance(module, dropout_modules):
            if module.p:
                module.p = 0.0
                recorder.changed(f"dropout off: {type(module).__name__}")
        elif isinstance(module, nn.RNNBase) and module.dropout:
            module.dropout = 0.0
            recorder.changed(f"dropout off: {type(module).__name__}")
        elif isinstance(module, nn.MultiheadAttention) and module.dropout:
            module.dropout = 0.0
            recorder.changed("dropout off: MultiheadAttention")

    from torch.nn.modules.module import register_module_forward_pre_hook

    register_module_forward_pre_hook(zero)
    for name in _DROPOUT_FUNCTIONS:
        original = getattr(F, name, None)
        if original is not None:
            setattr(F, name, _without_probability(original, name, recorder))
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        @functools.wraps(sdpa)
        def attention(*args, **kwargs):
            if kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
                recorder.changed("dropout off: scaled_dot_product_attention")
            if len(args) > 4 and args[4]:
                args = (*args[:4], 0.0, *args[5:])
                recorder.changed("dropout off: scaled_dot_product_attention")
            return sdpa(*args, **kwargs)
        F.scaled_dot_product_attention = attention


def _without_probability(original, name, recorder):
    @functools.wraps(original)
    def dropout(input, p=0.5, *args, **kwargs):
        if p:
            recorder.changed(f"dropout off: F.{name}")
        return original(input, 0.0, *args, **kwargs)
    return dropout


def _no_shuffle(torch, recorder) -> None:
    data = torch.utils.data

    def in_order(self):
        n = len(self.data_source)
        recorder.changed("shuffling off: RandomSampler")
        return iter(itertools.islice(itertools.cycle(range(n)), self.num_samples) if n else ())

    data.RandomSampler.__iter__ = in_order
    init = data.DistributedSampler.__init__

    @functools.wraps(init)
    def unshuffled(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.shuffle:
            self.shuffle = False
            recorder.changed("shuffling off: DistributedSampler")

    data.DistributedSampler.__init__ = unshuffled


def _record_loader_batches(torch, recorder) -> None:
    from torch.utils.data import dataloader

    from .fingerprint import arrays

    original = dataloader._BaseDataLoaderIter.__next__
    convert = _to_numpy(torch)
    streams = weakref.WeakKeyDictionary()
    counter = itertools.count()

    @functools.wraps(original)
    def next_batch(self):
        batch = original(self)
        if not recorder.finished:
            loader = self._dataset  # batches of one dataset are one stream: an evaluation set is another
            key = streams.get(loader) if _weakrefable(loader) else None
            if key is None:
                key = next(counter)
                if _weakrefable(loader):
                    streams[loader] = key
            recorder.consumed_from(lambda: arrays(batch, convert), "loader", stream=key)
        return batch

    dataloader._BaseDataLoaderIter.__next__ = next_batch
    create = dataloader._BaseDataLoaderIter.__init__

    @functools.wraps(create)
    def new_iterator(self, loader):
        create(self, loader)
        recorder.rebase_random()  # its draw of the workers' base seed is not training randomness

    dataloader._BaseDataLoaderIter.__init__ = new_iterator


def _weakrefable(value) -> bool:
    try:
        weakref.ref(value)
        return True
    except TypeError:
        return False
