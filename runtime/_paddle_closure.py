"""A closure optimizer (``paddle.optimizer.LBFGS``, ``opt.step(closure)``) on several ranks.

Fleet's distributed optimizer has no ``step(closure)`` (``HybridParallelOptimizer.step() takes 1 positional
argument but 2 were given``: the LBFGS example of Paddle's API docs failed on both ranks, issue 19 audit round K),
and a ``DataParallel`` model averages one backward pass per forward, while LBFGS runs the closure several times per
step and decides its line search on the loss the closure returns. So, as the torch backend does for its LBFGS:
the model is left unwrapped (the conversion says so), and this optimizer

- gives every rank rank 0's parameters when it is made (what ``DataParallel`` would have done);
- wraps the closure so that after each call the gradients are averaged over the ranks (``all_reduce`` of each
  gradient, then divided by the number of ranks) and the loss it returns is the mean over the ranks: every rank
  then takes the same line search and the same step, the one a single process takes on the global batch.

Everything else is the optimizer's own (attribute access is forwarded).
"""

from __future__ import annotations

import paddle
import paddle.distributed as dist


class ClosureAveragingOptimizer:
    """``optimizer`` whose ``step(closure)`` averages each closure call's gradients over ``world_size`` ranks, and its
    loss with ``mean``."""

    def __init__(self, optimizer, world_size: int, mean):
        self._dpmigrate_inner = optimizer
        self._dpmigrate_world_size = world_size
        self._dpmigrate_mean = mean  # the runtime's all_reduce(value, "mean"): tensors and numbers alike
        with paddle.no_grad():
            for parameter in self._dpmigrate_parameters():
                dist.broadcast(parameter, src=0)

    def _dpmigrate_parameters(self) -> list:
        inner = self._dpmigrate_inner
        found = getattr(inner, "_parameter_list", None) or getattr(inner, "_params", None) or []
        return [p for group in found for p in (group["params"] if isinstance(group, dict) else [group])]

    def step(self, closure):
        world_size = self._dpmigrate_world_size

        def averaged():
            loss = closure()
            with paddle.no_grad():
                for parameter in self._dpmigrate_parameters():
                    if parameter.grad is not None:
                        grad = parameter.grad
                        dist.all_reduce(grad)
                        grad.scale_(1.0 / world_size)
            return loss if loss is None else self._dpmigrate_mean(loss)

        return self._dpmigrate_inner.step(averaged)

    def __getattr__(self, name):
        return getattr(self._dpmigrate_inner, name)
