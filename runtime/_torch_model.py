"""DDP wrapping and the distributed optimizer of the torch backend, with the Strategy mapped onto them.

Strategy knobs, each onto torch's own mechanism:
- ``bucket_size_mb`` -> DDP ``bucket_cap_mb``;
- ``gradient_compression`` -> DDP comm hooks ``fp16_compress_hook`` / ``bf16_compress_hook``;
- ``localsgd_steps`` -> ``post_localSGD_hook`` (no gradient all-reduce after the warm-up) plus a
  ``PeriodicModelAverager`` run after every optimizer step, as ``PostLocalSGDOptimizer`` does;
- ``gradient_accumulation`` -> DDP's ``no_sync`` (``require_backward_grad_sync``) on all micro-batches
  but the last, and an optimizer that steps every k calls with gradients divided by k, so k
  micro-batches of b equal one batch of k*b;
- ``sync_batchnorm`` -> ``SyncBatchNorm.convert_sync_batchnorm`` before DDP wraps the model. torch runs
  SyncBatchNorm on CUDA only (DDP refuses it elsewhere), so on another device a model with batch
  normalisation stops the job at ``distributed_model`` with :class:`UnsupportedStrategy`, on every rank
  alike (no rank waits for another), rather than train unsynchronised under a knob that says otherwise.
Gradients are averaged exactly once: by DDP for the parameters a wrapped model owns, and by an
all-reduce in ``step()`` for parameters no wrapped model owns. Those parameters (and their modules'
buffers) also take rank 0's values when the optimizer is wrapped, as DDP does for its own module
(see ``_torch_start_state``).

A closure optimizer (``LBFGS``, ``opt.step(closure)``) computes its gradients inside ``step``: the
closure is wrapped so that, after it runs, the gradients no wrapped model owns are averaged and the
loss it returns is the mean over ranks. LBFGS tests that loss for convergence; ranks with different
local losses would run different numbers of inner iterations, drift apart, and with DDP (one
all-reduce per backward) hang. The averaged loss is returned detached.

Module state: the weak registries of wrapped models and distributed optimizers (who owns which
parameters, which optimizer accumulates for which model) and their generation, which every new
optimizer bumps so that a wrapped model's cached accumulator lookup is redone. ``_reset_for_tests()``
empties the registries and bumps the generation. ``_subclasses`` (optimizer class -> its distributed
subclass) is a pure cache and stays.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from ._torch_start_state import broadcast_unowned_state
from .strategy import Strategy, UnsupportedStrategy

_wrapped_models: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
_distributed_optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
_optimizers_generation = 0  # bumped by every registration and reset; never goes back
_models_generation = 0  # bumped by every wrapped model and reset; never goes back


def _reset_for_tests() -> None:
    """Forget every wrapped model and distributed optimizer (the objects themselves keep working)."""
    global _optimizers_generation, _models_generation
    _wrapped_models.clear()
    _distributed_optimizers.clear()
    _optimizers_generation += 1
    _models_generation += 1


def _strip_module_prefix(state_dict):
    if state_dict and all(k.startswith("module.") for k in state_dict):
        return type(state_dict)((k[len("module."):], v) for k, v in state_dict.items())
    return state_dict


class DistributedDataParallel(_TorchDDP):
    """DDP whose checkpoints and attributes look like the original model's.

    ``state_dict()`` has the unwrapped keys, so a checkpoint written by the converted script loads in
    the original and back; ``load_state_dict`` also accepts ``module.``-prefixed checkpoints; an
    attribute DDP lacks (``model.init_hidden``, ``model.fc``) is read from the wrapped model.
    """

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(_strip_module_prefix(state_dict), strict=strict, assign=assign)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(super().__getattr__("module"), name)

    def forward(self, *inputs, **kwargs):
        accumulator = self._dpmigrate_accumulator()
        if accumulator is not None:  # otherwise leave a hand-written `with model.no_sync():` alone
            self.require_backward_grad_sync = accumulator.is_last_micro_step()
        return super().forward(*inputs, **kwargs)

    def _dpmigrate_accumulator(self):
        """The accumulating optimizer that steps this model's parameters, if any (cached per optimizer set)."""
        key = (_optimizers_generation, len(_distributed_optimizers))  # len: an optimizer was collected
        cached = self.__dict__.get("_dpmigrate_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        own = {id(p) for p in self.module.parameters()}
        found = None
        for opt in list(_distributed_optimizers):
            if opt._dpmigrate.accumulation > 1 and any(id(p) in own for g in opt.param_groups for p in g["params"]):
                found = opt._dpmigrate
                break
        self.__dict__["_dpmigrate_cache"] = (key, found)
        return found


def wrap_model(model: torch.nn.Module, strategy: Strategy, device: torch.device) -> DistributedDataParallel:
    if strategy.sync_batchnorm:
        model = synchronised_batchnorm(model, device)
    kwargs = {}
    if strategy.bucket_size_mb is not None:
        kwargs["bucket_cap_mb"] = strategy.bucket_size_mb
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index]
    if strategy.find_unused_parameters:
        kwargs["find_unused_parameters"] = True
    ddp = DistributedDataParallel(model, **kwargs)
    if strategy.gradient_compression is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
        ddp.register_comm_hook(state=None, hook=hook[strategy.gradient_compression])
    if strategy.localsgd_steps is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as localsgd

        state = localsgd.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=strategy.localsgd_warmup_steps,
            post_local_gradient_allreduce=False,
        )
        ddp.register_comm_hook(state, localsgd.post_localSGD_hook)
    global _models_generation
    _wrapped_models.add(ddp)
    _models_generation += 1
    return ddp


