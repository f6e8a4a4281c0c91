"""TF1 graph code (sessions, placeholders): in-graph towers recognised, the rest reported, nothing half-converted."""

from __future__ import annotations

from ...codemod import patterns as m
from ...codemod.rule import Rule
from ._keras import KerasFile

_REPLACEMENT = (
    "the modern replacement is tf.distribute: port the graph to TF2 (a tf.function step, one model), build it "
    "under MirroredStrategy (one machine) or MultiWorkerMirroredStrategy (several), drop the tower loop and "
    "average_gradients (the strategy all-reduces), then run dpmigrate again on the TF2 script"
)


class Tf1Graph(Rule):
    """Report TF1 graph training (``tf.compat.v1`` sessions, placeholders) and leave the whole file unchanged.

    Why: a graph built for ``Session.run`` has no correct automatic multi-worker form here: between-
    graph replication needs a parameter server or a collective graph rewrite, and a half-converted
    file (prints on the chief, training still whole on every worker) would train N copies silently.
    In-graph tower loops (``for i in range(num_gpus): with tf.device('/gpu:%d' % i): ...`` with
    ``average_gradients``, or ``make_parallel`` splitting the batch with ``tf.split``) are already
    multi-GPU on one machine: reported as such, with the modern replacement.
    ``multi_gpu_model`` in a Keras script that also builds a Session (Keras 2 on a TF1 graph) is declined as
    such, with the way to a TF2 script that the Keras rules convert.
    Example:  for i in range(N_GPU):
                  with tf.device('/gpu:%d' % i): ...   -> reported: in-graph towers, already multi-GPU
    Leaves alone: the whole file (its generation, ``tf1-graph``, is one the other TF rules never convert); the
    rank-divergence check still runs.
    """

    name = "tf-legacy-graph"
    generations = ("tf1-graph",)

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        marker = self.q.first_use(self.vocabulary.markers("tf1-graph")) or self.ctx.module
        replicated = keras.multi_gpu
        for call in replicated:
            self.report(call, "declined", "multi_gpu_model on a TF1 graph (this Keras script builds a Session or uses "
                        "graph-mode TF): its one-machine replication has no automatic multi-worker form here, so the "
                        "file is left unchanged", "port the script to TF2 Keras (no Session, no tf.compat.v1 graph "
                        "calls), keep multi_gpu_model or drop it, then run dpmigrate again: it replaces multi_gpu_model "
                        "with the strategy scope")
        if replicated:
            return
        towers = keras.towers
        for loop in towers:
            self.report(loop, "declined", "in-graph tower loop (one model replica per GPU under tf.device, their "
                        "outputs or gradients combined in the graph): this TF1 script is already multi-GPU on one "
                        "machine; left unchanged", _REPLACEMENT)
        if towers:
            return
        steps = [c for c in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.Name("minimize") |
                 m.Name("apply_gradients"))))]
        where = steps[0] if steps else marker
        self.report(where, "declined", "TF1 graph training (tf.compat.v1 / Session): no correct automatic multi-worker "
                    "conversion exists for it here, so the file is left unchanged", _REPLACEMENT + " (or, staying on "
                    "TF1, Horovod: hvd.DistributedOptimizer(opt) and hvd.BroadcastGlobalVariablesHook(0))")
