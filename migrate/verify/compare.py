"""Compare the original's record with the converted job's, and say why they differ.

Inputs: the single process's record and one record per rank (:mod:`dpmigrate.verify.dumps`). Checks, in
the order a person would want them:

1. the same work: both runs stepped, trained parameters of the same shapes, the same number of steps;
2. the ranks agree with each other after every step (else a model or optimizer is not synchronised);
3. the data was split: at every step the ranks' samples are disjoint and together are the original's
   batch (equal weights prove nothing when every rank read the whole batch);
4. rank 0's parameters equal the original's after every step, to the tolerance.

When they differ, :func:`causes` names the likely reason from the evidence: ranks that disagree, the
same inputs everywhere, an update that is a constant factor (N or 1/N) of the original's, batch
normalisation over each rank's share, unequal shares averaged with equal weights, inputs that are not
the original batch split, other initial weights. NumPy only.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from itertools import chain
from pathlib import Path

from . import dumps

FACTOR_FIT = 0.05  # an update is "a constant factor" of the other when the rest is under 5 % of it


@dataclasses.dataclass
class Difference:
    step: int
    parameter: str
    value: float


@dataclasses.dataclass
class DataCheck:
    observed: int = 0  # steps whose inputs both runs recorded
    split: int = 0  # ... of which the ranks' samples partition the original's batch
    same: list[int] = dataclasses.field(default_factory=list)  # steps at which every rank read the same samples
    other: list[int] = dataclasses.field(default_factory=list)  # steps that are neither
    uneven: list[tuple[int, list[int]]] = dataclasses.field(default_factory=list)  # split steps with unequal shares
    source: str = ""
    sizes: tuple[int, list[int]] | None = None  # (original's samples, each rank's) at the first observed step
    detail: str = ""  # the first mismatch, in words

    @property
    def batch_differs(self) -> bool:
        """The ranks together consume more or fewer samples per step than the original."""
        return self.sizes is not None and sum(self.sizes[1]) != self.sizes[0]


@dataclasses.dataclass
class Cause:
    kind: str
    message: str


@dataclasses.dataclass
class Comparison:
    equivalent: bool
    steps: int  # steps compared
    max_difference: float  # rank 0 against the original, over every compared step
    first: Difference | None  # the first parameter past the tolerance (in step, then parameter order)
    differing: int  # parameters past the tolerance at that step
    parameters: int
    values: int
    ranks_disagree: Difference | None
    data: DataCheck
    causes: list[Cause]
    original_steps: int
    converted_steps: list[int]


def compare(single: Path, job: Path, world_size: int, tolerance: float) -> Comparison:
    """``single``: the original's record folder; ``job``: the folder holding ``rank<r>`` of the conversion."""
    one = dumps.Record.read(dumps.rank_folder(single, 0))
    ranks = [dumps.Record.read(dumps.rank_folder(job, r)) for r in range(world_size)]
    names = {p.key: p.name for p in one.parameters}
    causes: list[Cause] = []
    work = _different_work(one, ranks)
    if work:
        causes.append(Cause("different-work", work))
    common = sorted(set(one.snapshots).intersection(*(r.snapshots for r in ranks)))
    same_shapes = [p.shape for p in one.parameters] == [p.shape for p in ranks[0].parameters]
    first = first_worst = disagree = None
    max_difference, differing = 0.0, 0
    previous = None
    factor_cause = None
    if same_shapes and common:
        for step in common:
            original = dumps.load_snapshot(dumps.rank_folder(single, 0), step)
            converted = [dumps.load_snapshot(dumps.rank_folder(job, r), step) for r in range(world_size)]
            if disagree is None:
                disagree = _first_past(converted[0], converted[1:], names, step, tolerance)
            gaps = {key: _max_abs(converted[0][key] - original[key]) for key in original}
            max_difference = max([max_difference, *gaps.values()])
            if first is None:
                past = [key for key in original if gaps[key] > tolerance]
                if past:
                    worst = max(past, key=gaps.get)
                    first = Difference(step, names[past[0]], gaps[past[0]])
                    first_worst = Difference(step, names[worst], gaps[worst])
                    differing = len(past)
                    if previous is not None:
                        factor_cause = _factor(previous, (original, converted[0]), world_size)
            previous = (original, converted[0])
    data = check_data(one, ranks)
    if disagree is not None:
        causes.append(_unsynchronised(disagree, ranks, one))
    if data.same:
        causes.append(Cause("not-sharded", (
            f"every rank consumed the same {data.sizes[1][0] if data.sizes else ''} samples at step {data.same[0]}"
            f"{' (and ' + str(len(data.same) - 1) + ' more steps)' if len(data.same) > 1 else ''}: the data is not "
            "sharded, so the ranks repeat each other's work (even where the weights match). Pass the training "
            "loader through dp.distributed_loader(...) (or the dataset through dp.shard)")))
    if first is None and data.other:
        causes.append(_data_cause(data))
    if first is not None:
        causes.extend(_divergence_causes(first, first_worst, factor_cause, one, data, world_size,
                                         already=bool(causes)))
    equivalent = (first is None and disagree is None and not data.same and not data.other and not work
                  and bool(common) and one.steps > 0)
    return Comparison(
        equivalent=equivalent, steps=max(common, default=0), max_difference=max_difference, first=first,
        differing=differing, parameters=len(one.parameters),
        values=sum(_size(p.shape) for p in one.parameters), ranks_disagree=disagree, data=data, causes=causes,
        original_steps=one.steps, converted_steps=[r.steps for r in ranks])


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _max_abs(array) -> float:
    import numpy as np

    return float(np.max(np.abs(array))) if array.size else 0.0


