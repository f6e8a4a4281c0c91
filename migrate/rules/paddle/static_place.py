"""Static graph: the executor runs on this rank's card, not on card 0 on every rank."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from .graph_mode import stands_down
from .static_common import CUDA_PLACES


class StaticPlace(Rule):
    """Turn ``paddle.CUDAPlace(<n>)`` into this rank's card: ``paddle.set_device(dp.device())``.

    Why: launched on N processes of one machine, ``CUDAPlace(0)`` puts every rank's executor on card 0.
    ``dp.device()`` is this rank's (``"gpu:<local rank>"``, or ``"cpu"`` on a CPU build), and
    ``paddle.set_device`` returns it as a Place, so ``place`` is still a Place for ``Executor(place)`` and
    anything else that takes one. Not launched, it is card 0 as before.
    Example:  place = paddle.CUDAPlace(0)  ->  place = paddle.set_device(dp.device())
    Leaves alone: ``paddle.CPUPlace()`` (every rank on the CPU is right) and ``Executor()`` without a place
    (Paddle takes the card from ``FLAGS_selected_gpus``, which its launcher sets per rank).
    """

    name = "static-place"
    generations = ("static",)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, CUDA_PLACES) or stands_down(self.ctx):
            return
        if not (isinstance(node.func, cst.Attribute) and self.q.is_call_to(node, {"paddle.CUDAPlace"})):
            self.report(node, "declined", f"{self.code(node)} puts every rank on the same card",
                        "use paddle.set_device(dp.device()) (this rank's card, as a Place) instead")
            return
        paddle = self.code(node.func.value)
        self.ctx.plan.replace(node, lambda _: cst.Call(
            func=cst.parse_expression(f"{paddle}.set_device"), args=[cst.Arg(self.dp("device()"))]))
        self.report(node, "change", f"{self.code(node)} -> {paddle}.set_device(dp.device()): this rank's card (a Place)")
