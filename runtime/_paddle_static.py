"""Static graph (``paddle.enable_static()``) data parallelism: Fleet's ``minimize`` on GPU, Paddle's own
collective op on CPU.

Measured with Paddle 3.3.1 on CPU (issue 9): ``fleet.distributed_optimizer(opt).minimize(loss)`` fails
with the default PIR (``clone(): incompatible function arguments ... for_test=False``) and, with
``FLAGS_enable_pir_api=0``, with ``comm_id must be generated in paddlepaddle-xpu`` (its collective
program rewrite has CUDA and XPU branches only). What trains on CPU: the process group started while
still in dynamic mode (``fleet.init`` calls ``init_parallel_env``), then, in the static program,
``paddle.distributed.all_reduce`` on every gradient (an all-reduce op appended to the program) and the
average applied by the optimizer: :class:`AllReduceGradientsOptimizer`. On GPU builds Fleet's own
``minimize`` (its meta-optimizers honour the Strategy's knobs) is kept; its program is
``fleet.main_program`` / the default main program and its place ``dp.device()``.

Parameters start equal on every rank, as Fleet's own ``minimize`` makes them (it broadcasts them in
the startup program): measured here, two processes running one unseeded static script initialise
different parameters (Paddle 3.3.1), and averaged gradients would then never bring them together.
:func:`broadcast_parameters_at_startup` puts a broadcast from rank 0 before each ``set_parameter`` op of
the startup program, so ``exe.run(startup_program)`` leaves rank 0's values on every rank.

With ``FLAGS_enable_pir_api=0`` (the old program IR) Paddle 3.3.1's static ``all_reduce`` itself fails on
CPU (``TypeError`` in ``LayerHelper``: it names the op by its ``ReduceOp``), so ``minimize`` says so.
"""

from __future__ import annotations

import paddle
import paddle.distributed as dist


def start_process_group_in_dynamic_mode(start) -> None:
    """Run ``start()`` (``fleet.init``) in dynamic mode, then return to static mode."""
    paddle.disable_static()
    try:
        start()
    finally:
        paddle.enable_static()


class AllReduceGradientsOptimizer:
    """An optimizer whose ``minimize`` averages every gradient over the ranks inside the static program.

    ``minimize(loss, startup_program=None, parameters=None, no_grad_set=None)`` is the static
    optimizer's: ``backward``, then one ``all_reduce`` op per gradient and a division by the world
    size, then ``apply_gradients``. Other attributes are the wrapped optimizer's.
    """

    def __init__(self, optimizer, world_size: int):
        self._optimizer = optimizer
        self._world_size = world_size

    def minimize(self, loss, startup_program=None, parameters=None, no_grad_set=None):
        if not paddle.framework.in_pir_mode():
            raise RuntimeError(
                "static graph data parallelism on CPU needs PIR, Paddle 3's default program representation: "
                "FLAGS_enable_pir_api=0 is set, and with it Paddle 3.3.1's static all_reduce fails (TypeError in "
                "LayerHelper) as Fleet's own minimize does on CPU. Unset FLAGS_enable_pir_api, or train on GPUs"
            )
        broadcast_parameters_at_startup(startup_program or paddle.static.default_startup_program())
        # positionally: a decorated optimizer (paddle.static.amp.decorate) names the third one parameter_list
        params_grads = self._optimizer.backward(loss, startup_program, parameters, no_grad_set)
        averaged = []
        for param, grad in params_grads:
            if grad is None:
                averaged.append((param, grad))
                continue
            dist.all_reduce(grad)  # in static mode: an all-reduce op on this gradient, in the program
            averaged.append((param, grad / self._world_size))
        if isinstance(self._optimizer, paddle.optimizer.Optimizer):
            optimize_ops = self._optimizer.apply_gradients(averaged)
        else:  # a decorator's own update (AMP: unscale, check for inf, then step)
            optimize_ops = self._optimizer.apply_optimize(loss, startup_program, averaged)
        return optimize_ops, averaged

    def __getattr__(self, name):
        return getattr(self._optimizer, name)


def broadcast_parameters_at_startup(startup_program) -> int:
    """Make the startup program broadcast every parameter from rank 0 before storing it; returns how many.

    Idempotent: a program already given its broadcasts (a second ``minimize``) is left as it is.
    """
    if getattr(startup_program, "_dpmigrate_broadcast", False):
        return 0
    from paddle import pir

    setters = [op for op in startup_program.global_block().ops if op.name() == "builtin.set_parameter"]
    with paddle.static.program_guard(startup_program):
        for op in setters:
            pir.set_insertion_point(op)
            dist.broadcast(op.operand_source(0), src=0)  # an op in the startup program, before the store
        pir.reset_insertion_point_to_end()
    startup_program._dpmigrate_broadcast = True
    return len(setters)