def _different_work(one: dumps.Record, ranks: list[dumps.Record]) -> str:
    if one.steps == 0:
        return ""  # said by the caller: no optimizer step in the original
    if not ranks[0].parameters:
        return "the converted script made no optimizer step"
    shapes = [tuple(p.shape) for p in one.parameters]
    theirs = [tuple(p.shape) for p in ranks[0].parameters]
    if shapes != theirs:
        return (f"the original trains {len(shapes)} parameters with {one.optimizers} optimizer(s), the converted "
                f"script {len(theirs)} with {ranks[0].optimizers}: it trains something else")
    late = [r.rank for r in ranks if r.steps != one.steps]
    if late:
        counts = ", ".join(f"rank {r.rank} {r.steps}" for r in ranks)
        return f"the original made {one.steps} optimizer steps, the converted script {counts}: it did different work"
    return ""


def _first_past(reference: dict, others: list[dict], names: dict, step: int, tolerance: float) -> Difference | None:
    for other in others:
        for key in reference:
            gap = _max_abs(other[key] - reference[key])
            if gap > tolerance:
                return Difference(step, names.get(key, key), gap)
    return None


def _unsynchronised(disagree: Difference, ranks: list[dumps.Record], one: dumps.Record) -> Cause:
    when = ("from the start: the other ranks' initial weights are not rank 0's (never broadcast)"
            if disagree.step == 0 else f"after step {disagree.step}")
    tensorflow = ("; TF: build and compile a fit model under dp.scope(). A custom loop stepping eagerly (no "
                  "tf.function) computes its first gradients before dp.distributed_optimizer makes the workers' "
                  "weights equal: seed the initialisation alike on every worker, or run the step in a tf.function"
                  if one.framework == "tensorflow" else "")
    return Cause("unsynchronised", (
        f"the ranks' parameters disagree {when} ({disagree.parameter} by {disagree.value:.2g}): a model or optimizer "
        "is not synchronised, so each rank trains its own copy. Wrap the model with dp.distributed_model(...) and "
        f"the optimizer with dp.distributed_optimizer(...){tensorflow}"))


def _factor(before: tuple[dict, dict], after: tuple[dict, dict], world_size: int) -> Cause | None:
    """The converted update at the first divergent step as a multiple of the original's, if it is one."""
    import numpy as np

    keys = list(after[0])
    original = np.concatenate([(after[0][k] - before[0][k]).ravel() for k in keys]) if keys else np.zeros(0)
    converted = np.concatenate([(after[1][k] - before[1][k]).ravel() for k in keys]) if keys else np.zeros(0)
    norm = float(original @ original)
    if norm == 0.0 or not np.any(converted):
        return None
    factor = float(converted @ original) / norm
    rest = float(np.linalg.norm(converted - factor * original)) / float(np.linalg.norm(converted))
    if rest > FACTOR_FIT or abs(factor - 1.0) < FACTOR_FIT:
        return None
    n = world_size
    if abs(factor - n) <= FACTOR_FIT * n:
        return Cause("scaled-update", (
            f"the converted update is {factor:.3g}x the original's (N = {n}): the gradients are summed over the ranks "
            "instead of averaged, or the loss is not divided by the number of replicas (TF: a custom loop or "
            "train_step whose loss is a mean over the local batch; scale it with tf.nn.compute_average_loss or "
            "divide it by num_replicas_in_sync inside the GradientTape), or the learning rate was scaled by N"))
    if abs(factor - 1.0 / n) <= FACTOR_FIT / n:
        return Cause("scaled-update", (
            f"the converted update is {factor:.3g}x the original's (1/N, N = {n}): a loss summed over the batch "
            "(reduction=\"sum\" or .sum()) is averaged across the ranks, so every step moves 1/N as far. Multiply "
            "that loss by dp.world_size() (or use a mean and scale the learning rate)"))
    return Cause("scaled-update", (
        f"the converted update is {factor:.3g}x the original's: the loss or the learning rate is scaled differently "
        "in the conversion"))


