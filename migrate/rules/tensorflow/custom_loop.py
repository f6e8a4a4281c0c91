"""Hand-written training loops (``GradientTape`` + ``apply_gradients``): gradients averaged over the workers."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name
from ._loop_data import LoopData

_OPTIMIZER_PACKAGES = ("tensorflow.keras.optimizers", "keras.optimizers", "tf_keras.optimizers", "tensorflow.optimizers")
_SUMMED_LOSS = {"tensorflow.reduce_sum", "tensorflow.math.reduce_sum", "tensorflow.nn.compute_average_loss"}


class CustomLoop(Rule):
    """Average a custom loop's gradients over the workers and give each worker its shard of the data.

    Why: without it every worker trains its own copy. Why this way (all-reduced gradients, Horovod's way)
    rather than ``strategy.run``: the loop, the
    ``@tf.function`` step and the loss stay exactly as written. Each worker computes the gradient of
    its loss, a mean over its local batch; ``dp.distributed_optimizer`` makes ``apply_gradients``
    average those gradients over the workers first (and start every worker from worker 0's weights),
    which for equal shards is the gradient of the mean over the global batch. Under ``strategy.run``
    instead, ``apply_gradients`` SUMS the replicas' gradients: a plain ``reduce_mean`` loss would take
    N times the step, silently, unless every loss were rescaled by the global batch.
    Example:  optimizer = keras.optimizers.SGD(0.1)  ->  optimizer = dp.distributed_optimizer(keras.optimizers.SGD(0.1))
              train_ds = tf.data.Dataset...batch(64)   ->  train_ds = dp.distributed_loader(tf.data.Dataset...batch(64))
    ``--batch global`` makes the pipeline's ``.batch(B)`` ``.batch(dp.per_rank_batch_size(B))``.
    ``keras.metrics`` objects then measure this worker's shard; what they print is the chief's.
    The data is followed from the loop to where its batched pipeline is built: through ``enumerate``,
    ``zip``, ``tqdm``, ``iter``/``next``, ``ds.take(n)`` (sharded before the ``take``, so every worker takes
    its ``n``) and a function's parameter to its callers (``def train(dataset): for batch in dataset`` called
    as ``train(train_ds)``); a loop whose data it cannot follow is declined, never left whole silently.
    A TF2 tower loop (``for i in range(n_gpus): with tf.device('/gpu:%d' % i):``, the towers' gradients
    averaged by the script) is kept and noted: each worker averages its towers over its own shard, then the
    workers' averages are averaged (measured equivalent); on GPUs each worker would use every GPU of its
    machine, so the note says to keep one tower per worker.
    Leaves alone: evaluation loops (every worker reads all of their data). Declined (with the fix): a
    loss that is a sum or already divided by a global batch
    (``reduce_sum``, ``compute_average_loss``: the average over the workers would shrink it N times),
    an optimizer or dataset not built in the function that uses it.
    """

    name = "tf-custom-loop"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        if not keras.custom_steps:
            return
        for loop in keras.towers:
            self.report(loop, "note", "tower loop kept: each worker still splits its batch over its towers and "
                        "averages their gradients, then dp.distributed_optimizer averages the workers' (together the "
                        "gradient of the global batch); on GPUs every worker would place towers on every GPU of its "
                        "machine", "set the number of towers to 1 (or drop the loop and average_gradients) so that "
                        "each worker uses its own device, tf.device(dp.device())")
        summed = self._summed_loss(keras)
        if summed is not None:
            self.report(summed, "declined", f"the loss uses {self.code(summed.func)}: a sum (or a mean over a global "
                        "batch) that averaging the workers' gradients would make N times smaller; the loop is left "
                        "as it is", "make the loss a mean over the local batch (tf.reduce_mean), then convert again; "
                        "or run the step with strategy.run and scale it with tf.nn.compute_average_loss(..., "
                        "global_batch_size=B)")
            return
        done: set[int] = set()
        for step in keras.custom_steps:
            name = owner_name(step)
            optimizer = self._optimizer(keras, name, step) if name else None
            if optimizer is None:
                self.report(step, "declined", f"{self.code(step.func)}(...): its optimizer is not built in this file "
                            "as keras.optimizers.X(...) assigned to a name", "wrap it where it is built: "
                            "optimizer = dp.distributed_optimizer(optimizer); shard the data with dp.distributed_loader")
                continue
            if id(optimizer) in done:
                continue
            done.add(id(optimizer))
            self.ctx.plan.replace(optimizer, lambda updated: self.dp_call("distributed_optimizer", updated))
            self.report(optimizer, "change", f"{name} = dp.distributed_optimizer(...): apply_gradients averages the "
                        "gradients over the workers first (the loss stays a mean over the local batch) and starts every "
                        "worker from worker 0's weights")
        if done:
            self._shard_datasets(keras)
            self._note_metrics(keras)

    def _optimizer(self, keras: KerasFile, name: str, step: cst.Call) -> cst.BaseExpression | None:
        """The ``keras.optimizers.X(...)`` expression last assigned to ``name`` in the step's scope or the module."""
        scopes = [a for a in self.q.ancestors(step) if isinstance(a, cst.FunctionDef)]
        for scope in (*scopes, self.ctx.module):
            for assignment in reversed(keras.assignments(scope, name)):
                value = assignment.value
                if isinstance(value, cst.Call) and any(
                    self.q.index.qualified_names_under(value.func, p) for p in _OPTIMIZER_PACKAGES
                ):
                    return value
        return None

    def _summed_loss(self, keras: KerasFile) -> cst.Call | None:
        for tape in self.q.findall(self.ctx.module, m.With()):
            if not any(isinstance(i.item, cst.Call) and keras.under_keras(i.item.func) and
                       self.code(i.item.func).endswith("GradientTape") for i in tape.items):
                continue
            for call in self.q.index.of_type(tape.body, cst.Call):
                if self.q.is_call_to(call, _SUMMED_LOSS):
                    return call
                reduction = argument(call, 99, "reduction")
                if reduction is not None and "SUM" in self.code(reduction.value).upper() and \
                        "OVER" not in self.code(reduction.value).upper():
                    return call
        return None

    # --- data ------------------------------------------------------------------------------------

    def _shard_datasets(self, keras: KerasFile) -> None:
        global_batch = self.ctx.options.batch == "global"
        data = LoopData(keras)
        done: set[int] = set()
        for loop in data.training_loops():
            sites = data.sites(loop)
            if sites is None:
                self.report(loop, "declined", "cannot follow the data this training loop reads to a batched tf.data "
                            "pipeline of this file: every worker would read all of it (the gradients are averaged, so "
                            "it trains like one process, N times over)", "where the batched pipeline is built: "
                            "ds = dp.distributed_loader(ds) (worker r takes batches r, r+N, ...); for arrays batched "
                            "by hand, take this worker's part with dp.shard(x)")
                continue
            for site in sites:
                if id(site.node) in done or self._already_sharded(site.node):
                    continue
                done.add(id(site.node))
                self.ctx.plan.replace(site.node, lambda updated: self.dp_call("distributed_loader", updated))
                self.report(site.node, "change", f"{site.name} = dp.distributed_loader(...): each worker reads its "
                            "own shard of the batches (the same number on every worker)", effect="shard")
                if global_batch:
                    self._per_rank_batch(keras, data, site.node, site.scope)

    def _per_rank_batch(self, keras: KerasFile, data: LoopData, value: cst.BaseExpression, scope: cst.CSTNode) -> None:
        batches = keras.batch_calls(value, scope)
        function = self.q.module_functions().get(value.func.value) if m.matches(value, m.Call(func=m.Name())) else None
        if not batches and function is not None:  # make_dataset(...): its own .batch(B)
            batches = data.returned_batches(function)
        if len(batches) != 1 or not batches[0].args:
            self.report(value, "declined", "--batch global: cannot find the pipeline's .batch(B)",
                        "batch it with .batch(dp.per_rank_batch_size(B)), B being the global batch")
            return
        site = batches[0].args[0]
        self.ctx.plan.replace(site, lambda updated: updated.with_changes(
            value=self.dp_call("per_rank_batch_size", updated.value)))
        self.report(site, "change", f"--batch global: .batch({self.code(site.value)}) -> "
                    ".batch(dp.per_rank_batch_size(...)), so the global batch stays the same", effect="split-batch")
        self._batch_used_in_steps(keras, site.value)

    def _batch_used_in_steps(self, keras: KerasFile, batch: cst.BaseExpression) -> None:
        """``BATCH_SIZE`` also read by a training step (``tf.random.normal([BATCH_SIZE, noise_dim])``): there it is
        still the global batch, while each worker's batch is now ``BATCH_SIZE / N``."""
        if not isinstance(batch, cst.Name):
            return
        steps = {id(f): f for f in self.q.index.of_type(self.ctx.module, cst.FunctionDef)
                 if any(self.q.index.contains(f, s) for s in keras.custom_steps)}
        for function in steps.values():
            use = next((n for n in self.q.index.of_type(function.body, cst.Name) if n.value == batch.value), None)
            if use is not None:
                self.report(use, "note", f"--batch global: {batch.value} is read in the training step too, where it "
                            f"is still the global batch while each worker's batch is now {batch.value} / N",
                            f"take the batch's own size there (tf.shape(images)[0]), or use dp.per_rank_batch_size"
                            f"({batch.value})")

    def _already_sharded(self, value: cst.BaseExpression) -> bool:
        return bool(self.q.findall(value, m.Call(func=m.Attribute(attr=m.Name("shard")))))

    def _note_metrics(self, keras: KerasFile) -> None:
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if any(".metrics." in n for n in keras.under_keras(call.func)) and keras.receiver_name(call):
                self.report(call, "note", f"{keras.receiver_name(call)} measures this worker's shard; printed "
                            "values are the chief's (dp.all_reduce(value) gives the mean over the workers)")
