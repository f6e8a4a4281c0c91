"""Give each rank its own shard of every training DataLoader."""

from __future__ import annotations

from ...codemod.loaders import LoaderFlow, own_sampling
from ...codemod.rule import Rule
from ..common.evaluated_share import evaluated_share_note, imported_share_notes, unaveraged_note


class ShardTrainingLoader(Rule):
    """Wrap training DataLoaders in ``dp.distributed_loader(...)``.

    Why: without a distributed sampler every rank trains on the whole dataset, so N processes do
    the same work N times. The runtime rebuilds the loader with a sampler that gives each rank a
    disjoint shard, keeps batch size, shuffle (also when it sits in a ``**kwargs`` dict), drop_last
    and workers, and advances the epoch by itself (no forgotten ``set_epoch``).
    Example:  train_loader = DataLoader(ds, **train_kwargs)
           -> train_loader = dp.distributed_loader(DataLoader(ds, **train_kwargs))
    A loader trains when a loop reading its batches runs ``backward()`` or an optimizer step,
    followed through the script's own functions (``train(model, train_loader)``).
    Leaves alone: loaders with their own ``sampler=`` / ``batch_sampler=`` (declined: shard the
    sampler by hand); loaders whose batches cannot be followed (declined); evaluation loaders (the
    ``evaluation-loader`` rule).
    """

    name = "shard-training-loader"

    def finish(self) -> None:
        for loader in self.ctx.analysis(LoaderFlow).loaders:
            if loader.role == "unknown":
                self.report(
                    loader.call, "declined",
                    "cannot tell from the data flow whether this DataLoader trains (its batches are not "
                    "read by a for loop here or in a function it is passed to)",
                    "if it feeds training, wrap it: dp.distributed_loader(DataLoader(...)); if it evaluates, "
                    "leave it or use dp.distributed_loader(..., evaluation=True) and all-reduce the sums",
                )
            elif loader.role == "unaveraged":
                unaveraged_note(self, loader)
            elif loader.role == "train":
                own = own_sampling(loader)
                if own:
                    self.report(
                        loader.call, "declined",
                        f"training DataLoader with its own {own[0]}=: its sampling cannot be sharded for it",
                        "give each rank a disjoint part of the sampler's indices (e.g. with dp.shard(indices))",
                    )
                    continue
                self.ctx.plan.replace(loader.call, lambda updated: self.dp_call("distributed_loader", updated))
                self.report(loader.call, "change", f"training DataLoader{_named(loader.name)} sharded: "
                            "dp.distributed_loader gives each rank a disjoint part", effect="shard")
                evaluated_share_note(self, loader)
        imported_share_notes(self)


def _named(name: str | None) -> str:
    return f" `{name}`" if name else ""
