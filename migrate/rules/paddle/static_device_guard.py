"""A dygraph training loop under ``paddle.static.device_guard``: the file is read as static graph and left alone, said."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule

_GUARD = "paddle.static.device_guard"
# what dygraph scripts also call under paddle.static without building a program (jit.save's specs, to_static's options)
_NOT_A_PROGRAM = frozenset({_GUARD, "paddle.static.InputSpec", "paddle.static.BuildStrategy",
                            "paddle.static.ExecutionStrategy"})


class StaticDeviceGuard(Rule):
    """Decline, at the guard, a file whose only static-graph call is ``paddle.static.device_guard`` around a dygraph loop.

    Why: ``device_guard`` places operators of a static program; a file that names it is read as static graph,
    and none of the dygraph rules run. CNN_DSMC's trainers (issue 19 audit) wrap their dygraph loop
    (``loss.backward()``, ``opt.step()``) in ``with paddle.static.device_guard('gpu'):``: converted as static, they
    got prints and saves on the main process and nothing else, and only the summary said that no data was sharded,
    while each rank trained its own model on all the data (unseeded: each its own initialisation). Converting them as
    dygraph is no fix either: the Burgers PINN then fails on 2 ranks (its parameters are used outside ``forward``,
    through ``paddle.grad``). The site is declined with what happens and how to convert it by hand.
    Example:  with paddle.static.device_guard('gpu'):   ->  (unchanged) declined: every rank trains on its own
                  for epoch in range(E): ... loss.backward(); opt.step()
    Leaves alone: files that build a program (``static.data``, ``Executor``, ``program_guard``...): real static graph.
    """

    name = "static-device-guard"
    checks_only = True
    declines_training = True
    generations = ("static",)

    def finish(self) -> None:
        calls = list(self.q.index.of_type(self.ctx.module, cst.Call))
        guards = [c for c in calls if self.q.is_call_to(c, {_GUARD})]
        if not guards or not self.q.has_backward(self.ctx.module):
            return
        if any(self.q.callee_starts_with(c, "paddle.static.") and not self.q.is_call_to(c, _NOT_A_PROGRAM) for c in calls):
            return  # it builds a static program too
        self.report(guards[0], "declined", "this file trains in dygraph mode (loss.backward(), an optimizer step) under "
                    "paddle.static.device_guard, a static-graph API: read as static graph, its model, optimizer and data "
                    "were not converted, so every rank trains its own model on all the data (no speed-up; unless the "
                    "script seeds paddle, each rank starts from its own initialisation)",
                    "device_guard does nothing to a dygraph loop: remove the `with paddle.static.device_guard(...)` line "
                    "(dedent its body), convert again, and check the result with `dpmigrate verify` (parameters used "
                    "outside forward, e.g. through paddle.grad, need find_unused_parameters or a hand-written step)")
