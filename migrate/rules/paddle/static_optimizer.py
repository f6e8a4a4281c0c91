"""Static graph: the optimizer whose ``minimize`` builds the training program averages gradients over the ranks."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from .static_common import minimize_calls, optimizer_constructor, simple_assignments


class StaticDistributedOptimizer(Rule):
    """Wrap the optimizer a static-graph script calls ``minimize`` on in ``dp.distributed_optimizer(...)``.

    Why: in static graph mode the gradients are averaged by ops that ``minimize`` writes into the main
    program. ``dp.distributed_optimizer`` returns an optimizer whose ``minimize`` does that: Fleet's
    (``fleet.distributed_optimizer(opt, strategy).minimize``) on GPU builds, and on CPU builds (where
    Fleet's fails in Paddle 3.3.1) one ``all_reduce`` op per gradient plus a broadcast of the initial
    parameters from rank 0 in the startup program. Not launched, it is the optimizer itself.
    Example:  optimizer = paddle.optimizer.SGD(learning_rate=0.1)
           -> optimizer = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1))
    Matched by qualified name (``paddle.optimizer.*``, ``paddle.fluid.optimizer.*``) and only for an
    optimizer whose ``minimize`` the file calls. Leaves alone (declined): an optimizer variable
    assigned more than once.
    """

    name = "static-distributed-optimizer"
    generations = ("static",)

    def finish(self) -> None:
        assigned = simple_assignments(self.q)
        done: set[int] = set()
        for call, owner, built in minimize_calls(self.q):
            if isinstance(owner, cst.Name):
                builds = [a for a in assigned.get(owner.value, ()) if optimizer_constructor(self.q, a.value)]
                if len(assigned.get(owner.value, ())) != 1:
                    self.report(call, "declined", f"{owner.value} is assigned more than once, so which optimizer "
                                "minimize runs is not clear", f"wrap the one used here: {owner.value} = "
                                f"dp.distributed_optimizer({owner.value}) right before {owner.value}.minimize(...)")
                    continue
                target = builds[0].value
            else:
                target = owner
            if id(target) in done:
                continue
            done.add(id(target))
            self.ctx.plan.replace(target, lambda updated: self.dp_call("distributed_optimizer", updated))
            self.report(target, "change", f"{built.rsplit('.', 1)[-1]}(...) -> dp.distributed_optimizer(...): its "
                        "minimize averages the gradients over the ranks (Fleet's on GPU, all_reduce ops on CPU)")
