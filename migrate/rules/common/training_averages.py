"""Dataset-wide averages of a sharded training loop, summed over all ranks."""

from __future__ import annotations

from ...codemod import patterns as m
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule
from .epoch_sums import epoch_sums


class TrainingAverages(Rule):
    """All-reduce the sums a training loop divides by ``len(loader.dataset)`` afterwards.

    Why: once the training loader is sharded, each rank adds up only its own part, while
    ``len(train_loader.dataset)`` is still the size of the whole dataset: the reported average
    would be about 1/N of the true one. Summing over the ranks first makes it the dataset's again
    (up to the few samples the training sampler repeats to give every rank the same number of steps).
    Example:  for data, _ in train_loader:              for data, _ in train_loader:
                  train_loss += loss.item()     ->          train_loss += loss.item()
                                                        train_loss = dp.all_reduce(train_loss, op="sum")
              print(train_loss / len(train_loader.dataset))
    Leaves alone: sums not divided by ``len(<loader>.dataset)`` after the loop (running logs,
    per-rank statistics); loops of loaders that were not sharded.
    """

    name = "training-dataset-averages"

    def finish(self) -> None:
        done: set[int] = set()
        flow = self.ctx.analysis(LoaderFlow)
        sharded = flow.sharded_training()
        whole = {id(loop.node) for loader in flow.loaders if loader not in sharded for loop in loader.loops}
        for loader in sharded:
            for loop in loader.loops:
                if loop.variable is None or id(loop.node) in done or id(loop.node) in whole:
                    continue  # (a loop that also reads a loader left whole: its sums are whole-set ones there)
                done.add(id(loop.node))
                sums = self._averaged_sums(loop, _dataset_name(loader.call))
                if sums:
                    self.ctx.plan.insert_after(loop.node, *(
                        self.statement(f'{s} = {{dp}}.all_reduce({s}, op="sum")\n') for s in sums
                    ))
                    by = f"len({loop.variable}.dataset), the whole dataset" if self._after_loop else "the whole dataset's size"
                    self.report(loop.node, "change", f"{', '.join(sums)} summed over all ranks after this loop: it is "
                                f"divided by {by}")
                reported = epoch_sums(self, loop, exclude=set(sums))
                if reported:
                    self.ctx.plan.insert_after(loop.node, *(
                        self.statement(f'{s} = {{dp}}.all_reduce({s}, op="{op}")\n') for s, op in reported.items()
                    ))
                    self.report(loop.node, "change", ", ".join(f"{s} {'summed' if op == 'sum' else 'averaged'}" for s, op
                                in reported.items()) + " over all ranks after this loop: this rank adds up only its "
                                "share of the epoch's batches, and the script reports it after the loop (a sum, or "
                                "divided by the number of batches: averaged)")

    def _averaged_sums(self, loop, dataset: str | None) -> list[str]:
        """Sums divided by the dataset's size: after the loop (``total / len(loader.dataset)``), or in the loop's own
        additions (``avg += loss.item() / len(train_set)``, LMF_Paddle: half the original's figure on 2 ranks)."""
        positions = self.ctx.positions
        end = positions[loop.node].end
        divisor = m.Call(func=m.Name("len"), args=[m.Arg(m.Attribute(value=m.Name(loop.variable), attr=m.Name("dataset")))])
        if dataset is not None:
            divisor = divisor | m.Call(func=m.Name("len"), args=[m.Arg(m.Name(dataset))])
        used: set[str] = set()
        self._after_loop = False
        for call in self.q.findall(loop.scope, divisor):
            if positions[call].start.line > end.line or (
                positions[call].start.line == end.line and positions[call].start.column >= end.column
            ):
                statement = self.q.statement_of(call)
                used.update(n.value for n in self.q.findall(statement, m.Name()))
                self._after_loop = self._after_loop or m.matches(call.args[0].value, m.Attribute())
        plain = self.q.assigned_names(loop.node) - {
            a.target.value for a in self.q.findall(loop.node, m.AugAssign(target=m.Name()))
        }
        sums = []
        for aug in self.q.findall(loop.node.body, m.AugAssign(target=m.Name(), operator=m.AddAssign())):
            name = aug.target.value
            divided_here = bool(self.q.findall(aug.value, divisor))
            if (name in used or divided_here) and name not in plain and name not in sums:
                sums.append(name)
        return sums


def _dataset_name(call) -> str | None:
    """``train_set`` in ``DataLoader(train_set, ...)`` or ``DataLoader(dataset=train_set, ...)``."""
    for index, arg in enumerate(call.args):
        if (arg.keyword is None and index == 0) or (arg.keyword is not None and arg.keyword.value == "dataset"):
            return arg.value.value if m.matches(arg.value, m.Name()) else None
    return None
