"""The parts of the runtime contract that need no framework, written once for every backend.

Each backend (``torch.py``, later ``paddle.py`` and ``tensorflow.py``) keeps the contract's names and
signatures and passes in what only it knows: the world size, this process's rank, its barrier. So the
``--batch global`` and ``--scale-lr`` policies, the collective timeout read from ``DPMIGRATE_TIMEOUT``,
the main-process print, ``main_process_first`` and the contiguous split of ``shard`` behave, and fail,
identically whatever the framework. Standard library only: importing this module loads no framework.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import math
import os
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Callable

DEFAULT_TIMEOUT_SECONDS = 600.0
"""Collective timeout when neither ``init(timeout=)`` nor ``DPMIGRATE_TIMEOUT`` says otherwise.

Shorter than torch's 30 minutes so that a lost or diverging rank ends the job within minutes, long
enough for a rank-0-only evaluation or checkpoint between collectives."""

TIMEOUT_VARIABLE = "DPMIGRATE_TIMEOUT"  # set by `dpmigrate launch --timeout S`


def timeout_seconds(timeout: float | None, environ: Mapping[str, str] | None = None) -> float:
    """The collective timeout: ``init(timeout=)``, else ``DPMIGRATE_TIMEOUT``, else the default."""
    if timeout is not None:
        return float(timeout)
    return seconds_from_environment(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT_SECONDS, "the collective timeout in seconds, "
                                    "e.g. 300", environ)


def seconds_from_environment(variable: str, default: float, what: str,
                             environ: Mapping[str, str] | None = None) -> float:
    """A positive number of seconds from ``variable`` (``default`` when unset or blank); anything else is an
    error that names the variable and ``what`` to give instead."""
    text = (os.environ if environ is None else environ).get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{variable}={text!r}: give {what}")
    return value


def per_rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """The ``--batch global`` policy: each rank takes B / N, so the global batch stays B."""
    n = world_size
    if global_batch_size % n:
        raise ValueError(
            f"global batch size {global_batch_size} does not split evenly over {n} processes; "
            f"pick a multiple of {n} (e.g. {global_batch_size - global_batch_size % n or n}) or convert "
            "with --batch per-device"
        )
    return global_batch_size // n


def scale_lr(lr: float, world_size: int, rule: str = "linear") -> float:
    """The ``--scale-lr`` policy: ``lr * N`` or ``lr * sqrt(N)`` for a global batch N times larger."""
    if rule == "linear":
        return lr * world_size
    if rule == "sqrt":
        return lr * math.sqrt(world_size)
    if rule == "none":
        return lr
    raise ValueError(f"scale_lr(rule={rule!r}): use 'linear', 'sqrt' or 'none'")


def shard_indices(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank's contiguous share of n items; the first n % world_size ranks take one more."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def print_on_main_process(is_main_process: bool, *args, **kwargs) -> None:
    """``print`` when this is the main process, so logs are not repeated N times."""
    if is_main_process:
        builtins.print(*args, **kwargs)


@contextlib.contextmanager
def main_process_first(rank_in_group: Callable[[], int], barrier: Callable[[], None]) -> Iterator[None]:
    """Run the block on rank 0 of the group first, then on the others; every rank passes one barrier.

    ``rank_in_group`` is read on entering the block: the local rank for "first on each node", the
    global rank for "first in the job". For downloads and caches: the first process fills the cache,
    the others find it full.
    """
    first = rank_in_group() == 0
    if not first:
        barrier()
    try:
        yield
    finally:
        if first:
            barrier()


HASH_SEED_WARNING = (
    "dpmigrate: this rank hashes strings unlike rank 0 (PYTHONHASHSEED differs between the ranks): a set of strings "
    "iterates in another order here, so a vocabulary or a class list built from set(...) gives other ids on each rank "
    "and the ranks train on different data; launch every rank with the same PYTHONHASHSEED (dpmigrate launch sets one "
    "per job)")


def _string_hash_probe() -> int:
    """What this process's string hashing makes of a fixed text: equal on two processes only when their
    PYTHONHASHSEED is (a word list from ``list(set(words))``, an NNLM tutorial, issue 19 audit round I: each rank
    numbered the words its own way; trained on 2 ranks, it stalled at 500 times the original's loss)."""
    return hash("dpmigrate: string hash probe")


def share_host_generators(broadcast: Callable) -> None:
    """Give every rank rank 0's state of Python's ``random`` and of NumPy's global generator (when the script has
    imported NumPy), as ``init`` joins the job: what a script draws with them afterwards without a seed is then
    drawn alike on every rank, as the single process drew it once (rank 0 keeps its own state).

    Why: a single-card script draws data, splits and shuffles with unseeded generators, often in a local module
    the conversion cannot see into (a word2vec subsampling that kept a different number of samples on each rank:
    the ranks made different numbers of steps and the job aborted in an all-reduce; a pair sampler drawing other
    pairs on every rank). Accelerate synchronises generator states across processes the same way. Draws made
    before ``init`` (at import time) are not covered: the conversion broadcasts those it sees. A rank whose
    string hashing differs from rank 0's says so on its stderr (the order of sets of strings is not a generator's
    state: it is fixed when the interpreter starts).
    """
    state, rank0_hash = broadcast((random.getstate(), _string_hash_probe()))
    random.setstate(state)
    if rank0_hash != _string_hash_probe():
        print(HASH_SEED_WARNING, file=sys.stderr, flush=True)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.set_state(broadcast(numpy.random.get_state()))


class TrainingDraws:
    """Parts the ranks' random streams once training starts: rank 0 keeps its own (the original's), every other rank
    reseeds Python's ``random``, NumPy's global generator and the framework's from its current state and its rank.

    Why: ``init`` gives every rank rank 0's generator states (see :func:`share_host_generators`), and a seeded script
    seeds the framework's generator alike on every rank. That is right for what is drawn *before* training (the data,
    a split, a vocabulary: one draw, as the single process made it once) and wrong for what is drawn *during* it: a
    GAN's latent vectors and random labels, a gradient penalty's mixing weights, noise, masks, augmentation. Drawn
    alike, every rank feeds the same noise and the step averages one rank's draws N times over, where the single
    process drew a whole batch's worth (issue 31: four real GAN scripts trained that way, with nothing said;
    ``dpmigrate verify`` reports it as same-random-draws). shared/DESIGN.md: noise drawn during training differs per
    rank. Accelerate leaves each process's generators its own for the same reason.

    When: the backend calls :meth:`start` at the first pass over a sharded training loader, once: from there the
    ranks read different samples, so each rank's draws stand for the draws one process made for its share. Not
    where nothing is split (hand-cut batches every rank reads whole, ``fit`` in Paddle's hapi): there the draws stay
    alike, so every rank's step stays the original's. The new seeds are derived from each generator's state and the
    rank, so a seeded script's job draws the same numbers from one launch to the next. Not covered: a script that
    seeds again during training (its own choice, kept), TensorFlow (not yet).
    """

    def __init__(self) -> None:
        self.parted = False

    def start(self, rank: int, world_size: int, reseed_framework: Callable[[int], None] | None = None) -> None:
        if self.parted or world_size < 2:
            return
        self.parted = True
        if rank == 0:
            return
        random.seed(derived_seed(repr(random.getstate()).encode(), rank))
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            kind, keys, position, *_ = numpy.random.get_state()
            words = hashlib.sha256(keys.tobytes() + f"{kind}:{position}:{rank}".encode()).digest()
            numpy.random.seed(numpy.frombuffer(words, dtype=numpy.uint32))
        if reseed_framework is not None:
            reseed_framework(rank)


def derived_seed(state: bytes, rank: int) -> int:
    """A 63-bit seed from a generator's state and a rank: the same on every launch of a seeded job."""
    return int.from_bytes(hashlib.sha256(state + f":rank {rank}".encode()).digest()[:8], "big") >> 1
