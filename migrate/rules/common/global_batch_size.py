"""The ``--batch global`` policy: each rank takes B / N, so the global batch stays B."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule

_SHAPE_METHODS = {"reshape", "view", "expand", "tile", "repeat", "broadcast_to"}
_FRAMEWORKS = ("paddle.", "torch.", "tensorflow.")


class GlobalBatchSize(Rule):
    """Rewrite a training loader's batch size B to ``dp.per_rank_batch_size(B)`` (``--batch global``).

    Why: by default (``--batch per-device``, Horovod's convention) each rank keeps B, so the global
    batch grows N times and the learning rate may need ``--scale-lr``. With ``--batch global`` the
    global batch and the training trajectory stay those of the original script.
    Example:  train_kwargs = {'batch_size': args.batch_size}
           -> train_kwargs = {'batch_size': dp.per_rank_batch_size(args.batch_size)}
    Found as ``batch_size=``, the second positional argument, or the ``'batch_size'`` entry of the
    dict (literal or ``dict(...)``) a loader gets as ``**kwargs`` in the same function.
    Leaves alone: evaluation loaders; a batch size it cannot find (declined: the DataLoader default
    of 1 cannot be split).
    """

    name = "global-batch-size"
    positional_batch_size = 1  # the loader's positional parameter that is the batch size (None: no such parameter)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._sized: set[int] = set()  # the reads already declined as sizing a tensor (a name scaled at two sites)

    def finish(self) -> None:
        if self.ctx.options.batch != "global":
            return
        for call in self.training_loader_calls():
            sites = self._batch_sizes(call)
            if not sites:
                self.report(
                    call, "declined", "--batch global: cannot find this training loader's batch size",
                    "pass batch_size=dp.per_rank_batch_size(B) to the DataLoader, B being the global batch size",
                )
            for node, value in sites:
                self.per_rank(node, value)
        self.other_batch_sizes()

    def training_loader_calls(self) -> list[cst.Call]:
        """The loaders whose batch size is the global batch: the sharded training loaders."""
        return [loader.call for loader in self.ctx.analysis(LoaderFlow).sharded_training()]

    def other_batch_sizes(self) -> None:
        """A framework's own training calls that take a batch size (Paddle's ``Model.fit``): none here."""

    def per_rank(self, node: cst.CSTNode, value: cst.BaseExpression) -> None:
        """``B`` -> ``dp.per_rank_batch_size(B)`` at ``node`` (an argument or a dict entry)."""
        self.ctx.plan.replace(node, lambda updated: updated.with_changes(
            value=self.dp_call("per_rank_batch_size", updated.value)))
        self.report(node, "change", f"--batch global: batch size {self.code(value)} -> "
                    "dp.per_rank_batch_size(...), so the global batch stays the same", effect="split-batch")
        self._tensor_shapes_of(value)

    def _tensor_shapes_of(self, value: cst.BaseExpression) -> None:
        """The global batch size also sizing a tensor where each batch is handled (an OCR tutorial's CTC loss built
        its length tensors in ``forward`` with ``paddle.full([BATCH_SIZE], ...)``; a GAN's labels made in its loop):
        each rank's batch now holds B / N samples, so the shapes no longer fit (measured: "X=[8] vs Y=[16]" on 2
        ranks). Declined there, with the fix; a set-up outside any loop (a data set of B x 10 rows) is left."""
        if not isinstance(value, (cst.Name, cst.Attribute)):
            return
        text = self.code(value)
        for read in self.q.index.of_type(self.ctx.module, type(value)):
            if read is value or id(read) in self._sized or self.code(read) != text or not self._per_step(read):
                continue
            call = next((a for a in self.q.ancestors(read) if isinstance(a, cst.Call)), None)
            if call is None or not self._sizes_a_tensor(call):
                continue
            self._sized.add(id(read))
            self.report(read, "declined", f"--batch global: `{text}` sizes a tensor here ({self.code(call.func)}(...)) "
                        "as the global batch, while each rank's training batch now holds dp.per_rank_batch_size("
                        f"{text}) samples: the shapes no longer fit",
                        f"if it sizes a training batch, use dp.per_rank_batch_size({text}) here; or convert with "
                        "--batch per-device")

    def _per_step(self, node: cst.CSTNode) -> bool:
        """In a loop, or in a layer's (or loss's) ``forward``: code that runs on every batch, not a data set-up."""
        function = self.q.function_of(node)
        if function is not None and function.name.value in ("forward", "__call__", "call"):
            return True
        return any(isinstance(a, (cst.For, cst.While)) for a in self.q.ancestors(node))

    def _sizes_a_tensor(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _SHAPE_METHODS:
            return True
        return any(name.startswith(_FRAMEWORKS) for name in self.q.qualified_names(call.func))

    def _batch_sizes(self, call: cst.Call) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        for index, arg in enumerate(call.args):
            if arg.keyword is not None and arg.keyword.value == "batch_size":
                return [(arg, arg.value)]
            if arg.keyword is None and not arg.star and index == self.positional_batch_size:
                return [(arg, arg.value)]
        sites = []
        for arg in call.args:
            if arg.star == "**" and isinstance(arg.value, cst.Name):
                sites.extend(self._in_kwargs_dict(call, arg.value.value))
        return sites

    def _in_kwargs_dict(self, call: cst.Call, name: str) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        scope = self.q.function_of(call) or self.ctx.module
        sites = []
        for assign in self.q.findall(scope, m.Assign(targets=[m.AssignTarget(m.Name(name))])):
            value = assign.value
            if isinstance(value, cst.Dict):
                sites += [(e, e.value) for e in value.elements if _is_key(e, "batch_size")]
            elif m.matches(value, m.Call(func=m.Name("dict"))):
                sites += [(a, a.value) for a in value.args if a.keyword and a.keyword.value == "batch_size"]
        for update in self.q.findall(scope, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("update")))):
            for arg in update.args:
                if isinstance(arg.value, cst.Dict):
                    sites += [(e, e.value) for e in arg.value.elements if _is_key(e, "batch_size")]
                elif arg.keyword and arg.keyword.value == "batch_size":
                    sites.append((arg, arg.value))
        return sites


def _is_key(element: cst.BaseDictElement, key: str) -> bool:
    return (
        isinstance(element, cst.DictElement)
        and isinstance(element.key, cst.SimpleString)
        and element.key.evaluated_value == key
    )
