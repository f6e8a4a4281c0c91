"""The harness inside each run of ``dpmigrate verify``: the framework-neutral half.

``dpmigrate verify`` starts the original script (one process) and the converted one (N processes, under
the real launcher) with ``dpmigrate/verify/boot`` first on ``PYTHONPATH``: its ``sitecustomize`` calls
:func:`activate` before the script starts, in every Python process of the job, and the harness wakes up
only in the processes that run the script (``sys.argv[0]`` is ``DPMIGRATE_VERIFY_SCRIPT``), never in a
launcher. The scripts themselves are not edited. It then:

- seeds Python's ``random`` now, and NumPy and the framework as they are imported: the single process
  and rank 0 alike, every other rank differently, so randomness a conversion failed to share shows up
  while rank 0's start, which a correct conversion broadcasts, is the original's; a library transform's draws
  for a sample (augmentation) are keyed by its index instead (:mod:`.sample_draws`), alike wherever it lands;
- lets one adapter per framework (:mod:`.torch`, :mod:`.paddle`, :mod:`.tensorflow`) turn dropout and
  shuffling off (shuffling stays on in the shares pass, ``DPMIGRATE_VERIFY_SHUFFLED``), count optimizer steps
  at the framework level (an optimizer the conversion forgot to
  wrap is still seen) and report what each step consumed;
- after ``K`` optimizer steps (of every optimizer together), writes every trained parameter as it was after
  each step and the per-sample fingerprints of the inputs (:mod:`dpmigrate.verify.dumps`), and ends the
  process (the ranks of a job meet first, through files, so none dies in a peer's collective), or, with
  ``DPMIGRATE_VERIFY_TO_END``, lets the script go on unrecorded to its end or a time bound (:func:`.leaving.go_on`) and
  says how it ended (``END_FILE``); a script that ends before ``K`` steps is recorded at exit (``os._exit`` too).

Adapters call :meth:`Recorder.track` when an optimizer first steps, :meth:`Recorder.boundary` at step
boundaries and :meth:`Recorder.consumed` for inputs. Standard library only until NumPy is needed.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from .. import dumps
from . import file_wrappers, files, fingerprint, leaving, sample_draws
from .after_import import AfterImport

ENV_OUT = "DPMIGRATE_VERIFY_OUT"
ENV_SCRIPT = "DPMIGRATE_VERIFY_SCRIPT"
ENV_STEPS = "DPMIGRATE_VERIFY_STEPS"
ENV_PARENT = "DPMIGRATE_VERIFY_PARENT"  # the pid of the script's process, for the processes it starts
ENV_TO_END = "DPMIGRATE_VERIFY_TO_END"  # seconds the run goes on past step K (0 or unset: it ends at step K)
ENV_SHUFFLED = "DPMIGRATE_VERIFY_SHUFFLED"  # "1": the shares pass, shuffling left on (:mod:`dpmigrate.verify.shares`)
END_FILE = "end.json"  # past step K: {"ended": "exit" | "bound" | "os._exit(N)", "steps": n, "seconds": s past K}
BASE_SEED = 1234
CHILD_MARK = "trained-in-a-child-process"
RANDOM_TRACE_STEPS = 200  # steps whose generators' states are kept (the comparison reads the first K)
SOURCE_PREFERENCE = ("step", "feed", "loader", "model")  # what a step consumed, best evidence first

_recorder: Recorder | None = None


def seed_for(rank: int) -> int:
    """The single process and rank 0 alike; other ranks apart (randomness not shared must show)."""
    return BASE_SEED if rank == 0 else BASE_SEED + 7919 * rank


class Recorder:
    """One process's record: parameters per step, inputs per step, how it stopped."""

    def __init__(self, out: Path, steps: int, rank: int, world_size: int, pid: int | None = None):
        self.out, self.wanted, self.rank, self.world_size = out, steps, rank, world_size
        self.folder = dumps.private_folder(dumps.rank_folder(out, rank))
        self.seed = seed_for(rank)
        self.framework = ""
        self.parameters: list[dumps.Parameter] = []
        self._readers: list[Callable[[], object]] = []
        self._optimizers: list[object] = []  # kept alive: their ids must stay theirs
        self._steps_done: list[Callable[[], int]] = []  # each tracked optimizer's completed steps
        self.optimizer_kinds: list[str] = []  # their classes' names (Adam's steps amplify float rounding)
        self.snapshots: list[int] = []
        self.completed = 0
        # (source, stream, per-sample rows, a loader batch's first-array rows: which loader fed the model)
        self._pending: list[tuple[str, int, dict[str, list[str]], set[str]]] = []
        self.inputs: dict[int, dumps.Inputs] = {}
        self.batchnorm: list[str] = []
        self.changes: dict[str, None] = {}
        self.repeats: dict[str, None] = {}  # what reads samples more than once per epoch by design
        self.random_states: list[Callable[[], bytes]] = []  # the framework's generator state (adapters add it)
        self.random_steps: list[int] = []  # steps during which a global generator advanced
        self.random_trace: dict[str, dict[str, str]] = {}  # step -> {generator that advanced: its state's digest}
        self._last_random: dict[str, bytes] | None = None
        self.finished = False
        self.shuffled = os.environ.get(ENV_SHUFFLED) == "1"  # adapters leave the script's shuffling on
        self.to_end = float(os.environ.get(ENV_TO_END) or 0)  # > 0: go on past step K, at most this long
        self.ended = False  # END_FILE written
        self.past_k: float | None = None  # when the run went on past step K (time.monotonic())
        self.pid = os.getpid() if pid is None else pid  # another pid: a child of the script (records nothing)
        self._lock = threading.RLock()

    # --- what adapters call --------------------------------------------------------------------------

    def track(self, optimizer, describe: Callable[[], list[tuple[str, list[int], str, Callable[[], object]]]],
              steps_done: Callable[[], int]) -> bool:
        """Register an optimizer the first time it steps (later calls are cheap): ``describe()`` lists its
        parameters as ``(name, shape, owner, read)``; ``steps_done()`` its completed steps. Every optimizer
        counts: ``K`` steps are K steps of any of them (a GAN's two, a second training phase's), and the
        parameters of one that starts later join the snapshots from then on. False in a child process."""
        if self._in_child():
            return False
        with self._lock:
            if not any(o is optimizer for o in self._optimizers):
                index = len(self._optimizers)
                self._optimizers.append(optimizer)
                self.optimizer_kinds.append(getattr(optimizer, "_dpmigrate_kind", None) or type(optimizer).__name__)
                try:
                    described = describe()
                except Exception as e:  # never break the script's step: the record says what went wrong
                    self.changed(f"optimizer {index}'s parameters unreadable ({type(e).__name__}: {e})")
                    described = []
                for j, (name, shape, owner, read) in enumerate(described):
                    self.parameters.append(dumps.Parameter(f"o{index}.p{j}", name, list(shape), owner))
                    self._readers.append(read)
                self._steps_done.append(steps_done)
            return True

    def steps_total(self) -> int:
        """Steps completed by every tracked optimizer together."""
        return sum(int(done()) for done in self._steps_done)

    def note_batchnorm(self, names) -> None:
        for name in names:
            if name not in self.batchnorm:
                self.batchnorm.append(name)

    def changed(self, what: str) -> None:
        self.changes.setdefault(what)

    def repeats_samples(self, what: str) -> None:
        """The script's data reads some samples more than once per epoch by design (``repeat()`` before
        ``shuffle``, sampling with replacement): the shares pass cannot judge disjointness there."""
        self.repeats.setdefault(what)

    def consumed(self, batch_array, source: str, stream: int = 0, dims: int = 1) -> None:
        """A batch this process consumed: a NumPy array, or a list of them (features, labels), samples along
        dimension 0."""
        if self.finished or batch_array is None or self._in_child():
            return
        try:
            rows = fingerprint.rows(batch_array, dims)
        except Exception:  # an input that is not an array of numbers: nothing to fingerprint
            return
        if rows:
            probe = set(fingerprint.rows(batch_array[0]).get("0", ())) if source == "loader" and isinstance(
                batch_array, (list, tuple)) and len(batch_array) > 1 and "0" in rows else set()
            with self._lock:
                self._pending.append((source, stream, rows, probe))

    def consumed_from(self, make: Callable[[], object], source: str, stream: int = 0, dims: int = 1) -> None:
        """:meth:`consumed` of what ``make()`` gives: an input the harness cannot read (a sparse tensor, an object
        of the script's own) is said in the report, never raised into the script's step."""
        if self.finished or self._in_child():
            return
        try:
            batch = make()
        except Exception as e:
            self.changed(f"an input not fingerprinted ({type(e).__name__}): the split is proven without it")
            return
        self.consumed(batch, source, stream, dims)

    def rebase_random(self) -> None:
        """The generators' state now is the baseline: a draw the harness knows to be no training randomness (a
        DataLoader's seed for a new epoch's workers) is not taken for random draws in a step."""
        self._last_random = None if self._last_random is None else self._random_digest()

    def boundary(self, completed: int, pending: bool) -> None:
        """The optimizers have completed ``completed`` steps together (:meth:`steps_total`). ``pending``: the inputs
        seen since the last boundary belong to the step about to be applied (a pre-step hook), else to the last one."""
        if self._in_child():
            return
        with self._lock:
            if self.finished:
                return
            step = completed + 1 if pending else completed
            self._note_random_draws(step)
            if self._pending and step >= 1:
                self._close_inputs(step)
            self._pending = []
            self.completed = completed
            if completed not in self.snapshots:
                self._snapshot(completed)
            if self.wanted and completed >= self.wanted:  # (wanted 0: every step, to the script's end)
                self.finish("steps")
                if self.to_end > 0:  # the record is written: the script goes on, unrecorded, to its end or the bound
                    leaving.go_on(self)
                    return
        if self.finished:
            leaving.leave(self)

    def end(self, how: str) -> None:
        """Say how the run went on past step K (once, in the script's own process): it exited, reached the bound,
        or ended itself with ``os._exit``; with the optimizer steps it made in all."""
        if not self.to_end or self.ended or os.getpid() != self.pid:
            return
        self.ended = True
        try:
            steps = self.steps_total()
        except Exception:
            steps = None
        try:
            import json
            import time

            seconds = None if self.past_k is None else round(time.monotonic() - self.past_k, 2)
            (self.folder / END_FILE).write_text(json.dumps({"ended": how, "steps": steps, "seconds": seconds}))
        except OSError:
            pass

    def _note_random_draws(self, step: int) -> None:
        """Whether Python's, NumPy's or the framework's global generator advanced since the last boundary: random
        draws inside training (noise, masking, augmentation), which differ between 1 process and N ranks."""
        now = self._random_digest()
        if self._last_random is not None and step >= 1:
            advanced = {name: digest.hex() for name, digest in now.items() if self._last_random.get(name) != digest}
            if advanced and step not in self.random_steps:
                self.random_steps.append(step)
            if advanced and len(self.random_trace) < RANDOM_TRACE_STEPS:  # which generators drew, and their state
                self.random_trace.setdefault(str(step), {}).update(advanced)  # after: equal on two ranks = same draws
        self._last_random = now

    def _random_digest(self) -> dict[str, bytes]:
        """A digest of each global generator's state: Python's, NumPy's, the framework's."""
        import hashlib
        import random

        def digest(data: bytes) -> bytes:
            return hashlib.blake2b(data, digest_size=16).digest()

        parts = {"python": digest(repr(random.getstate()).encode())}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            parts["numpy"] = digest(repr(numpy.random.get_state(legacy=True)).encode())
        for i, state in enumerate(self.random_states):
            try:
                parts[self.framework or f"generator {i}"] = digest(state())
            except Exception:
                pass
        return parts

    def _in_child(self) -> bool:
        """A process forked from the script's (Hogwild, a DataLoader worker) records nothing; it leaves a mark
        when it trains, so the report can say that the training happened where verify does not look."""
        if os.getpid() == self.pid:
            return False
        try:
            (self.folder / CHILD_MARK).touch()
        except OSError:
            pass
        return True

    def take_initial_snapshot(self) -> None:
        """Parameters before any step, when an adapter can read them only at registration (TF's tracing)."""
        with self._lock:
            if not self.snapshots and not self.finished:
                self._snapshot(0)

    # --- the record ------------------------------------------------------------------------------------

    def _close_inputs(self, step: int) -> None:
        by_source: dict[str, list[tuple[int, dict[str, list[str]]]]] = {}
        for source, stream, rows, _ in self._pending:
            by_source.setdefault(source, []).append((stream, rows))
        source = next(s for s in SOURCE_PREFERENCE if s in by_source)
        batches = by_source[source]
        if source == "loader":  # an evaluation loader read in the step is not what was trained on
            trained = self._trained_streams()
            batches = [b for b in batches if b[0] in trained]
        merged: dict[str, list[str]] = {}
        for _, rows in batches:
            for dim, hashes in rows.items():
                merged.setdefault(dim, []).extend(hashes)
        if source == "model":  # only the dimensions every batch had
            merged = {d: h for d, h in merged.items() if all(d in rows for _, rows in batches)}
        previous = self.inputs.get(step)
        if previous is not None and previous.source == source:
            for dim, hashes in merged.items():
                previous.rows.setdefault(dim, []).extend(hashes)
        elif previous is None or SOURCE_PREFERENCE.index(source) < SOURCE_PREFERENCE.index(previous.source):
            self.inputs[step] = dumps.Inputs(source, merged)

    def _trained_streams(self) -> set[int]:
        """The loaders (streams) whose batches fed the model in training mode in this step: those whose samples'
        first arrays are among the model's inputs (a loop over a validation loader inside the step, the addition
        tutorial's, feeds the model in eval mode); else the one read last (an evaluation pass between steps comes
        before the next training batch)."""
        model = {h for source, _, rows, _ in self._pending if source == "model" for h in rows.get("0", ())}
        loaders = [(stream, probe or set(rows.get("0", ()))) for source, stream, rows, probe in self._pending
                   if source == "loader"]
        fed = {stream for stream, hashes in loaders if hashes & model}
        return fed or {loaders[-1][0]}

    def _snapshot(self, steps: int) -> None:
        import numpy as np

        arrays = {}
        for parameter, read in zip(self.parameters, self._readers):
            arrays[parameter.key] = np.asarray(read())
        path = dumps.snapshot_file(self.folder, steps)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        self.snapshots.append(steps)

    def finish(self, reason: str) -> None:
        """Write the record (once). At exit, the parameters as the script left them are the last snapshot."""
        with self._lock:
            if self.finished:
                return
            if reason == "exit" and self._optimizers:
                try:
                    done = self.steps_total()
                except Exception:
                    done = self.completed
                if done not in self.snapshots:
                    try:
                        self._snapshot(done)
                    except Exception as e:  # the framework is already torn down: say so, keep what we have
                        self.changed(f"no snapshot at exit ({type(e).__name__}: {e})")
                self.completed = max(self.completed, done)
            self.finished = True
            last = max(self.snapshots, default=0)
            steps_inputs = [self.inputs.get(j) for j in range(1, last + 1)]
            record = dumps.Record(
                rank=self.rank, world_size=self.world_size, framework=self.framework, parameters=self.parameters,
                snapshots=sorted(self.snapshots), steps=last, optimizers=len(self._optimizers),
                inputs=steps_inputs, stop=reason, batchnorm=self.batchnorm, changes=list(self.changes),
                random_steps=[s for s in self.random_steps if s <= last], optimizer_kinds=self.optimizer_kinds,
                random_trace={k: v for k, v in self.random_trace.items() if int(k) <= last},
                child_processes=(self.folder / CHILD_MARK).exists(), files=files.record(),
                repeats=list(self.repeats))
            record.write(self.folder)