def synchronised_batchnorm(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` with its batch normalisation layers made ``SyncBatchNorm`` (parameters and buffers kept, so
    an optimizer built before still steps them); ``model`` itself when it has none."""
    layers = [name or type(m).__name__ for name, m in model.named_modules()
              if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)]
    if not layers:
        return model
    if device.type != "cuda":
        shown = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
        raise UnsupportedStrategy(
            f"Strategy(sync_batchnorm=True): torch runs SyncBatchNorm on CUDA devices only and this rank trains on "
            f"{device.type}, so the batch normalisation layers ({shown}) cannot be synchronised here; launch on GPUs, "
            "or drop the knob (dp.init() without it, or convert without --sync-batchnorm): each rank then normalises "
            "over its own share of the batch")
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


class _AccumulationState:
    def __init__(self, accumulation: int, world_size: int, averager):
        self.accumulation = accumulation
        self.world_size = world_size
        self.averager = averager
        self.calls = 0  # step() calls so far

    def is_last_micro_step(self) -> bool:
        """Whether the backward about to run is the last before a real optimizer step."""
        return (self.calls + 1) % self.accumulation == 0

    def at_boundary(self) -> bool:
        return self.calls % self.accumulation == 0


class _DistributedOptimizerMixin:
    """Put in front of the optimizer's own class; see the module docstring."""

    _dpmigrate: _AccumulationState

    def _dpmigrate_average_unowned_gradients(self) -> None:
        grads = [p.grad for p in self._dpmigrate_unowned_parameters() if p.grad is not None]
        if not grads:  # every parameter is a DDP model's (the usual case): not even a no_grad context
            return
        with torch.no_grad():
            for grad in grads:  # one all-reduce per tensor: only for parameters outside a DDP model
                dist.all_reduce(grad, op=dist.ReduceOp.SUM)
                grad.div_(self._dpmigrate.world_size)

    def _dpmigrate_unowned_parameters(self) -> list:
        """The parameters of this optimizer that no wrapped (DDP) model owns, cached until a model is wrapped
        or collected or the parameter groups change: walking every model's parameters at each step cost
        ~70 us a step (benchmarks/runtime_overhead.py)."""
        key = (_models_generation, len(_wrapped_models), tuple(len(g["params"]) for g in self.param_groups))
        cached = self.__dict__.get("_dpmigrate_unowned")
        if cached is None or cached[0] != key:
            owned = _owned_parameter_ids()
            cached = (key, [p for g in self.param_groups for p in g["params"] if id(p) not in owned])
            self.__dict__["_dpmigrate_unowned"] = cached
        return cached[1]

    def step(self, closure=None):
        state = self._dpmigrate
        state.calls += 1
        if state.calls % state.accumulation:
            if closure is not None:
                raise ValueError("step(closure) cannot be combined with Strategy(gradient_accumulation > 1)")
            return None
        if state.accumulation > 1:
            with torch.no_grad():
                for g in self.param_groups:
                    for p in g["params"]:
                        if p.grad is not None:
                            p.grad.div_(state.accumulation)
        if state.world_size > 1 and state.averager is None:
            if closure is None:
                self._dpmigrate_average_unowned_gradients()
            else:  # the gradients do not exist yet: the closure computes them (maybe several times)
                closure = self._dpmigrate_averaging_closure(closure)
        loss = super().step(closure)
        if state.averager is not None:
            state.averager.average_parameters(params=[p for g in self.param_groups for p in g["params"]])
        return loss

    def _dpmigrate_averaging_closure(self, closure):
        def averaged_closure():
            loss = closure()
            self._dpmigrate_average_unowned_gradients()
            return _mean_over_ranks(loss, self._dpmigrate.world_size)

        return averaged_closure

    def zero_grad(self, set_to_none: bool = True):
        if self._dpmigrate.at_boundary():  # between micro-batches the gradients are being accumulated
            super().zero_grad(set_to_none=set_to_none)


def _owned_parameter_ids() -> set[int]:
    """The ids of the parameters some wrapped (DDP) model owns: DDP syncs and averages those itself."""
    return {id(p) for m in list(_wrapped_models) for p in m.module.parameters()}


@torch.no_grad()
def _mean_over_ranks(loss, world_size: int):
    """A closure's loss (tensor, number or None) averaged over the ranks; every rank gets the same value."""
    if loss is None:
        return None
    is_tensor = isinstance(loss, torch.Tensor)
    value = loss.detach().clone() if is_tensor else torch.tensor(float(loss), dtype=torch.float64)
    if dist.get_backend() == "nccl" and value.device.type != "cuda":
        staged = value.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(staged, op=dist.ReduceOp.SUM)
        value = staged.to(value.device)
    else:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    value = value / world_size
    return value if is_tensor else value.item()


_subclasses: dict[type, type] = {}


def make_distributed_optimizer(optimizer: torch.optim.Optimizer, strategy: Strategy, world_size: int):
    """Turn ``optimizer`` (in place, so schedulers built on it keep working) into a distributed one."""
    global _optimizers_generation
    if isinstance(optimizer, _DistributedOptimizerMixin):
        return optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"distributed_optimizer() needs a torch.optim.Optimizer, got {type(optimizer).__name__}; "
            "wrap the inner torch optimizer instead"
        )
    if world_size == 1 and strategy.gradient_accumulation == 1:
        return optimizer  # not launched: exactly the original optimizer
    averager = None
    if strategy.localsgd_steps is not None and world_size > 1:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        averager = PeriodicModelAverager(period=strategy.localsgd_steps, warmup_steps=strategy.localsgd_warmup_steps)
    cls = type(optimizer)
    if cls not in _subclasses:
        _subclasses[cls] = type(f"Distributed{cls.__name__}", (_DistributedOptimizerMixin, cls), {})
    scheduler_patched = "step" in vars(optimizer)  # an LRScheduler built earlier wrapped the bound step
    if scheduler_patched:
        del optimizer.step
    optimizer.__class__ = _subclasses[cls]
    optimizer._dpmigrate = _AccumulationState(strategy.gradient_accumulation, world_size, averager)
    if scheduler_patched:
        _retrack_scheduler_step(optimizer)
    _distributed_optimizers.add(optimizer)
    _optimizers_generation += 1
    if world_size > 1:
        broadcast_unowned_state(optimizer, _owned_parameter_ids())
    return optimizer


def _retrack_scheduler_step(optimizer) -> None:
    """Re-apply the LRScheduler's "step was called" tracking on top of the distributed step."""
    bound = optimizer.step
    ref = weakref.ref(optimizer)

    def step(*args, **kwargs):
        opt = ref()
        opt._opt_called = True
        return bound(*args, **kwargs)

    step._wrapped_by_lr_sched = True
    optimizer.step = step
