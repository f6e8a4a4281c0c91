"""Scripts that batch by hand (no DataLoader): converted, and told how to shard the data."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule
from ..common.loop_draws import loop_data_scopes
from ..common.shuffle_alike import align, alignable, shuffles_in, unseeded

_RANDOM = ("torch.rand", "torch.randn", "torch.randint", "torch.normal", "numpy.random.")  # fresh data per step
_ENVIRONMENTS = ("gym.make", "gymnasium.make", "gym.vector.", "gymnasium.vector.")


class ManualBatching(Rule):
    """Report training loops that slice their data by hand instead of reading a DataLoader.

    Why: with no DataLoader there is nothing to shard automatically. The converted script is still
    correct (every rank reads all the data, DDP averages identical gradients) but gets no speed-up.
    Example:  for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
                  data, targets = get_batch(train_data, i)
    -> note: shard it by hand, e.g. ``train_data = dp.shard(train_data)`` (this rank's contiguous
    part), with ``dp.per_rank_batch_size(B)`` where the batches are formed under ``--batch global``.
    Full-batch training (no slicing at all: a graph network trained on the whole graph) and
    reinforcement learning (``gym.make``: each rank plays its own episodes) get a note of their own,
    since neither gets faster on N processes.
    A loop that batches by hand after an unseeded shuffle (``np.random.shuffle(data)`` each epoch,
    ``torch.randperm(n)``) would cut other batches on every rank: the shuffle is made alike on every rank
    (:mod:`..common.shuffle_alike`), or the loop declined when it cannot be.
    Leaves alone: the loop itself.
    """

    name = "manual-batching"

    def finish(self) -> None:
        flow = self.ctx.analysis(LoaderFlow)
        if flow.loaders:
            return  # it reads a DataLoader
        loops = [f for f in self.q.findall(self.ctx.module, m.For() | m.While()) if self.q.trains(f.body)]
        if not loops or flow.imported_training_returns(self.ctx.options.local_modules):
            return  # nothing trains here, or it reads a DataLoader a module it imports builds
        innermost = [f for f in loops if not any(g is not f and self.q.index.contains(f, g) for g in loops)]
        for loop in innermost[:1]:
            policy = (" --batch global is not applied: no DataLoader batch size to split."
                      if self.ctx.options.batch == "global" else "")
            if any(self.q.callee_starts_with(c, prefix) for prefix in _ENVIRONMENTS
                   for c in self.q.index.of_type(self.ctx.module, cst.Call)):
                self.report(
                    loop, "note",
                    "this training loop learns from episodes it plays (reinforcement learning): every rank plays "
                    "its own, and with the same seed the same ones, so the job runs no faster." + policy,
                    "seed each rank's environment differently (e.g. env.reset(seed=seed + dp.rank())) so that the "
                    "averaged gradients come from N times the episodes, and decide when to stop on all ranks "
                    "together (stop = dp.all_reduce(float(condition), op='max')), or the ranks stop apart",
                )
            elif self._draws_fresh_data(loop):
                self._fresh_data(loop, policy)
            elif not self.q.index.of_type(loop.body, cst.Subscript) and not self._calls_a_batcher(loop):
                self.report(
                    loop, "note",
                    "this training loop uses the whole data at every step (full-batch training): every rank "
                    "computes the same gradients, which is correct but gives no speed-up." + policy,
                    "data parallelism splits batches; with one batch there is nothing to split (leave it on one process)",
                )
            else:
                self._batches_by_hand(loop, [f for f in loops if f is not loop and self.q.index.contains(f, loop)], policy)

    def _batches_by_hand(self, loop, outer: list, policy: str) -> None:
        """Every rank reads all the data: correct only if every rank cuts the same batches, so a shuffle the
        ranks would make apart (unseeded) is made alike (:mod:`..common.shuffle_alike`), or declined."""
        shuffles = unseeded(self, shuffles_in(self, [loop, *outer]))
        if shuffles and not all(alignable(self, c) for c in shuffles):
            self.report(
                loop, "declined",
                f"this training loop batches its data by hand after an unseeded shuffle (`{self.code(shuffles[0])}`) "
                "that cannot be made alike on every rank: each rank would cut its own batches, so each step would "
                "average N different batches (N times the batch, samples read by several ranks)",
                "seed that generator alike on every rank once before training (e.g. torch.manual_seed(0)), then give "
                "each rank its part of every batch (x, y = dp.shard(x), dp.shard(y)), or use a DataLoader",
            )
            return
        align(self, shuffles)
        self.report(
            loop, "note",
            "this training loop batches its data by hand (no DataLoader): every rank reads all the data"
            + (" and, its shuffle made alike, cuts the same batches" if shuffles else "")
            + ", which is correct but gives no speed-up." + policy,
            "shard the data by hand, e.g. train_data = dp.shard(train_data) before batching it",
        )

    def _draws_fresh_data(self, loop) -> bool:
        """The loop draws its inputs at random at every step (directly or in a function of the file it calls), and
        indexes no data set."""
        scopes = loop_data_scopes(self, loop)
        if any(self.q.index.of_type(scope, cst.Subscript) for scope in scopes):
            return False
        return any(self.q.callee_starts_with(c, prefix) for scope in scopes for c in self.q.index.of_type(scope, cst.Call)
                   for prefix in _RANDOM)

    def _fresh_data(self, loop, policy: str) -> None:
        seeded = any(self.q.is_call_to(c, self.vocabulary.random_seeds | {"numpy.random.seed", "random.seed"})
                     for c in self.q.index.of_type(self.ctx.module, cst.Call))
        torch_draws = any(self.q.callee_starts_with(c, prefix) for scope in loop_data_scopes(self, loop)
                          for c in self.q.index.of_type(scope, cst.Call) for prefix in _RANDOM if prefix != "numpy.random.")
        if not torch_draws:  # NumPy's global generator: dp.init() gives every rank rank 0's state
            self.report(
                loop, "note",
                "this training loop draws its data at random at every step with NumPy's generator, which dp.init() "
                "makes alike on every rank (rank 0's state): every rank draws the same batches, which is correct "
                "(the original's) but gives no speed-up." + policy,
                "seed each rank apart once the model is wrapped (np.random.seed(seed + dp.rank())): the ranks then "
                "draw different batches and the global batch is N x it",
            )
        elif seeded:
            self.report(
                loop, "note",
                "this training loop draws its data at random at every step, after a seed every rank sets alike: every "
                "rank draws the same batches, which is correct but gives no speed-up." + policy,
                "seed each rank apart once the model is wrapped (torch.manual_seed(seed + dp.rank())): the ranks then "
                "draw different batches and the global batch is N x it",
            )
        else:
            self.report(
                loop, "note",
                "this training loop draws its data at random at every step, unseeded: each rank draws its own batches, "
                "so the ranks train on different data and the global batch is N x the script's" + (
                    " (--batch global cannot split it: the batch size is not a loader's)" if policy else "") + ".",
                effect="shard",
            )

    def _calls_a_batcher(self, loop) -> bool:
        """``get_batch(data, i)``: a function of the file that slices the data for the loop; or, in the
        loop's iterable, a method of a class of the file that does (``for x, y in stream.windows(35)``)."""
        functions = self.q.module_functions()
        called = [functions[n] for n in self.q.called_names(loop) if n in functions]
        if isinstance(loop, cst.For):
            names = {c.func.attr.value for c in self.q.findall(loop.iter, m.Call(func=m.Attribute(attr=m.Name())))}
            called += [s for c in self.ctx.module.body if isinstance(c, cst.ClassDef)
                       for s in c.body.body if isinstance(s, cst.FunctionDef) and s.name.value in names]
        return any(self.q.index.of_type(f, cst.Subscript) or any(
            self.q.callee_starts_with(c, prefix) for prefix in _RANDOM for c in self.q.index.of_type(f, cst.Call)
        ) for f in called)
