"""Put each rank on its own device instead of the first GPU."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule

_CUDA_AVAILABLE = "torch.cuda.is_available"
_KEPT_TO_KWARGS = {"non_blocking", "memory_format", "copy", "dtype"}


def cuda_string(node: cst.CSTNode | None) -> bool:
    """``"cuda"`` or ``"cuda:N"`` as a string literal."""
    if not isinstance(node, cst.SimpleString):
        return False
    value = node.evaluated_value
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))


def cpu_string(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.SimpleString) and node.evaluated_value == "cpu"


def cuda_template(node: cst.CSTNode | None) -> bool:
    """A CUDA device string built from a value: ``"cuda:{}".format(i)``, ``f"cuda:{i}"``, ``"cuda:%d" % i``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        return cuda_string(node.func.value)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
        return cuda_string(node.left)
    if isinstance(node, cst.FormattedString):
        first = node.parts[0] if node.parts else None
        return isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda")
    return False


class RankDevice(Rule):
    """Replace hard-coded CUDA devices with ``dp.device()``: this rank's GPU, or the CPU.

    Why: launched on N processes, ``torch.device("cuda")``, ``.cuda()`` and ``.to(0)`` put every rank
    on GPU 0; ``dp.device()`` is ``cuda:LOCAL_RANK`` (or the CPU when there is no GPU).
    Example:  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
           -> device = dp.device()
              model.cuda()          -> model.to(dp.device())
              torch.device("cuda" if use_cuda else "cpu")
           -> dp.device() if use_cuda else torch.device("cpu")   (the script's own flags still rule)
    ``torch.accelerator.current_accelerator()`` becomes ``dp.device()`` too (its ``.type`` is left:
    a device type without an index means the current device, which ``dp.init()`` pins).
    ``torch.cuda.set_device(...)`` is removed: ``dp.init()`` pins this rank's GPU.
    ``torch.device(args.device)`` becomes ``dp.device() if torch.device(args.device).type == "cuda"
    else torch.device(args.device)``: the flag still picks the kind of device, the rank picks the card.
    Leaves alone: ``torch.device("cpu")`` and ``"mps"`` (a CPU-only script stays on the CPU); a device
    computed otherwise (declined); ``CUDA_VISIBLE_DEVICES`` set by the script (declined).
    """

    name = "rank-device"

    def visit_Call(self, node: cst.Call) -> None:
        if self.q.is_call_to(node, {"torch.device"}):
            self._torch_device(node)
        elif self.q.is_call_to(node, {"torch.accelerator.current_accelerator"}):
            self._current_accelerator(node)
        elif self.q.is_call_to(node, {"torch.cuda.set_device"}):
            self._set_device(node)
        elif m.matches(node.func, m.Attribute(attr=m.Name("cuda"))) and not self._is_module_attribute(node.func):
            self._dot_cuda(node)
        elif m.matches(node.func, m.Attribute(attr=m.Name("to"))):
            self._dot_to(node)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in ("device", "map_location") and cuda_string(arg.value):
                if not m.matches(node.func, m.Attribute(attr=m.Name("to"))):
                    self.ctx.plan.replace(arg, lambda a: a.with_changes(value=self.dp("device()")))
                    self.report(arg, "change", f"{arg.keyword.value}={self.code(arg.value)} -> dp.device(): this rank's device")

    def visit_IfExp(self, node: cst.IfExp) -> None:
        parent = self.q.parent(self.q.parent(node))
        if isinstance(parent, cst.Call) and self.q.is_call_to(parent, {"torch.device"}):
            return  # rewritten with its torch.device(...) call
        if cuda_string(node.body):
            self._device_choice(node, node, wrap_else=False)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if m.matches(
                target.target,
                m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))]),
            ) and "CUDA_VISIBLE_DEVICES" in self.code(target.target):
                self.report(
                    node, "declined",
                    "sets CUDA_VISIBLE_DEVICES: launched on N processes, every rank would see the same GPUs",
                    "remove it and let dpmigrate launch (or torchrun) place ranks; dp.device() picks this rank's GPU",
                )

    # --- the cases --------------------------------------------------------------------------------

    def _torch_device(self, node: cst.Call) -> None:
        args = [a for a in node.args if a.keyword is None or a.keyword.value in ("type", "device")]
        if not args:
            return
        first = args[0].value
        if cuda_string(first):
            self.ctx.plan.replace(node, lambda _: self.dp("device()"))
            self.report(node, "change", f"{self.code(node)} -> dp.device(): this rank's GPU (or the CPU)")
        elif cuda_template(first):
            self.ctx.plan.replace(node, lambda _: self.dp("device()"))
            self.report(
                node, "change",
                f"{self.code(node)} -> dp.device(): each rank its own GPU (the index in the script no longer picks it)",
            )
        elif isinstance(first, cst.IfExp) and cuda_string(first.body):
            self._device_choice(first, node, wrap_else=True)
        elif isinstance(first, (cst.Name, cst.Attribute, cst.Subscript)) and len(node.args) == 1:
            # torch.device(args.device): the flag still picks CUDA or not; the rank picks the card
            def rewrite(updated: cst.Call) -> cst.IfExp:
                kind = cst.Attribute(updated.deep_clone(), cst.Name("type"))
                test = cst.Comparison(kind, [cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cuda"'))])
                return cst.IfExp(test=test, body=self.dp("device()"), orelse=updated)

            self.ctx.plan.replace(node, rewrite)
            self.report(
                node, "change",
                f"{self.code(node)} -> dp.device() when it names a CUDA device (this rank's GPU), else as given: "
                f"`{self.code(first)}` still picks the kind of device",
            )
        elif not isinstance(first, cst.SimpleString):
            self.report(
                node, "declined",
                f"the device comes from `{self.code(first)}`: launched on N processes every rank would "
                "use that same device",
                "use dp.device() (this rank's GPU, or the CPU) when the value names a CUDA device",
            )

    def _device_choice(self, choice: cst.IfExp, target: cst.CSTNode, *, wrap_else: bool) -> None:
        """``"cuda" if TEST else OTHER`` (inside ``torch.device(...)`` when ``wrap_else``).

        A bare string choice stays a string (``dp.device().type``: ``"cuda"``, the GPU ``dp.init()``
        pinned, or ``"cpu"``), so the script's ``if device == "cuda":`` keeps its meaning; a
        ``torch.device`` never equals a string.
        """
        device = "device()" if wrap_else else "device().type"
        if self.q.is_call_to(choice.test, {_CUDA_AVAILABLE}) and cpu_string(choice.orelse):
            self.ctx.plan.replace(target, lambda _: self.dp(device))
            kind = "this rank's GPU, or the CPU" if wrap_else else "'cuda' (this rank's GPU) or 'cpu', still a string"
            self.report(target, "change", f"{self.code(target)} -> dp.{device}: {kind}")
            return

        def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
            inner = updated.args[0].value if wrap_else else updated
            orelse = inner.orelse
            if wrap_else:
                orelse = updated.with_changes(args=[cst.Arg(orelse)])
            return inner.with_changes(body=self.dp(device), orelse=orelse)

        self.ctx.plan.replace(target, rewrite)
        self.report(
            target, "change",
            f"the CUDA branch of this device choice -> dp.{device}: this rank's GPU; the script's flags still decide",
        )

    def _current_accelerator(self, node: cst.Call) -> None:
        parent = self.q.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return  # current_accelerator().type: a device type, which dp.init() pins to this rank's index
        self.ctx.plan.replace(node, lambda _: self.dp("device()"))
        self.report(node, "change", "torch.accelerator.current_accelerator() -> dp.device(): this rank's device")

    def _set_device(self, node: cst.Call) -> None:
        statement = self.q.statement_of(node)
        if m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.Call())])):
            self.ctx.plan.remove(statement)
            self.report(node, "change", "removed torch.cuda.set_device(...): dp.init() pins this rank's GPU")
        else:
            self.report(node, "declined", "torch.cuda.set_device(...) used as a value",
                        "remove it: dp.init() pins this rank's GPU (dp.local_rank() is its index)")

    def _dot_cuda(self, node: cst.Call) -> None:
        kept = [a for a in node.args if a.keyword is not None and a.keyword.value in _KEPT_TO_KWARGS]

        def rewrite(updated: cst.Call) -> cst.Call:
            kwargs = [a for a in updated.args if a.keyword is not None and a.keyword.value in _KEPT_TO_KWARGS]
            args = [cst.Arg(self.dp("device()"))] + [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in kwargs]
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")), args=args)

        self.ctx.plan.replace(node, rewrite)
        what = "non_blocking kept" if kept else "this rank's GPU, or the CPU"
        self.report(node, "change", f".cuda() -> .to(dp.device()): {what}")

    def _dot_to(self, node: cst.Call) -> None:
        for index, arg in enumerate(node.args):
            positional = arg.keyword is None and index == 0
            named = arg.keyword is not None and arg.keyword.value == "device"
            if (positional or named) and (cuda_string(arg.value) or isinstance(arg.value, cst.Integer)):
                self.ctx.plan.replace(arg, lambda a: a.with_changes(value=self.dp("device()")))
                self.report(node, "change", f".to({self.code(arg.value)}) -> .to(dp.device()): this rank's device")

    def _is_module_attribute(self, func: cst.Attribute) -> bool:
        """``torch.cuda`` itself (a module), as opposed to ``tensor.cuda`` (a method)."""
        owner = func.value
        if not isinstance(owner, (cst.Name, cst.Attribute)):
            return False  # nn.CrossEntropyLoss().cuda(): a method of the object the call built
        return self.q.named_under(owner, "torch")
