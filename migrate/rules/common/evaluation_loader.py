"""Shard evaluation DataLoaders when their metrics can be made exact, else leave them whole."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.loaders import Loader, LoaderFlow, Loop
from ...codemod.rule import Rule

_MUTATORS = {"append", "extend", "update", "add", "add_", "insert", "write", "writerow", "put", "copy_", "log"}


class EvaluationLoader(Rule):
    """Shard an evaluation loader with ``evaluation=True`` and all-reduce its sums, when exact.

    Why: evaluating the whole set on every rank is correct but does N times the work. Sharded
    without padding (``evaluation=True``), each sample is seen once, so sums all-reduced after the
    loop are exactly the single-process sums, and ``len(loader.dataset)`` is still the full size.
    Example:  test_loader = DataLoader(ds2, **test_kwargs)
           -> test_loader = dp.distributed_loader(DataLoader(ds2, **test_kwargs), evaluation=True)
              for data, target in test_loader:                for data, target in test_loader:
                  correct += ...                       ->         correct += ...
                                                              correct = dp.all_reduce(correct, op="sum")
    The loader is sharded only when every loop reading it just adds into variables it then
    reports (``+=``), keeps no per-batch value after the loop, and does not divide by
    ``len(loader)`` (the number of batches changes with sharding).
    Leaves alone (with a note): any other evaluation loop (lists of predictions, metric objects,
    ``break``): every rank evaluates the full set, which is correct with no speed-up.
    """

    name = "evaluation-loader"

    def finish(self) -> None:
        loaders = self.ctx.analysis(LoaderFlow).loaders
        readers: dict[int, list[Loader]] = {}
        for loader in loaders:
            for loop in loader.loops:
                readers.setdefault(id(loop.node), []).append(loader)
        verdicts = {id(loop.node): self._summable(loop) for loader in loaders for loop in loader.loops}
        sharded = {id(loader) for loader in loaders
                   if self.evaluates(loader) and all(verdicts[id(p.node)][1] is None for p in loader.loops)}
        changed = True
        while changed:  # a loop read by a loader left whole must not all-reduce: unshard its other readers
            changed = False
            for loader in loaders:
                if id(loader) in sharded and any(
                    id(r) not in sharded for p in loader.loops for r in readers[id(p.node)]
                ):
                    sharded.discard(id(loader))
                    changed = True
        reduced: set[int] = set()
        for loader in loaders:
            if not self.evaluates(loader):
                continue
            if id(loader) in sharded:
                self._shard(loader, verdicts, reduced)
            else:
                self._leave_whole(loader, verdicts, readers)

    def evaluates(self, loader: Loader) -> bool:
        """The loader only evaluates: its loops do not train, and (a rule set's say) nothing else trains on it."""
        return loader.role == "eval"

    def _shard(self, loader: Loader, verdicts, reduced: set[int]) -> None:
        self.ctx.plan.replace(
            loader.call,
            lambda updated: self.dp_call("distributed_loader", updated, cst.Arg(
                cst.Name("True"), keyword=cst.Name("evaluation"),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            )),
        )
        sums = sorted({a for p in loader.loops for a in verdicts[id(p.node)][0]})
        self.report(loader.call, "change", f"evaluation DataLoader{_named(loader.name)} sharded without padding "
                    f"(evaluation=True); its sums ({', '.join(sums)}) are all-reduced, so metrics stay exact")
        for loop in loader.loops:
            if id(loop.node) in reduced:
                continue
            reduced.add(id(loop.node))
            accumulators = verdicts[id(loop.node)][0]
            self.ctx.plan.insert_after(loop.node, *(
                self.statement(f'{a} = {{dp}}.all_reduce({a}, op="sum")\n') for a in accumulators
            ))
            self.report(loop.node, "change", f"{', '.join(accumulators)} summed over all ranks after this loop")

    def _leave_whole(self, loader: Loader, verdicts, readers: dict[int, list[Loader]]) -> None:
        trainers = [r for p in loader.loops for r in readers[id(p.node)] if r.role == "train"]
        reasons = [verdicts[id(p.node)][1] for p in loader.loops if verdicts[id(p.node)][1]]
        if trainers:  # epoch(train_loader, training=True) and epoch(test_loader, training=False): one loop for both
            reasons = [f"its loop also trains on{_named(trainers[0].name)} (told by its call when to train), so its "
                       "sums cannot be all-reduced there"]
        elif not reasons:
            reasons = ["a loop reading it is shared with a loader that is not sharded"]
        self.report(
            loader.call, "note",
            f"evaluation DataLoader{_named(loader.name)} left whole: every rank evaluates all of it (correct, "
            f"no speed-up), because {reasons[0]}",
        )

    # --- can this loop's result be all-reduced exactly? ---------------------------------------------

    def _summable(self, loop: Loop) -> tuple[list[str], str | None]:
        node = loop.node
        sums: list[str] = []
        plain: set[str] = set(_target_names(node.target))
        for found in self.q.findall(node.body, m.AugAssign() | m.AssignTarget() | m.AnnAssign() | m.For() | m.WithItem()):
            if isinstance(found, cst.AugAssign):
                if not isinstance(found.target, cst.Name):
                    return [], f"it updates `{self.code(found.target)}` inside the loop"
                if not isinstance(found.operator, cst.AddAssign):
                    return [], f"it updates `{found.target.value}` with {self.code(found.operator).strip()}"
                if found.target.value not in sums:
                    sums.append(found.target.value)
                continue
            target = found.asname.name if isinstance(found, cst.WithItem) and found.asname else getattr(found, "target", None)
            if target is None:
                continue
            names = _target_names(target)
            if not names and not isinstance(found, cst.WithItem):
                return [], f"it writes `{self.code(target)}` inside the loop"
            plain.update(names)
        for call in self.q.findall(node.body, m.Call(func=m.Attribute(attr=m.Name()))):
            owner = call.func.value
            if call.func.attr.value in _MUTATORS and isinstance(owner, cst.Name) and owner.value not in plain:
                return [], f"it collects results with `{self.code(call.func)}(...)`"
        if self.q.findall(node.body, m.Break() | m.Return()):
            return [], "its loop can stop early (break/return)"
        sums = [s for s in sums if s not in plain]
        if not sums:
            return [], "its loop adds up nothing the script uses afterwards"
        after = self._names_after(loop)
        leaked = sorted((plain - set(sums)) & {n.value for n in after})
        if leaked:
            return [], f"`{leaked[0]}` from the last batch is used after the loop"
        if loop.variable and self._divides_by_batches(loop):
            return [], f"it divides by len({loop.variable}), the number of batches, which sharding changes"
        return sums, None

    def _names_after(self, loop: Loop) -> list[cst.Name]:
        positions = self.ctx.positions
        end = positions[loop.node].end
        return [
            n for n in self.q.findall(loop.scope, m.Name())
            if (positions[n].start.line, positions[n].start.column) >= (end.line, end.column)
        ]

    def _divides_by_batches(self, loop: Loop) -> bool:
        positions = self.ctx.positions
        end = positions[loop.node].end
        pattern = m.Call(func=m.Name("len"), args=[m.Arg(m.Name(loop.variable) | m.Attribute(
            value=m.Name(loop.variable), attr=m.Name("sampler") | m.Name("batch_sampler")))])
        return any(positions[c].start.line >= end.line for c in self.q.findall(loop.scope, pattern))


def _target_names(target: cst.CSTNode) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _named(name: str | None) -> str:
    return f" `{name}`" if name else ""
