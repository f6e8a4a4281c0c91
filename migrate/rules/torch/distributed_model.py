"""Wrap each trained model in DDP once it is built, on its device, and initialised."""

from __future__ import annotations

from ...codemod.models import SELF_TRAINED, SELF_TRAINED_FIX, Models, trains_itself
from ...codemod.rule import Rule


class DistributedModel(Rule):
    """Insert ``model = dp.distributed_model(model)`` after the model's last set-up statement.

    Why: DDP averages the gradients of all ranks during ``backward()``; without it every rank trains
    its own model. It must see the model on its device (after ``.to(device)``) and after the
    script's own initialisation (``apply(weights_init)``, ``load_state_dict``), since it broadcasts
    rank 0's weights when it is built.
    Example:  model = Net().to(device)          model = Net().to(device)
              optimizer = optim.SGD(...)   ->   model = dp.distributed_model(model)
                                                optimizer = optim.SGD(...)
    A model is what an optimizer (``torch.optim.*``, by qualified name, or the script's own class)
    takes the parameters of, or whose ``.parameters()`` a training function updates by hand. The insertion goes after the last
    statement that assigns the model or calls one of its methods, before the first loop or
    training call of the block that builds it.
    A block that builds and trains the model (the ``if __name__ == "__main__":`` block, a ``with``) is
    entered: the wrap goes inside it, before the training. Models are followed by binding, not by name
    (:mod:`~dpmigrate.codemod.bindings`): a name rebuilt with a new model is wrapped at each construction
    an optimizer trains, and a model handed to the function that trains it (``fit(net)``) is wrapped
    where each caller builds it.
    Leaves alone: a model built in another function than the one that uses it (and not handed over by
    name), held in an attribute (``self.model``), or built and trained inside one ``if``/loop/``try``:
    declined, wrap it where it is built.
    """

    name = "distributed-model"

    def finish(self) -> None:
        for found in self.ctx.analysis(Models).sites:
            name, site = found.name, found.site
            if found.verdict == "attribute" and trains_itself(self.q, site):
                self.report(site, "declined", SELF_TRAINED, SELF_TRAINED_FIX)
            elif found.verdict == "attribute":
                self.report(
                    site, "declined",
                    "the model is held in an attribute (self....): cannot tell where it is built and placed",
                    "where it is assigned and moved to its device, add `self.model = dp.distributed_model(self.model)`",
                )
            elif found.verdict == "elsewhere":
                self.report(
                    site, "declined",
                    f"`{name}` is built outside the function that trains it; cannot tell where to wrap it",
                    f"where `{name}` is built and moved to its device, add `{name} = dp.distributed_model({name})`",
                )
            elif found.verdict == "closure":
                self.report(
                    site, "note",
                    f"`{name}` is trained by a closure optimizer (LBFGS): it is not wrapped in DDP (each step runs "
                    "several backward passes); dp.distributed_optimizer starts every rank from rank 0's parameters, "
                    "averages the gradients of every closure call and the loss LBFGS decides on",
                )
            elif found.verdict == "returned":
                self.report(
                    site, "declined",
                    f"`{name}` is returned by a function that is called more than once, or whose result is not "
                    "assigned to plain names: cannot tell where the caller puts it on its device",
                    "where the caller has built and placed it, add `model = dp.distributed_model(model)`",
                )
            elif found.verdict == "inside":
                self.report(
                    site, "declined",
                    f"`{name}` is built and trained inside one block (an `if`, a loop or a `try`): wrapping it "
                    "after the block would be too late",
                    f"inside that block, after `{name}` is built and moved to its device, add "
                    f"`{name} = dp.distributed_model({name})`",
                )
            else:
                self.ctx.plan.insert_after(found.anchor, self.statement(f"{name} = {{dp}}.distributed_model({name})\n"))
                self.report(
                    found.anchor, "change",
                    f"{name} = dp.distributed_model({name}) after its set-up: DDP averages gradients across ranks",
                )
