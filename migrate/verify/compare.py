"""Compare the original's record with the converted job's, and say why they differ.

Inputs: the single process's record and one record per rank (:mod:`dpmigrate.verify.dumps`). Checks, in
the order a person would want them:

1. the same work: both runs stepped, trained parameters of the same shapes, the same number of steps;
2. the ranks agree with each other after every step (else a model or optimizer is not synchronised);
3. the data was split: at every step the ranks' samples are disjoint and together are the original's
   batch (equal weights prove nothing when every rank read the whole batch);
4. rank 0's parameters equal the original's after every step, to the tolerance;
5. the ranks leave no file clash behind (:mod:`.files`: a path written by several ranks, one outside the working
   folder deleted by several, one changed by a rank while another reads it with no barrier between).

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

from . import draws, dumps, files

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
    # the first step whose update (the change the step made) differs from the original's by more than
    # UPDATE_TOLERANCE of it, while the weights may still be within the tolerance (small learning rates)
    update_differs: Difference | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


_ADAPTIVE = ("Adam", "RMSprop", "RMSProp", "Adagrad", "Adadelta", "Adamax", "Lamb", "Lion", "Adafactor")
ROUNDING_SIZE = 1e-3  # an adaptive optimizer's float32 rounding stays below this after a few steps
UPDATE_TOLERANCE = 0.05  # a step's update may differ from the original's by 5 % of it (float32 noise is far below)
UPDATE_FLOOR = 2e-5  # updates smaller than this share of the weights are too small to compare that way (float32's
# rounding and reduction order move the weights by about 1e-7 of their size: under 1 % of an update this large)


def compare(single: Path, job: Path, world_size: int, tolerance: float) -> Comparison:
    """``single``: the original's record folder; ``job``: the folder holding ``rank<r>`` of the conversion."""
    one = dumps.Record.read(dumps.rank_folder(single, 0))
    ranks = [dumps.Record.read(dumps.rank_folder(job, r)) for r in range(world_size)]
    causes: list[Cause] = []
    work = _different_work(one, ranks)
    if work:
        causes.append(Cause("different-work", work))
    common = sorted(set(one.snapshots).intersection(*(r.snapshots for r in ranks)))
    weights = _Weights({p.key: p.name for p in one.parameters}, tolerance, world_size)
    if common and _same_parameters(one, ranks[0]):
        for step in common:
            weights.step(step, dumps.load_snapshot(dumps.rank_folder(single, 0), step),
                         [dumps.load_snapshot(dumps.rank_folder(job, r), step) for r in range(world_size)])
    data = check_data(one, ranks)
    if weights.disagree is not None:
        causes.append(_unsynchronised(weights.disagree, ranks, one))
    if data.same:
        causes.append(Cause("not-sharded", (
            f"every rank consumed the same {data.sizes[1][0] if data.sizes else ''} samples at step {data.same[0]}"
            f"{' (and ' + str(len(data.same) - 1) + ' more steps)' if len(data.same) > 1 else ''}: the data is not "
            "split between the ranks, so they repeat each other's work (even where the weights match): a loader not "
            "passed through dp.distributed_loader(...), data used whole (full batch, batches cut by hand: dp.shard), or "
            "a dataset drawing its samples from a generator seeded alike on every rank (derive them from the index)")))
    same = draws.same_draws(one, ranks)
    if same:
        causes.append(Cause("same-random-draws", draws.message(same, world_size)))
    first = weights.first or weights.update_differs
    if first is None and data.other:
        causes.append(_data_cause(data))
    if first is not None:
        causes.extend(_divergence_causes(first, weights.worst or first, weights.factor, one, data, world_size,
                                         already=bool(causes)))
    clashes = [Cause("files", message) for message in files.check(one.files, [r.files for r in ranks])]
    causes.extend(clashes)
    equivalent = (first is None and weights.disagree is None and not data.same and not data.other and not work
                  and bool(common) and one.steps > 0 and not clashes and not same)
    return Comparison(
        equivalent=equivalent, steps=max(common, default=0), max_difference=weights.max_difference,
        first=weights.first, differing=weights.differing, parameters=len(one.parameters),
        values=sum(_size(p.shape) for p in one.parameters), ranks_disagree=weights.disagree, data=data, causes=causes,
        original_steps=one.steps, converted_steps=[r.steps for r in ranks], update_differs=weights.update_differs,
        notes=weights.notes())


def _same_parameters(one: dumps.Record, other: dumps.Record) -> bool:
    return [(p.key, p.shape) for p in one.parameters] == [(p.key, p.shape) for p in other.parameters]


