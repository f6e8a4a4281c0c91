"""Static graph: the optimizer whose ``minimize`` builds the training program averages gradients over the ranks."""

from __future__ import annotations

import libcst as cst

from ...codemod.bindings import Bindings, value_of
from ...codemod.rule import Rule
from .graph_mode import stands_down
from .static_common import minimize_calls, simple_assignments


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
    optimizer whose ``minimize`` the file calls. A variable assigned twice (``optimizer = SGD(...)``, then
    ``optimizer = paddle.static.amp.decorate(optimizer)``) gets the value ``minimize`` runs on wrapped: the
    last plain assignment before it in the same function (the outermost optimizer, whose ``minimize`` builds
    the program).
    Leaves alone (declined): a variable whose value there cannot be told (assigned in
    branches, or not by a plain ``name = value``).
    """

    name = "static-distributed-optimizer"
    generations = ("static",)

    def finish(self) -> None:
        if stands_down(self.ctx):
            return
        done: set[int] = set()
        for call, owner, built, target in minimized(self.ctx):
            if target is None:
                self.report(call, "declined", f"{owner.value} is assigned more than once, and which of its values "
                            "minimize runs cannot be told from the code before it", f"wrap the one used here: "
                            f"{owner.value} = {self.ctx.alias}.distributed_optimizer({owner.value}) on the line right "
                            f"before {owner.value}.minimize(...) (it runs on Paddle 3's default PIR)")
                continue
            if id(target) in done:  # one optimizer minimizing two programs (a GAN's two losses): wrapped once
                continue
            done.add(id(target))
            self.ctx.plan.replace(target, lambda updated: self.dp_call("distributed_optimizer", updated))
            self.report(target, "change", f"{built.rsplit('.', 1)[-1]}(...) -> {self.ctx.alias}.distributed_optimizer(...): "
                        "its minimize averages the gradients over the ranks (Fleet's on GPU, all_reduce ops on CPU)")


def minimized(ctx) -> list[tuple[cst.Call, cst.BaseExpression, str, cst.BaseExpression | None]]:
    """``(minimize call, optimizer expression, class, the value to wrap or None when it cannot be told)``."""
    q = ctx.query
    assigned = simple_assignments(q)
    found = []
    for call, owner, built in minimize_calls(q):
        target = _reaching(ctx, call, owner.value, assigned) if isinstance(owner, cst.Name) else owner
        found.append((call, owner, built, target))
    return found


def _reaching(ctx, call: cst.Call, name: str, assigned) -> cst.BaseExpression | None:
    """The value ``name`` holds at ``call``: its one assignment, or the last plain one before it in its block."""
    q = ctx.query
    assigns = assigned.get(name, ())
    if len(assigns) == 1:
        return assigns[0].value
    statement = ctx.analysis(Bindings).reaching(call, name)
    value = value_of(statement, name)
    if value is None or q.block_of(statement) is not q.block_of(_top(q, call, statement)):
        return None
    return value


def _top(q, call: cst.Call, statement: cst.CSTNode) -> cst.CSTNode:
    """The statement holding ``call`` in the block of ``statement`` (``call``'s own when it is not nested there)."""
    block = q.block_of(statement)
    own = q.statement_of(call)
    for ancestor in [own, *q.ancestors(own)]:
        if isinstance(ancestor, cst.BaseStatement) and q.block_of(ancestor) is block:
            return ancestor
    return own
