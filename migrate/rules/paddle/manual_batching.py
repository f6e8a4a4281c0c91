"""Dygraph scripts that cut their batches by hand (no DataLoader): said, and declined when the ranks shuffle apart."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule
from ..common.loop_draws import loop_data_scopes
from ..common.shared_random_data import NUMPY_DRAWS, PYTHON_DRAWS
from ..common.shuffle_alike import align, alignable, shuffles_in, unseeded
from ._analyses import training_loaders

_SHUFFLES = frozenset({"numpy.random.shuffle", "numpy.random.permutation", "random.shuffle", "paddle.randperm"})


class PaddleManualBatching(Rule):
    """Report a training loop that slices its batches from arrays in memory (the Paddle course's house-price loop).

    Why: with no DataLoader there is nothing to shard. Each rank reads all the data: when every rank cuts the same
    batches, the averaged gradient is the original's (correct, no speed-up: a note). When the data is shuffled
    with an unseeded generator (``np.random.shuffle(train_data)`` each epoch), every rank cuts its own batches, so
    each step averages N different batches: N times the batch, samples read by several ranks, not the run the
    report's ``--batch`` policy describes. A NumPy or Python shuffle is made alike on every rank
    (:mod:`..common.shuffle_alike`: rank 0's generator state first), so every rank cuts the same batches
    (a note: correct, no speed-up); any other unseeded draw there is declined, with the fix.
    Example:  for epoch in range(E):
                  np.random.set_state(dp.broadcast(np.random.get_state()))   (added)
                  np.random.shuffle(train_data)
                  for k in range(0, len(train_data), B): x = train_data[k:k + B] ...
    Declined: ``paddle.randperm(n)`` or ``np.random.randint`` picking the batches (fix: seed the generator alike
    on every rank once, then give each rank its part of every batch, x = dp.shard(x); or build a
    paddle.io.DataLoader over a Dataset, which the conversion shards).
    Leaves alone: scripts that read a DataLoader; loops using the whole data at each step (full-batch
    training: the shared rules say so).
    """

    name = "paddle-manual-batching"
    generations = ("dygraph",)

    def finish(self) -> None:
        flow = self.ctx.analysis(LoaderFlow)
        evaluating = {id(loader) for loader in flow.loaders if loader.role == "eval"} - {
            id(loader) for loader in training_loaders(self.ctx)}
        if any(id(loader) not in evaluating for loader in flow.loaders) or flow.imported_training_returns(
                self.ctx.options.local_modules):
            return  # (a DataLoader that only evaluates, or prints a batch's shape, trains nothing: course MNIST notes)
        loops = [f for f in self.q.findall(self.ctx.module, m.For() | m.While()) if self.q.has_backward(f.body)]
        innermost = [f for f in loops if not any(g is not f and self.q.index.contains(f, g) for g in loops)]
        outer = [f for f in loops if f not in innermost]
        for loop in innermost[:1]:
            if not self._slices(loop):
                self._draws_per_step(loop)  # else the whole data at every step: full-batch (the shared rules say so)
                return
            shuffles = unseeded(self, shuffles_in(self, [loop, *outer], _SHUFFLES | NUMPY_DRAWS | PYTHON_DRAWS))
            if shuffles and all(alignable(self, c) for c in shuffles):
                align(self, shuffles)  # every rank shuffles alike: the same batches everywhere
                shuffles = []
            if shuffles:
                self.report(loop, "declined", "this training loop cuts its batches by hand from data it shuffles with "
                            f"an unseeded generator (`{self.code(shuffles[0].func)}`): every rank shuffles its own way "
                            "and trains on its own whole batches, so each step averages N different batches (N times "
                            "the batch, samples read by several ranks)", "seed the shuffle alike on every rank "
                            "(np.random.seed(0) once, before training), then give each rank its part of every batch "
                            "(x, y = dp.shard(x), dp.shard(y)); or build a paddle.io.DataLoader over a Dataset, which "
                            "the conversion shards")
            else:
                self.report(loop, "note", "this training loop cuts its batches by hand (no DataLoader): every rank "
                            "reads the same batches, which is correct (the averaged gradient is the original's) but "
                            "gives no speed-up", "give each rank its part of every batch (x, y = dp.shard(x), "
                            "dp.shard(y)), or build a paddle.io.DataLoader over a Dataset, which the conversion shards")

    def _draws_per_step(self, loop: cst.CSTNode) -> None:
        """Batches drawn at random at every step (``idx = [random.choice(...)]`` in the generator the loop reads): from
        Python's or NumPy's generator, or seeded, every rank draws the same batches (the original's: correct, no
        speed-up); from Paddle's unseeded, each rank its own, data parallelism with N times the batch. A note says
        which."""
        draws = shuffles_in(self, loop_data_scopes(self, loop), NUMPY_DRAWS | PYTHON_DRAWS | self.vocabulary.random_draws)
        if not draws and _steps_over_a_range(loop) and not self.q.index.of_type(loop.body, cst.Subscript):
            # the same tensors at every step (a first linear regression: round G): said at the loop
            self.report(loop, "note", "this training loop uses the whole data at every step (full-batch training, no "
                        "DataLoader): every rank computes the same gradients, which is correct but gives no speed-up",
                        "data parallelism splits batches; to split this one, give each rank its part of the data "
                        "(x, y = dp.shard(x), dp.shard(y)) and average the loss over the ranks, or leave it on one process")
            return
        if not draws:
            if isinstance(loop, cst.For) and not _steps_over_a_range(loop):  # a generator of the file's own, a list
                self.report(loop, "declined", f"this training loop reads its batches from `{self.code(loop.iter)}` "
                            "(no DataLoader the conversion can follow to here), which it does not split: every rank "
                            "reads all of them and the "
                            "run is no faster; the ranks train as the original did only if what yields them draws "
                            "nothing at random, or draws alike on every rank (Python's and NumPy's generators are given "
                            "rank 0's state by dp.init(); the framework's are not)", "give each rank its part of every batch "
                            "(x, y = dp.shard(x), dp.shard(y)); or, where a paddle.io.DataLoader makes them (here, or "
                            "returned by another module's method), wrap it: dp.distributed_loader(...)")
            return
        own = [d for d in unseeded(self, draws) if not self.q.is_call_to(d, NUMPY_DRAWS | PYTHON_DRAWS)]
        if not own:  # seeded, or Python's / NumPy's generator, which dp.init() makes alike on every rank
            self.report(loop, "note", "this training loop draws its batches at random at every step "
                        f"(`{self.code(draws[0].func)}`) from a generator alike on every rank (seeded, or given rank "
                        "0's state by dp.init()): every rank draws the same batches, which is correct (the original's) "
                        "but gives no speed-up", "give each rank its part of every batch (x = dp.shard(x)), or seed "
                        "each rank apart (random.seed(seed + dp.rank())) for N times the batch")
        else:
            draws = own
            self.report(loop, "note", "this training loop draws its batches at random at every step "
                        f"(`{self.code(draws[0].func)}`, unseeded, no DataLoader): each rank draws its own, so the "
                        "ranks train on different samples and the global batch is N x the script's; not the "
                        "original's run step for step", "to compare with one process, seed that generator alike on "
                        "every rank and give each rank its part of every batch (x = dp.shard(x))", effect="shard")

    def _slices(self, loop: cst.CSTNode) -> bool:
        """The loop (or its iterable, a list of slices) cuts the data: ``data[k:k + B]``."""
        slices = [s for s in self.q.index.of_type(self.ctx.module, cst.Slice)]
        if any(self.q.index.contains(loop, s) for s in slices):
            return True
        if isinstance(loop, cst.For):
            names = self.q.names_in(loop.iter)
            scope = self.q.function_of(loop) or self.ctx.module
            for assign in self.q.findall(scope, m.Assign()):
                if names & {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)} and any(
                        self.q.index.contains(assign.value, s) for s in slices):
                    return True
        return False


def _steps_over_a_range(loop: cst.CSTNode) -> bool:
    """``for step in range(20):`` (or a ``while``): the loop reads no data of its own."""
    return isinstance(loop, cst.While) or m.matches(loop.iter, m.Call(func=m.Name("range")))
