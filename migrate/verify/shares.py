"""The shares pass: with the script's shuffling left on, does each rank still read its own share of every epoch?

The weight comparison runs with shuffling off, so both runs read the samples in the same order; that hides the one
fault shuffling brings: ranks that shuffle each their own way before taking their part (an unseeded shuffle, a seed
that depends on the rank, ``Dataset.shuffle`` before ``shard``) read overlapping parts, and the samples none of them
drew are never trained on that epoch. A real Keras script measured in issue 32 had 126 of its 256 samples on both
workers, and equal weights in the unshuffled comparison.

So, when the harness turned shuffling off in the conversion, verify runs the conversion once more with shuffling on
(``DPMIGRATE_VERIFY_SHUFFLED``) and reads each rank's sample fingerprints, step by step, in the window of the first
epoch: the steps before the original (shuffling off) starts over with its first batch again, or all the steps
recorded when it never does. In that window:

- **disjoint**: no sample is read by two ranks; up to ``N - 1`` are allowed once the epoch is complete, which is
  what a ``DistributedSampler`` pads with to give every rank as many samples;
- **covering** (when the epoch is complete in the window): the ranks read as many different samples as the
  original's epoch has; with ``drop_last`` each may drop other samples, so the count is compared, not the set.

A script whose data reads samples more than once per epoch by design (``repeat()`` before ``shuffle``, sampling
with replacement: :mod:`dpmigrate.verify.harness.repeats` notes them) leaves the shares unjudged, and the report says
so: one process reads repeats there too, and the job's seed decides whether they land on one rank or on two. So does
a rank that reads a sample twice in the window for a reason not noted (a batch peeked at before training).

Only steps whose inputs came from the data (a loader, ``train_step``, a feed) count: a model's inputs may be made by
another network (a GAN's generated images). NumPy-free; the records are :mod:`dpmigrate.verify.dumps`'s.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from . import dumps
from .compare import Cause

DATA_SOURCES = ("loader", "step", "feed")  # inputs read from the data, not made by a model
SHOWN = 3  # overlapping samples named in the message at most


@dataclasses.dataclass
class Shares:
    """What the pass found over its window: ``line`` for the report, ``cause`` when the shares are wrong."""

    steps: int = 0  # steps of the window whose inputs every rank recorded from the data
    epoch_complete: bool = False  # the window is the original's whole first epoch
    per_rank: list[int] = dataclasses.field(default_factory=list)  # samples each rank read in the window
    overlap: int = 0  # different samples read by two ranks or more
    distinct: int = 0  # different samples the ranks read together
    original: int = 0  # different samples of the original's first epoch (when complete)
    line: str = ""
    cause: Cause | None = None


def first_epoch(one: dumps.Record) -> int | None:
    """The steps of the original's first epoch: shuffling off, its second epoch starts with the first batch again
    (its samples, in order). None when the recorded steps never start over."""
    batches = [_data_rows(i) for i in one.inputs]
    if not batches or not batches[0]:
        return None
    for index, rows in enumerate(batches[1:], start=1):
        if rows == batches[0]:
            return index
    return None


def check(one: dumps.Record, ranks: list[dumps.Record]) -> Shares:
    """The shares of the shuffled conversion (``ranks``) against the original's first epoch (``one``)."""
    epoch = first_epoch(one)
    recorded = min(len(r.inputs) for r in ranks)
    window = recorded if epoch is None else min(epoch, recorded)
    found = Shares(epoch_complete=epoch is not None and epoch <= recorded)
    read: list[Counter] = [Counter() for _ in ranks]
    for index in range(window):
        rows = [_data_rows(r.inputs[index]) for r in ranks]
        if any(row is None for row in rows):
            continue
        found.steps += 1
        for counter, row in zip(read, rows):
            counter.update(row)
    if not found.steps:
        found.line = "shuffled: no input read from the data was seen on every rank: the shares are not proven"
        return found
    found.per_rank = [sum(c.values()) for c in read]
    by_design = sorted({what for record in [one, *ranks] for what in record.repeats})
    if by_design:  # repeats across ranks are then what one process reads too, wherever the seed puts them
        found.line = (f"shuffled: the script reads samples more than once per epoch ({', '.join(by_design)}): "
                      f"the shares of the first epoch's window of {found.steps} steps are not judged")
        return found
    twice = next((rank for rank, c in enumerate(read) if any(n > 1 for n in c.values())), None)
    if twice is not None:  # the window is not one pass over distinct samples: disjointness proves nothing there
        found.line = (f"shuffled: rank {twice} read a sample twice within the first epoch's window of {found.steps} "
                      "steps (a batch read before training, repeat() before shuffle, sampling with replacement): the "
                      "shares are not judged")
        return found
    owners = Counter(sample for c in read for sample in c)
    shared = [sample for sample, n in owners.items() if n > 1]
    found.overlap, found.distinct = len(shared), len(owners)
    window_words = (f"the first epoch ({found.steps} steps)" if found.epoch_complete else
                    f"{found.steps} step{'s' * (found.steps != 1)} of the first epoch")
    allowed = len(ranks) - 1 if found.epoch_complete else 0
    if found.overlap > allowed:
        found.cause = Cause("overlapping-shares", (
            f"with the script's shuffling on, {found.overlap} of the {found.distinct} samples read in {window_words} "
            f"were read by two ranks or more (rank samples {' + '.join(map(str, found.per_rank))}; e.g. "
            f"{', '.join(s[:12] for s in shared[:SHOWN])}): each rank shuffles its own way before taking its part (an "
            "unseeded shuffle, a seed that depends on the rank, Dataset.shuffle before shard), so the parts overlap "
            "and other samples are not trained on; shard first, then shuffle, or shuffle with one seed on every rank "
            "(dp.distributed_loader's sampler does: it reshuffles each epoch alike on all ranks)"))
    if found.epoch_complete:
        found.original = len({s for i in one.inputs[:epoch] for s in (_data_rows(i) or [])})
        if found.cause is None and found.distinct < found.original:
            found.cause = Cause("uncovered-samples", (
                f"with the script's shuffling on, the ranks read {found.distinct} different samples in the first "
                f"epoch ({found.steps} steps), the original {found.original}: {found.original - found.distinct} "
                "samples are not trained on in an epoch of the conversion"))
    if found.cause is None:
        covered = f", {found.distinct} different samples as the original's epoch" if found.epoch_complete else ""
        padded = f" ({found.overlap} read twice: the sampler's padding)" if found.overlap else ""
        found.line = (f"shuffled: the ranks' shares of {window_words} are disjoint{padded}{covered} "
                      f"({' + '.join(map(str, found.per_rank))} samples)")
    else:
        found.line = f"shuffled: {found.cause.kind} in {window_words}"
    return found


def _data_rows(inputs: dumps.Inputs | None) -> list[str] | None:
    """A step's sample fingerprints (dimension 0) when they were read from the data; None otherwise."""
    if inputs is None or inputs.source not in DATA_SOURCES:
        return None
    return inputs.rows.get("0")