class _Weights:
    """The step-by-step comparison of the parameters: rank 0 against the original, the ranks against each other,
    and each step's update against the original's. Snapshots of one step hold the parameters of the optimizers
    that had stepped by then (a second optimizer joins later): only the keys both sides hold are compared, and a
    key one side lacks is different work (said by :func:`_different_work`)."""

    def __init__(self, names: dict[str, str], tolerance: float, world_size: int) -> None:
        self.names, self.tolerance, self.world_size = names, tolerance, world_size
        self.first = self.worst = self.disagree = self.update_differs = None
        self.factor: Cause | None = None
        self.max_difference, self.differing = 0.0, 0
        self.previous: tuple[dict, dict] | None = None
        self.small_updates = 0

    def step(self, step: int, original: dict, converted: list[dict]) -> None:
        keys = [k for k in original if all(k in c for c in converted)]
        if self.disagree is None:
            self.disagree = _first_past({k: converted[0][k] for k in keys}, converted[1:], self.names, step,
                                        self.tolerance)
        gaps = {k: _max_abs(converted[0][k] - original[k]) for k in keys}
        self.max_difference = max([self.max_difference, *gaps.values()])
        if self.first is None:
            past = [k for k in keys if gaps[k] > self.tolerance]
            if past:
                worst = max(past, key=gaps.get)
                self.first = Difference(step, self.names.get(past[0], past[0]), gaps[past[0]])
                self.worst = Difference(step, self.names.get(worst, worst), gaps[worst])
                self.differing = len(past)
                if self.previous is not None and self.update_differs is None:
                    self.factor = _factor(self.previous, (original, converted[0]), self.world_size)
        if self.previous is not None and self.first is None and self.update_differs is None:
            self._check_update(step, original, converted[0])
        self.previous = (original, converted[0])

    def _check_update(self, step: int, original: dict, converted: dict) -> None:
        import numpy as np

        before_original, before_converted = self.previous
        keys = [k for k in original if k in converted and k in before_original and k in before_converted]
        if not keys:
            return
        mine = np.concatenate([(original[k] - before_original[k]).ravel() for k in keys])
        theirs = np.concatenate([(converted[k] - before_converted[k]).ravel() for k in keys])
        size = float(np.linalg.norm(mine))
        scale = float(np.linalg.norm(np.concatenate([original[k].ravel() for k in keys])))
        if size <= UPDATE_FLOOR * scale:
            self.small_updates += 1
            return
        relative = float(np.linalg.norm(theirs - mine)) / size
        if relative > UPDATE_TOLERANCE:
            share = {k: float(np.linalg.norm((converted[k] - before_converted[k]) - (original[k] - before_original[k])))
                     for k in keys}
            worst = max(share, key=share.get)
            self.update_differs = Difference(step, self.names.get(worst, worst), relative)
            self.factor = _factor(self.previous, (original, converted), self.world_size)

    def notes(self) -> list[str]:
        if self.small_updates:
            return [f"{self.small_updates} step(s) moved the weights by less than {UPDATE_FLOOR:g} of their size: too "
                    "little to compare the updates themselves, only the weights (raise the learning rate for verify "
                    "to check a loss or learning-rate factor)"]
        return []


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
    shapes = [(p.key, tuple(p.shape)) for p in one.parameters]
    theirs = [(p.key, tuple(p.shape)) for p in ranks[0].parameters]
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

    keys = [k for k in after[0] if k in after[1] and k in before[0] and k in before[1]]
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
            f"every gradient after it differs (the largest difference is in {worst.parameter}). Synchronise them "
            "where the framework runs synchronised batch normalisation (convert with --sync-batchnorm: Keras on any "
            "device, which `dpmigrate verify --sync-batchnorm` checks here; torch on CUDA, Paddle on GPUs), or "
            "accept the difference")))
    if data.other and data.other[0] <= first.step and factor is None and shares is None:
        causes.append(_data_cause(data))
    adaptive = [k for k in one.optimizer_kinds if any(a in k for a in _ADAPTIVE)]
    if not causes and not already and adaptive and worst.value < ROUNDING_SIZE:
        causes.append(Cause("adaptive-rounding", (
            f"the optimizer ({adaptive[0]}) scales each step by the gradients' own size, so float32 rounding of gradients "
            f"near zero (summed in another order over N ranks) becomes a visible weight difference ({worst.value:.1g} in "
            f"{worst.parameter}); with plain SGD or in float64 the same conversion compares at 1e-10 when it is right. "
            "Verify with SGD (or float64) to tell a fault from rounding")))
    drawing = [s for s in one.random_steps if s >= 2]  # (step 1 is not told apart from the model's initialisation)
    if not causes and not already and drawing:
        causes.append(Cause("random-draws", (
            f"the training steps draw random numbers (noise, masking, augmentation: steps {', '.join(map(str, drawing[:5]))}"
            f"{' ...' if len(drawing) > 5 else ''}) from a global generator: one process "
            "draws them for the whole batch, each rank for its share, so the samples get other numbers than in the "
            "original (a difference of the comparison, not a fault, unless the script wants them seeded alike: derive "
            "them from the sample's index to make both runs draw the same)")))
    if not causes and not already:
        causes.append(Cause("unknown", (
            f"no known pattern: the first difference is in {first.parameter} after step {first.step}; run "
            "`dpmigrate --diff` on the script and look at what changes the loss or the gradients")))
    return causes


def _data_cause(data: DataCheck) -> Cause:
    if data.batch_differs and all(r == data.sizes[0] for r in data.sizes[1]):
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
        verdict, sizes, detail = _split(mine, theirs)
        if verdict == "other" and _generated(mine, theirs, sizes):
            continue  # not comparable sample by sample: below
        check.observed += 1
        check.source = check.source or theirs[0].source
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


def _generated(mine: dumps.Inputs, theirs: list[dumps.Inputs], sizes: tuple[int, list[int]]) -> bool:
    """Inputs only seen at the model (a GAN's generated images fed to its discriminator), as many in all as the
    original's: made by a network whose weights differ from the original's by float rounding, their fingerprints
    differ although the work is the same (a DCGAN of round Q: "different work" at every generator step from the
    second on, its weights within 1e-6). Such a step is not counted as observed; the weights still are compared."""
    return mine.source == "model" and all(t.source == "model" for t in theirs) and sum(sizes[1]) == sizes[0] > 0


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
