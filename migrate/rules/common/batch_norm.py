"""Batch normalisation normalises over each rank's share of the batch: said, with the layers named, or with
``--sync-batchnorm`` synchronised in the framework's own form."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import appended, argument
from ...codemod.rule import Rule


class BatchNormLayers:
    """The calls that build the framework's batch normalisation layers in a training script (none elsewhere), and
    those that build a library model made of them (``resnet18()``: the issue 19 audit's landmark tutorial trained
    a ``paddle.vision`` ResNet on 2 ranks, 2e-3 from one process, with nothing said)."""

    def __init__(self, ctx) -> None:
        q = ctx.query
        vocabulary = q.vocabulary
        self.sites: list[cst.Call] = []
        self.models: set[int] = set()  # ids of the sites that build a library model
        if not vocabulary.batchnorm_classes or not q.is_training_script():
            return
        models = vocabulary.batchnorm_models | set(ctx.options.local_batchnorm_models)
        flagged = dict(vocabulary.batchnorm_models_with)
        unused = _unused_classes(q, ctx.module)
        for call in q.index.of_type(ctx.module, cst.Call):
            if isinstance(call.func, cst.Call):  # the layer's call, `BatchNormalization()(h)`
                continue
            if any(isinstance(a, cst.ClassDef) and a.name.value in unused for a in q.ancestors(call)):
                continue  # a model class the script defines and never builds (round Q: MyNet_1 beside MyNet)
            if q.is_call_to(call, vocabulary.batchnorm_classes):
                self.sites.append(call)
            elif (models and q.is_call_to(call, models)) or (flagged and _flagged(q, call, flagged)):
                self.sites.append(call)
                self.models.add(id(call))


def _unused_classes(q, module: cst.Module) -> set[str]:
    """Module-level classes whose name nothing outside their own body reads."""
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
    if not classes:
        return set()
    read = {n.value for n in q.index.of_type(module, cst.Name) if n.value in classes
            and not any(a is classes[n.value] for a in q.ancestors(n))}
    return set(classes) - read


def _flagged(q, call: cst.Call, flagged: dict[str, str]) -> bool:
    """A call of a model that has batch normalisation when given ``keyword=True`` (``vgg16(batch_norm=True)``)."""
    names = q.qualified_names(call.func)
    for name in names & flagged.keys():
        given = argument(call, None, flagged[name])
        if given is not None and not (isinstance(given.value, cst.Name) and given.value.value in ("False", "None")):
            return True
    return False


class BatchNormStatistics(Rule):
    """Note the batch normalisation layers of a training script: their statistics become per rank; with
    ``--sync-batchnorm``, synchronise them as the framework does.

    Why: a batch normalisation layer normalises each batch with that batch's own mean and variance. Launched on N
    ranks, each normalises its own share (B/N samples with ``--batch global``, B with ``--batch per-device``),
    not the batch the single process saw, and keeps running statistics of its own: training differs from the
    original's (measured: 1e-1 relative on a CNN with ``--batch global``) and the saved running statistics are
    rank 0's. Synchronised batch normalisation normalises over the whole batch, where the framework runs it:
    Keras ``BatchNormalization(synchronized=True)`` on any device (written into the layer's call here); torch
    ``SyncBatchNorm`` on CUDA and Paddle's on GPUs (``dp.Strategy(sync_batchnorm=True)``, written into
    ``dp.init`` by init-runtime: the runtime converts each wrapped model, and stops a launched job on a device
    where its framework has none, rather than train unsynchronised).
    Example (note):  self.bn1 = nn.BatchNorm2d(64)   -> batch normalisation (bn1, ...): statistics per rank
    Example (--sync-batchnorm, Keras):  layers.BatchNormalization()  ->  layers.BatchNormalization(synchronized=True)
    Leaves alone: layers given ``synchronized=`` already; a Keras layer with ``fused=True`` (declined: the fused
    kernel cannot synchronise); scripts that do not train; files where the layers are not built.
    """

    name = "batch-norm"
    about_training = False

    def finish(self) -> None:
        layers = self.ctx.analysis(BatchNormLayers)
        sites = layers.sites
        if not sites:
            return
        names = list(dict.fromkeys(self._name(c, layers) for c in sites))
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        how = self.vocabulary.sync_batchnorm if self.ctx.options.sync_batchnorm else None
        if how == "strategy":
            self._through_the_strategy(sites[0], shown)
            return
        if how:
            self._synchronise(sites, how, layers)
            return
        share = "B/N samples" if self.ctx.options.batch == "global" else "its own batch of B"
        unsupported = " (--sync-batchnorm: dpmigrate knows no synchronised form for this framework)" \
            if self.ctx.options.sync_batchnorm else ""
        self.report(sites[0], "note", (
            f"batch normalisation ({shown}): launched, each rank normalises over {share}, not the original's batch, "
            "and keeps running statistics of its own (the checkpoint holds rank 0's): training differs from one "
            f"process's (dpmigrate verify names it){unsupported}"),
            "convert with --sync-batchnorm (Keras: synchronized=True on any device; torch, Paddle: "
            "dp.Strategy(sync_batchnorm=True), on GPUs), or accept the difference")

    def _through_the_strategy(self, first: cst.Call, shown: str) -> None:
        """Say what ``dp.Strategy(sync_batchnorm=True)`` (init-runtime writes it) does, or decline where a model
        class distributes its network itself (``paddle.Model``) and so never meets the runtime's conversion."""
        own = self.vocabulary.self_distributing_models
        itself = [c for c in self.q.index.of_type(self.ctx.module, cst.Call) if own and self.q.is_call_to(c, own)]
        if itself:
            model = self.code(itself[0].func)
            self.report(itself[0], "declined", (
                f"--sync-batchnorm: {model}(...) wraps its network for data parallelism itself, where "
                f"dp.Strategy(sync_batchnorm=True) does not reach: batch normalisation ({shown}) stays per rank"),
                f"on GPUs, net = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(net) before {model}(net)")
            return
        self.report(first, "note", (
            f"batch normalisation ({shown}) synchronised over the ranks when launched (--sync-batchnorm: "
            "dp.Strategy(sync_batchnorm=True) in dp.init): on GPUs; where the framework has no synchronised "
            "batch normalisation (the CPU) the launched job stops at dp.distributed_model saying so"))

    def _synchronise(self, sites: list[cst.Call], keyword: str, layers: BatchNormLayers) -> None:
        """Give each layer ``keyword=True`` (Keras: ``synchronized=True``) unless it says otherwise already; decline
        in a file whose hand-written training step runs outside the replicas (nothing to synchronise with)."""
        outside = [c for c in self.q.index.of_type(self.ctx.module, cst.Call)
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value in self.vocabulary.steps_outside_replicas
                   and not self._in_train_step(c)]
        if outside:
            self.report(sites[0], "declined", (
                f"--sync-batchnorm: this file trains with its own loop ({self.code(outside[0].func)}(...)), which the "
                f"conversion runs outside the strategy's replicas, so {keyword}=True would have nothing to synchronise "
                "with: batch normalisation stays per rank"),
                "train through model.fit (a custom train_step is fine) and convert with --sync-batchnorm, or accept "
                "the difference")
            return
        for call in sites:
            if id(call) in layers.models:
                self.report(call, "declined", (
                    f"--sync-batchnorm: {self.code(call.func)}(...) builds its batch normalisation layers itself, "
                    f"where {keyword}=True cannot be given: they stay per rank"),
                    f"build the model from layers given {keyword}=True, or accept the difference")
                continue
            if argument(call, None, keyword) is not None or any(a.star for a in call.args):
                continue  # the script chose (or may choose, through **kwargs); a second run changes nothing
            fused = argument(call, None, "fused")
            if fused is not None and not (isinstance(fused.value, cst.Name) and fused.value.value in ("False", "None")):
                self.report(call, "declined", f"batch normalisation {self._name(call, layers)} with "
                            f"fused={self.code(fused.value)}: the fused kernel cannot be synchronised",
                            f"drop fused= and add {keyword}=True")
                continue
            new = cst.Arg(keyword=cst.Name(keyword), value=cst.Name("True"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
            self.ctx.plan.replace(call, lambda updated, new=new: appended(updated, new))
            self.report(call, "change", f"{self._name(call, layers)}: {keyword}=True (--sync-batchnorm): normalises over the "
                        "whole batch of every rank, as one process over the original's batch")

    def _in_train_step(self, node: cst.CSTNode) -> bool:
        """Inside a method named ``train_step`` (a Keras model's own step: ``fit`` runs it on every replica)."""
        function = self.q.function_of(node)
        return function is not None and function.name.value == "train_step"

    def _name(self, call: cst.Call, layers: BatchNormLayers) -> str:
        """``bn1`` of ``self.bn1 = nn.BatchNorm2d(64)``, else the class (``BatchNorm2d``); a library model's
        are ``the layers of resnet18(...)``."""
        if id(call) in layers.models:
            return f"the layers of {self.code(call.func).rsplit('.', 1)[-1]}(...)"
        statement = self.q.statement_of(call)
        if (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign)
                and statement.body[0].value is call):
            target = statement.body[0].targets[0].target
            if isinstance(target, cst.Attribute):
                return target.attr.value
            if isinstance(target, cst.Name):
                return target.value
        return self.code(call.func).rsplit(".", 1)[-1]