def _is_the_script() -> bool:
    script = os.environ.get(ENV_SCRIPT)
    if not script or not sys.argv or not sys.argv[0] or sys.argv[0] in ("-c", "-m"):
        return False
    try:
        return os.path.samefile(sys.argv[0], script)
    except OSError:
        return False


def _role() -> tuple[int, int]:
    try:
        from dpmigrate.runtime.role_reader import read_role

        role = read_role(os.environ)
        return role.rank, role.world_size
    except Exception:
        return 0, 1


def activate() -> Recorder | None:
    """Called by the boot ``sitecustomize``: prepare this process if it runs the script under verification."""
    global _recorder
    if _recorder is not None or not os.environ.get(ENV_OUT):
        return _recorder
    parent = os.environ.get(ENV_PARENT, "")
    child = parent.isdigit() and int(parent) != os.getpid()  # started by the script (multiprocessing spawn)
    if not child and not _is_the_script():
        return None
    rank, world_size = _role()
    recorder = Recorder(Path(os.environ[ENV_OUT]), int(os.environ.get(ENV_STEPS, "3")), rank, world_size,
                        pid=int(parent) if child else None)
    _recorder = recorder
    os.environ[ENV_PARENT] = str(recorder.pid)  # inherited by the processes the script starts
    import random

    random.seed(recorder.seed)
    sample_draws.install(recorder)

    def numpy_ready(np):
        np.random.seed(recorder.seed % 2**32)
        sample_draws.numpy_ready(np)

    def adapter(module_name: str, function: str):
        def run(module):
            adapter_module = importlib.import_module(f"dpmigrate.verify.harness.{module_name}")
            getattr(adapter_module, function)(module, recorder)
        return run

    sys.meta_path.insert(0, AfterImport({
        "numpy": numpy_ready,
        "torch": adapter("torch", "install"),
        "paddle": adapter("paddle", "install"),
        "tensorflow": adapter("tensorflow", "install"),
        "paddle.io.dataloader.fetcher": lambda module: sample_draws.key_paddle_fetches(module, recorder),
        "paddle.vision.transforms.transforms": lambda module: sample_draws.key_paddle_transforms(module, recorder),
        "tf_keras": adapter("tensorflow", "install_keras"),
        "keras": adapter("tensorflow", "install_keras"),
        **{f"dpmigrate.runtime.{name}": file_wrappers.wrap_runtime for name in ("torch", "paddle", "tensorflow")},
    }))
    if not child:
        files.install(recorder, os.environ[ENV_SCRIPT])  # (before the script: its module level too)
        atexit.register(recorder.end, "exit")
        atexit.register(recorder.finish, "exit")  # (atexit runs last-registered first: the record, then the end)
        leaving.wrap_os_exit(recorder)
    return recorder
