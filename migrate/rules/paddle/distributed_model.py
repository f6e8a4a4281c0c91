"""Wrap each trained dygraph Layer with Fleet once it is built and initialised."""

from __future__ import annotations

import libcst as cst

from ...codemod.bindings import Bindings
from ...codemod.calls import argument
from ...codemod.models import SELF_TRAINED, SELF_TRAINED_FIX, Models, trains_itself
from ...codemod.query import optimizer_class, parameter_owners
from ...codemod.rule import Rule
from ._analyses import HighLevelModels, assigned_names, step_calls


class PaddleDistributedModel(Rule):
    """Insert ``model = dp.distributed_model(model)`` after the model's last set-up statement.

    Why: ``fleet.distributed_model`` (a ``paddle.DataParallel``) averages the gradients of all ranks
    during ``backward()`` and starts every rank from rank 0's parameters; without it every rank trains
    its own model. It must come after the script's own initialisation (``set_state_dict``...).
    Example:  model = MLP()                           model = MLP()
              opt = paddle.optimizer.SGD(     ->      model = dp.distributed_model(model)
                  parameters=model.parameters())      opt = paddle.optimizer.SGD(parameters=model.parameters())
    A model is what a ``paddle.optimizer.*`` takes the ``parameters=`` of (the same analysis as the
    torch rule: factories, ``__main__`` blocks, trainer classes keeping it in ``self.model``), followed by
    binding: a name rebuilt with a new model (``model = Net()`` again) or reused for a plain Layer after a
    ``paddle.Model`` is wrapped at each construction an optimizer trains (``codemod/bindings.py``).
    Leaves alone: a network handed to ``paddle.Model(...)`` (the high-level API wraps it itself in
    ``prepare``: wrapping it twice is wrong); a model built in another function than the one that
    trains it, or built and trained inside one ``if``/loop/``try`` (declined, with the fix);
    static-graph files.
    """

    name = "paddle-distributed-model"
    generations = ("dygraph",)

    def finish(self) -> None:
        high_level = self.ctx.analysis(HighLevelModels)
        self._stepped_outside_the_api(high_level)
        for found in self.ctx.analysis(Models).sites:
            name, site = found.name, found.site
            later = []
            if isinstance(site, cst.Call) and high_level.trained_outside(site, name):
                later = self._models_built_after(site, name, high_level)
                if not later:
                    self._wrap_before(site, name, high_level)
                    continue
            if high_level.holds(site, name) and not later:
                continue  # paddle.Model(network).prepare(...) wraps it in DataParallel itself
            for construction in later:
                network = argument(construction, 0, "network")
                self.ctx.plan.replace(network.value, lambda value: self.dp_call("unwrap", value))
                self.report(construction, "change", f"paddle.Model(dp.unwrap({name})): built after the plain loop that "
                            f"trained `{name}` (wrapped where it is built), it holds the network itself, as in the "
                            "original (its own prepare() wraps it for fit/evaluate)")
            if found.verdict == "attribute" and trains_itself(self.q, site):
                self.report(site, "declined", SELF_TRAINED, SELF_TRAINED_FIX)
            elif found.verdict == "attribute":
                self.report(
                    site, "declined",
                    "the model is held in an attribute (self....): cannot tell where it is built",
                    "where it is assigned, add `self.model = dp.distributed_model(self.model)`",
                )
            elif found.verdict == "elsewhere":
                self.report(
                    site, "declined",
                    f"`{name}` is built outside the function that trains it; cannot tell where to wrap it",
                    f"where `{name}` is built, add `{name} = dp.distributed_model({name})`",
                )
            elif found.verdict == "returned":
                self.report(
                    site, "declined",
                    f"`{name}` is returned by a function that is called more than once, or whose result is not "
                    "assigned to plain names: cannot tell where the caller finishes setting it up",
                    "where the caller has built it, add `model = dp.distributed_model(model)`",
                )
            elif found.verdict == "closure":
                self.report(site, "note", f"`{name}` is trained by a closure optimizer (LBFGS): it is not wrapped in "
                            "DataParallel (each step runs several backward passes); dp.distributed_optimizer starts "
                            "every rank from rank 0's parameters, averages the gradients of every closure call and "
                            "the loss LBFGS decides on")
            elif found.verdict == "inside":
                self.report(
                    site, "declined",
                    f"`{name}` is built and trained inside one block (an `if`, a loop or a `try`): wrapping it "
                    "after the block would be too late",
                    f"inside that block, after `{name}` is built, add `{name} = dp.distributed_model({name})`",
                )
            elif high_level.becomes_model(found.anchor, name):
                self.report(found.anchor, "note", f"`{name}` names a paddle.Model by the time it would be wrapped here: "
                            "its prepare() wraps the network in DataParallel, so dp.distributed_model is not added")
            else:
                self.ctx.plan.insert_after(found.anchor, self.statement(f"{name} = {{dp}}.distributed_model({name})\n"))
                self.report(
                    found.anchor, "change",
                    f"{name} = dp.distributed_model({name}) after its set-up: fleet's DataParallel averages "
                    "gradients across ranks (state_dict keys unchanged)",
                )

    def _stepped_outside_the_api(self, high_level: HighLevelModels) -> None:
        """An optimizer over a ``paddle.Model``'s parameters that a plain loop steps, never given to ``prepare``:
        the network the ``paddle.Model`` was built over is wrapped before it (the loop calls that network), or the
        optimizer is declined where that network cannot be told."""
        if not high_level.names:
            return
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if optimizer_class(self.q, call) is None or high_level.prepares(call):
                continue
            for name in parameter_owners(self.q, call):
                if not high_level.holds(call, name, networks=False):
                    continue
                network = high_level.network_of(call, name)
                if network is not None:
                    self._wrap_before(call, network, high_level)
                else:
                    self.report(call, "declined", f"this optimizer steps the parameters of paddle.Model `{name}` but is "
                                "not given to its prepare(): nothing averages its gradients",
                                "build it over the network the loop calls (`net.parameters()`) and add "
                                "`net = dp.distributed_model(net)` before it")
                break

    def _models_built_after(self, optimizer: cst.Call, name: str, high_level: HighLevelModels) -> list[cst.Call]:
        """The ``paddle.Model(name)`` calls over the network ``optimizer`` trains, when every one comes after the last
        step of that optimizer in the same function: a plain loop trains the Layer, and a ``paddle.Model`` is built
        over it afterwards, only to save, summarise or evaluate (a tabular Transformer's trainer, issue 19's round Q:
        declined, with a fix placed before the optimizer that could not be followed, while the loader was sharded).
        Empty when any of them comes earlier, or the optimizer's steps cannot be told."""
        bindings = self.ctx.analysis(Bindings)
        scope = self.q.function_of(optimizer)
        reaching = bindings.reaching(optimizer, name)
        over = [c for c in high_level.constructions
                if isinstance(getattr(argument(c, 0, "network"), "value", None), cst.Name)
                and argument(c, 0, "network").value.value == name and bindings.reaching(c, name) is reaching]
        steps = step_calls(self.q, optimizer, assigned_names(self.q, optimizer))
        if reaching is None or not over or not steps:
            return []
        last = max(self.ctx.positions[c].end.line for c in steps)
        if all(self.q.function_of(c) is scope and self.ctx.positions[c].start.line > last for c in over):
            return over
        return []

    def _wrap_before(self, optimizer: cst.Call, name: str, high_level: HighLevelModels) -> None:
        """A network a ``paddle.Model`` trains with ``fit``, then trained again by a plain loop with its own
        optimizer: wrapped just before that optimizer is built, after the high-level API is done with it (its
        ``prepare`` wraps it for ``fit`` only). Measured: the two ranks then match one process; left raw, each rank
        trained its own half apart. A ``paddle.Model`` built and never called (a tutorial's left-over,
        Hupengyu's MNIST) is no obstacle either: the loop is the network's only training."""
        statement = self.q.statement_of(optimizer)
        uses = [c.call for c in high_level.calls if self.q.function_of(c.call) is self.q.function_of(optimizer)
                and not self.q.index.contains(optimizer, c.call)]  # (its own `model.parameters()` is no use)
        positions = self.ctx.positions
        before = all(positions[u].start.line < positions[optimizer].start.line for u in uses)
        placed = isinstance(self.q.parent(statement), (cst.Module, cst.IndentedBlock))
        if not (before and (uses or not high_level.calls) and placed
                and self.q.function_of(statement) is self.q.function_of(optimizer)):
            self.report(optimizer, "declined", f"`{name}` is trained here outside the paddle.Model that holds it "
                        "(its prepare() wraps it for fit/evaluate only): nothing averages this optimizer's gradients",
                        f"after the paddle.Model calls, add `{name} = dp.distributed_model({name})` before this "
                        "optimizer is built, and train through that name")
            return
        self.ctx.plan.insert_before(statement, self.statement(f"{name} = {{dp}}.distributed_model({name})\n"))
        self.report(optimizer, "change", f"{name} = dp.distributed_model({name}) before this optimizer: a plain loop "
                    f"trains `{name}`, which a paddle.Model also holds (its prepare() wraps it for fit/evaluate "
                    "only), so its gradients are averaged here too")
