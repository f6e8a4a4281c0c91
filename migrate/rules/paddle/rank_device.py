"""Put each rank on its own card instead of the first GPU."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.rule import Rule

SET_DEVICE = {"paddle.set_device", "paddle.device.set_device"}
CUDA_PLACE = {"paddle.CUDAPlace", "paddle.base.core.CUDAPlace"}
GET_DEVICE = {"paddle.device.get_device", "paddle.get_device"}  # the current device: "gpu:0" on every rank of a GPU job


def gpu_string(node: cst.CSTNode | None) -> bool:
    """``"gpu"`` or ``"gpu:N"`` as a string literal."""
    if not isinstance(node, cst.SimpleString):
        return False
    value = node.evaluated_value
    return isinstance(value, str) and (value == "gpu" or value.startswith("gpu:"))


class PaddleRankDevice(Rule):
    """Replace hard-coded GPU cards with this rank's: ``paddle.set_device(dp.device())``.

    Why: launched on N processes, ``paddle.set_device("gpu:0")`` and ``paddle.CUDAPlace(0)`` put every
    rank on card 0. ``dp.device()`` is ``"gpu:<local rank>"`` (or ``"cpu"`` on a machine without one).
    Example:  paddle.set_device("gpu")                 -> paddle.set_device(dp.device())
              paddle.set_device("gpu" if use_gpu else "cpu")
           -> paddle.set_device(dp.device() if use_gpu else "cpu")   (the script's flag still rules)
              paddle.set_device(args.device)
           -> paddle.set_device(dp.device() if args.device.startswith("gpu") else args.device)
              paddle.device.set_device(paddle.device.get_device())   (an MLP homework's "the default device")
           -> the same, with ``dp.device()`` when it names a GPU
              place = paddle.CUDAPlace(0)             -> place = paddle.CUDAPlace(dp.local_rank())
              x = x.cuda(0)                           -> x = x.cuda(dp.local_rank())   (``.cuda()`` follows set_device)
    Leaves alone: ``"cpu"`` (a CPU script stays on the CPU); a device computed by a call (declined);
    ``CUDA_VISIBLE_DEVICES`` set by the script (declined); static-graph files (the static rules).
    """

    name = "paddle-rank-device"
    generations = ("dygraph",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.q.is_call_to(node, SET_DEVICE):
            self._set_device(node)
        elif m.matches(node.func, m.Attribute(attr=m.Name("cuda"))) and node.args and isinstance(
            node.args[0].value, cst.Integer
        ) and not (isinstance(node.func.value, (cst.Name, cst.Attribute)) and self.q.named_under(node.func.value, "paddle")):
            arg = node.args[0]
            self.ctx.plan.replace(arg, lambda a: a.with_changes(value=self.dp("local_rank()")))
            self.report(node, "change", f".cuda({self.code(arg.value)}) -> .cuda(dp.local_rank()): this rank's card")
        elif self.q.is_call_to(node, CUDA_PLACE) and node.args:
            arg = node.args[0]
            self.ctx.plan.replace(arg, lambda a: a.with_changes(value=self.dp("local_rank()")))
            self.report(node, "change", f"{self.code(node)} -> paddle.CUDAPlace(dp.local_rank()): this rank's card")

    def _set_device(self, node: cst.Call) -> None:
        arg = argument(node, 0, "device")
        if arg is None:
            return
        value = arg.value
        if gpu_string(value):
            self.ctx.plan.replace(arg, lambda a: a.with_changes(value=self.dp("device()")))
            self.report(node, "change", f"set_device({self.code(value)}) -> set_device(dp.device()): this rank's card "
                        "(or the CPU)")
        elif isinstance(value, cst.IfExp) and gpu_string(value.body):
            self.ctx.plan.replace(value, lambda v: v.with_changes(body=self.dp("device()")))
            self.report(node, "change", "the GPU branch of this device choice -> dp.device(): this rank's card; "
                        "the script's condition still decides")
        elif isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)) or self.q.is_call_to(value, GET_DEVICE):
            def rewrite(updated: cst.Arg) -> cst.Arg:
                starts = cst.Call(cst.Attribute(updated.value.deep_clone(), cst.Name("startswith")),
                                  [cst.Arg(cst.SimpleString('"gpu"'))])
                return updated.with_changes(value=cst.IfExp(test=starts, body=self.dp("device()"), orelse=updated.value))

            self.ctx.plan.replace(arg, rewrite)
            self.report(node, "change", f"set_device({self.code(value)}) -> dp.device() when it names a GPU (this "
                        f"rank's card), else as given: `{self.code(value)}` still picks the kind of device")
        elif not isinstance(value, cst.SimpleString):
            self.report(node, "declined",
                        f"the device comes from `{self.code(value)}`: launched on N processes every rank would use "
                        "that same card",
                        "use paddle.set_device(dp.device()) (this rank's card, or the CPU) when it names a GPU")

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if m.matches(target.target, m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))])) and (
                "CUDA_VISIBLE_DEVICES" in self.code(target.target)
            ):
                self.report(
                    node, "declined",
                    "sets CUDA_VISIBLE_DEVICES: launched on N processes, every rank would see the same cards",
                    "remove it and let dpmigrate launch (or paddle.distributed.launch) place ranks; "
                    "dp.device() picks this rank's card",
                )
