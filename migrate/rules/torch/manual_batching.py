"""Scripts that batch by hand (no DataLoader): converted, and told how to shard the data."""

from __future__ import annotations

from ...codemod import patterns as m
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule


class ManualBatching(Rule):
    """Report training loops that slice their data by hand instead of reading a DataLoader.

    Why: with no DataLoader there is nothing to shard automatically. The converted script is still
    correct (every rank reads all the data, DDP averages identical gradients) but gets no speed-up.
    Example:  for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
                  data, targets = get_batch(train_data, i)
    -> note: shard it by hand, e.g. ``train_data = dp.shard(train_data)`` (this rank's contiguous
    part), with ``dp.per_rank_batch_size(B)`` where the batches are formed under ``--batch global``.
    Leaves alone: the loop itself (only a note; it changes nothing).
    """

    name = "manual-batching"

    def finish(self) -> None:
        if self.ctx.analysis(LoaderFlow).loaders:
            return
        loops = [f for f in self.q.findall(self.ctx.module, m.For() | m.While()) if self.q.has_backward(f.body)]
        innermost = [f for f in loops if not any(g is not f and self.q.index.contains(f, g) for g in loops)]
        for loop in innermost[:1]:
            policy = (" --batch global is not applied: no DataLoader batch size to split."
                      if self.ctx.options.batch == "global" else "")
            self.report(
                loop, "note",
                "this training loop batches its data by hand (no DataLoader): every rank reads all the data, "
                "which is correct but gives no speed-up." + policy,
                "shard the data by hand, e.g. train_data = dp.shard(train_data) before batching it",
            )
