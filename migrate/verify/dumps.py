"""What one run of ``dpmigrate verify`` leaves on disk, written by the harness and read by the comparison.

One folder per process (``<out>/rank<r>``; the single process is rank 0 of its own ``<out>``):

- ``snap-<k>.npz``: every trained parameter after ``k`` optimizer steps (``k = 0``: before the first),
  keyed ``o<i>.p<j>`` (optimizer ``i`` in the order they first stepped, parameter ``j`` in its order).
  NumPy's format without pickles: nothing here is ever unpickled.
- ``record.json``: who wrote it, the parameters' names and shapes, the steps seen, the snapshots taken,
  the inputs consumed at each step (per-sample fingerprints), how the run stopped, what the harness
  changed (dropout and shuffling turned off), and the files the process wrote, deleted, read and listed
  with the barriers it passed (JSON lists: ``files``). Written last and atomically: a folder without it is a run
  that died before it could say anything.

Keys are positional, not names: a wrapper (DDP's ``module.``, Paddle's ``_layers.``) renames parameters
but never reorders an optimizer's list, so ``o0.p3`` is the same weight in the original and the
conversion. Names are for people.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

SCHEMA = "dpmigrate-verify-record/1"
RECORD = "record.json"


def snapshot_file(folder: Path, steps: int) -> Path:
    return folder / f"snap-{steps}.npz"


def rank_folder(out: Path, rank: int) -> Path:
    return out / f"rank{rank}"


@dataclasses.dataclass
class Parameter:
    key: str  # o<i>.p<j>
    name: str  # as the user knows it: fc1.weight (wrapper prefixes removed)
    shape: list[int]
    owner: str  # the class of the layer that holds it directly (BatchNorm2d, Linear...), or ""


@dataclasses.dataclass
class Inputs:
    """The samples one process consumed for one optimizer step: a fingerprint per sample.

    ``rows[d]`` fingerprints the slices of the batch along dimension ``d`` (dimension 0 always; for inputs
    taken at the model, dimension 1 too, for time-major sequences). ``source`` says where they were seen:
    ``loader`` (a DataLoader / dataset iterator), ``model`` (the trained model's input), ``step`` (Keras'
    ``train_step``) or ``feed`` (a static-graph feed)."""

    source: str
    rows: dict[str, list[str]]


@dataclasses.dataclass
class Record:
    rank: int
    world_size: int
    framework: str
    parameters: list[Parameter]
    snapshots: list[int]  # the k of every snap-<k>.npz written
    steps: int  # optimizer steps of the first optimizer that stepped (the one counted)
    optimizers: int  # how many optimizers stepped
    inputs: list[Inputs | None]  # index j: what step j + 1 consumed (None: nothing seen)
    stop: str  # "steps" (K reached), "exit" (the script ended first)
    batchnorm: list[str]  # names of the batch-normalisation layers the trained models hold
    changes: list[str]  # what the harness did to the run ("dropout off: 2 Dropout layers")
    child_processes: bool = False  # a process forked from the script's stepped an optimizer (not recorded)
    random_steps: list[int] = dataclasses.field(default_factory=list)  # steps that drew from a global generator
    optimizer_kinds: list[str] = dataclasses.field(default_factory=list)  # the class of each optimizer that stepped
    # step -> {generator that advanced in it ("python", "numpy", "torch"...): a digest of its state after the step}
    random_trace: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # the process's file events and barriers (:mod:`dpmigrate.verify.harness.files`): {} in records made before them
    files: dict = dataclasses.field(default_factory=dict)
    # what in the script reads a sample more than once per epoch by design ("Dataset.shuffle after repeat()")
    repeats: list[str] = dataclasses.field(default_factory=list)
    schema: str = SCHEMA

    def write(self, folder: Path) -> None:
        from dpmigrate.runtime.atomic import atomic_write

        data = json.dumps(dataclasses.asdict(self), indent=1).encode()
        atomic_write(folder / RECORD, lambda f: f.write(data))

    @classmethod
    def read(cls, folder: Path) -> Record:
        raw = json.loads((folder / RECORD).read_text())
        if raw.get("schema") != SCHEMA:
            raise ValueError(f"{folder / RECORD}: not a {SCHEMA} record")
        raw["parameters"] = [Parameter(**p) for p in raw["parameters"]]
        raw["inputs"] = [None if i is None else Inputs(**i) for i in raw["inputs"]]
        return cls(**raw)


def load_snapshot(folder: Path, steps: int) -> dict:
    """The parameters after ``steps`` steps, as float64 NumPy arrays (no pickles: ``allow_pickle=False``)."""
    import numpy as np

    with np.load(snapshot_file(folder, steps), allow_pickle=False) as saved:
        return {key: np.asarray(saved[key], dtype="float64") for key in saved.files}


def private_folder(path: Path) -> Path:
    """Create ``path`` (and parents) readable by this user only; refuse a link in its place."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path}: not a folder of ours")
    os.chmod(path, 0o700)
    return path