def _divergence_causes(first: Difference, worst: Difference, factor: Cause | None, one: dumps.Record,
                       data: DataCheck, world_size: int, already: bool) -> list[Cause]:
    causes = []
    if first.step == 0:
        return [Cause("initial-weights", (
            f"the converted script starts from other weights ({first.parameter} differs by {first.value:.2g} before "
            "the first step): it consumed randomness differently before building the model, or loaded other weights"))]
    if factor is not None:
        causes.append(factor)
    shares = dict(data.uneven).get(first.step)
    if shares is not None and factor is None:
        causes.append(Cause("uneven-shares", (
            f"at step {first.step} the ranks held unequal shares of the original's batch ({' + '.join(map(str, shares))} "
            "samples) and their gradients were averaged with equal weights, so the update is not the whole batch's "
            "(the last batch of an epoch when the data set is not a multiple of the global batch). Drop the remainder "
            "(drop_last=True, drop_remainder=True), or weight each rank's loss by its share")))
    if one.batchnorm and factor is None and shares is None:
        where = ", ".join(one.batchnorm[:4]) + (" ..." if len(one.batchnorm) > 4 else "")
        causes.append(Cause("batchnorm", (
            f"batch normalisation ({where}) normalises each rank's share of the batch, not the whole batch, so "
            f"every gradient after it differs (the largest difference is in {worst.parameter}). Convert with "
            "--sync-batchnorm (SyncBatchNorm) where the framework supports it, or accept the difference")))
    if data.other and data.other[0] <= first.step and factor is None and shares is None:
        causes.append(_data_cause(data))
    if not causes and not already:
        causes.append(Cause("unknown", (
            f"no known pattern: the first difference is in {first.parameter} after step {first.step}; run "
            "`dpmigrate --diff` on the script and look at what changes the loss or the gradients")))
    return causes


def _data_cause(data: DataCheck) -> Cause:
    if data.batch_differs:
        original, ranks = data.sizes
        return Cause("global-batch", (
            f"the converted job consumes {sum(ranks)} samples per step ({' + '.join(map(str, ranks))}), the original "
            f"{original}: every rank keeps the whole batch size (a per-device batch, or data drawn or batched by hand, "
            "which --batch global cannot split), so each step averages other samples than the original's"))
    return Cause("inputs-differ", (
        f"at step {data.other[0]} the ranks did not consume the original's batch split between them: {data.detail}"))


def check_data(one: dumps.Record, ranks: list[dumps.Record]) -> DataCheck:
    """Whether, at every step both runs recorded, the ranks split the original's samples between them."""
    check = DataCheck()
    for index in range(min([len(one.inputs), *(len(r.inputs) for r in ranks)])):
        mine = one.inputs[index]
        theirs = [r.inputs[index] for r in ranks]
        if mine is None or any(t is None for t in theirs):
            continue
        step = index + 1
        check.observed += 1
        check.source = check.source or theirs[0].source
        verdict, sizes, detail = _split(mine, theirs)
        if check.sizes is None:
            check.sizes = sizes
        if verdict == "split":
            check.split += 1
            if len(set(sizes[1])) > 1:
                check.uneven.append((step, sizes[1]))
        elif verdict == "same" and len(ranks) > 1:
            check.same.append(step)
        else:
            check.other.append(step)
            check.detail = check.detail or detail
    return check


def _split(mine: dumps.Inputs, theirs: list[dumps.Inputs]) -> tuple[str, tuple[int, list[int]], str]:
    dims = [d for d in ("0", "1") if d in mine.rows and all(d in t.rows for t in theirs)]
    outcome = None
    for dim in dims:
        original = mine.rows[dim]
        parts = [t.rows[dim] for t in theirs]
        sizes = (len(original), [len(p) for p in parts])
        if len(parts) > 1 and all(Counter(p) == Counter(parts[0]) for p in parts[1:]) and parts[0]:
            return "same", sizes, ""
        if all(parts) and Counter(chain(*parts)) == Counter(original):
            return "split", sizes, ""
        if outcome is None:
            found = sum((Counter(chain(*parts)) & Counter(original)).values())
            total = sum(len(p) for p in parts)
            overlap = sum((Counter(parts[0]) & Counter(chain(*parts[1:]))).values()) if len(parts) > 1 else 0
            detail = (f"the original consumed {len(original)} samples, the ranks "
                      f"{' + '.join(str(len(p)) for p in parts)}; {found} of the ranks' {total} are in the original's "
                      f"batch" + (f", {overlap} of rank 0's were also read by another rank" if overlap else ""))
            outcome = ("other", sizes, detail)
    return outcome or ("other", (0, []), "no comparable inputs")
