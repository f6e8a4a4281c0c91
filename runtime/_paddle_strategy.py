"""The framework-neutral :class:`~dpmigrate.runtime.strategy.Strategy` mapped onto ``fleet.DistributedStrategy``.

Each knob goes to the ``DistributedStrategy`` field the seed's tuning advice names, and only where
Paddle honours it in the current mode (measured with Paddle 3.3.1):

- ``bucket_size_mb`` -> ``fuse_grad_size_in_MB``: dygraph ``fleet.distributed_model`` passes it to
  ``paddle.DataParallel(comm_buffer_size=...)``; static graph fuses the all-reduce ops with it
  (``fuse_all_reduce_ops``);
- ``hierarchical_allreduce`` -> ``use_hierarchical_allreduce``; ``localsgd_steps`` / warm-up ->
  ``localsgd`` with ``localsgd_configs`` (``k_steps``, ``begin_step``); ``gradient_compression="fp16"``
  -> ``fp16_allreduce``; ``gradient_accumulation`` -> ``gradient_merge`` with ``k_steps`` and ``avg``:
  these are static-graph meta-optimizers of Fleet (they rewrite the program in ``minimize``). A dygraph
  ``DataParallel`` reads none of them, so in dygraph mode they raise :class:`UnsupportedStrategy`
  instead of being silently dropped;
- on a CPU build in static mode Fleet's ``minimize`` does not run at all (:mod:`._paddle_static`): the
  gradients are all-reduced one by one, so no knob applies there and every one raises;
- ``gradient_compression="bf16"``: no Paddle option at all;
- ``sync_batchnorm`` -> dygraph: ``paddle.nn.SyncBatchNorm.convert_sync_batchnorm`` on the model
  ``distributed_model`` wraps (:func:`synchronised_batchnorm`); static graph on GPU: ``sync_batch_norm``.
  Paddle registers its ``sync_batch_norm`` kernel for GPUs only (a CPU run fails with "kernel not
  registered"), so on the CPU a model with batch normalisation stops the launched job, saying so.

Modes: ``"dygraph"``, ``"static-fleet"`` (GPU: Fleet's minimize), ``"static-allreduce"`` (CPU).
"""

from __future__ import annotations

from .strategy import Strategy, UnsupportedStrategy

_STATIC_ONLY = {
    "hierarchical_allreduce": "use_hierarchical_allreduce",
    "localsgd_steps": "localsgd",
    "gradient_compression": "fp16_allreduce",
    "gradient_accumulation": "gradient_merge",
}


def _requested(strategy: Strategy) -> list[str]:
    """The static-graph-only knobs this Strategy turns on."""
    on = []
    if strategy.hierarchical_allreduce:
        on.append("hierarchical_allreduce")
    if strategy.localsgd_steps is not None:
        on.append("localsgd_steps")
    if strategy.gradient_compression is not None:
        on.append("gradient_compression")
    if strategy.gradient_accumulation > 1:
        on.append("gradient_accumulation")
    return on


def check(strategy: Strategy, *, mode: str) -> None:
    """Raise UnsupportedStrategy for a knob Paddle cannot honour in ``mode``."""
    if strategy.gradient_compression == "bf16":
        raise UnsupportedStrategy(
            "Strategy(gradient_compression='bf16'): Paddle's DistributedStrategy has fp16_allreduce only; "
            "use gradient_compression='fp16' (static graph on GPU) or drop the knob"
        )
    if mode == "static-allreduce" and strategy != Strategy():
        raise UnsupportedStrategy(
            f"{strategy}: on a CPU build in static graph mode Fleet's optimizer cannot run (Paddle 3.3.1), so "
            "dpmigrate all-reduces each gradient itself and no DistributedStrategy knob applies; drop the knobs, "
            "or train on GPUs"
        )
    if mode == "dygraph":
        knobs = _requested(strategy)
        if knobs:
            names = ", ".join(f"{k} (DistributedStrategy.{_STATIC_ONLY[k]})" for k in knobs)
            raise UnsupportedStrategy(
                f"{strategy}: {names} is honoured by Fleet's static-graph optimizer only; a dygraph "
                "paddle.DataParallel ignores it. Drop the knob, or train in static graph (paddle.enable_static() "
                "before dp.init()); for accumulation in dygraph, run the micro-batches inside "
                "`with model.no_sync():` and step every k batches yourself"
            )


def to_distributed_strategy(strategy: Strategy, *, mode: str):
    """A ``fleet.DistributedStrategy`` with the knobs of ``strategy`` set (after :func:`check`)."""
    from paddle.distributed import fleet

    check(strategy, mode=mode)
    native = fleet.DistributedStrategy()
    if strategy.bucket_size_mb is not None:
        native.fuse_grad_size_in_MB = int(max(1, round(strategy.bucket_size_mb)))
        native.fuse_all_reduce_ops = True
    if strategy.hierarchical_allreduce:
        native.use_hierarchical_allreduce = True
    if strategy.localsgd_steps is not None:
        native.localsgd = True
        native.localsgd_configs = {"k_steps": strategy.localsgd_steps,
                                   "begin_step": strategy.localsgd_warmup_steps + 1}
    if strategy.gradient_compression == "fp16":
        native.fp16_allreduce = True
    if strategy.sync_batchnorm:
        native.sync_batch_norm = True
    if strategy.find_unused_parameters:  # read by fleet.distributed_model's DataParallel
        native.find_unused_parameters = True
    if strategy.gradient_accumulation > 1:
        native.gradient_merge = True
        native.gradient_merge_configs = {"k_steps": strategy.gradient_accumulation, "avg": True}
    return native


def synchronised_batchnorm(model):
    """``model`` (a dygraph Layer) with its batch normalisation layers made ``paddle.nn.SyncBatchNorm``
    (parameters kept, so an optimizer built before still updates them); ``model`` itself when it has none.
    Off a GPU, where Paddle has no such kernel, raises :class:`UnsupportedStrategy` on every rank alike."""
    import paddle

    norms = (paddle.nn.layer.norm._BatchNormBase, paddle.nn.BatchNorm)
    layers = [name or type(layer).__name__ for name, layer in model.named_sublayers(include_self=True)
              if isinstance(layer, norms) and not isinstance(layer, paddle.nn.SyncBatchNorm)]
    if not layers:
        return model
    shown = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    if not paddle.get_device().startswith("gpu"):
        raise UnsupportedStrategy(
            f"Strategy(sync_batchnorm=True): Paddle runs SyncBatchNorm on GPUs only and this rank trains on "
            f"{paddle.get_device()}, so the batch normalisation layers ({shown}) cannot be synchronised here; launch "
            "on GPUs, or drop the knob (dp.init() without it, or convert without --sync-batchnorm): each rank then "
            "normalises over its own share of the batch")
    legacy = [name for name, layer in model.named_sublayers(include_self=True) if type(layer) is paddle.nn.BatchNorm]
    if legacy:
        raise UnsupportedStrategy(
            f"Strategy(sync_batchnorm=True): {', '.join(legacy[:4])} is a paddle.nn.BatchNorm, which "
            "SyncBatchNorm.convert_sync_batchnorm does not convert; build it as paddle.nn.BatchNorm1D/2D/3D")
    return paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
