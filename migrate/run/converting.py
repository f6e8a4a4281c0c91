"""Read and convert the files of a run, in this process or in ``-j N`` worker processes.

Kept apart from the command line so that ``cli.py`` only decides what to do with each result. A
file is opened without blocking and must be a regular file (a FIFO or a device swapped in after
discovery would otherwise hang the run, or never end), and what was read is remembered, bytes and
``stat``, so that the writer can refuse to replace a file the user edited meanwhile. Outcomes come
back in the order of the sources, whatever order the workers finish in.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import multiprocessing.process
import os
import stat
import traceback
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait

from ..findings import Conversion, ConversionError, Options
from ..frameworks import may_use_a_framework
from ..local.modules import imports_one_of
from ..reporting.report import Failure
from ..userfiles.notebooks import is_notebook
from ..userfiles.selection import NotText, Source, check_text, kind_of
from .fast_path import quiet_conversion
from .stopping import worker_init


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What the file was when it was read; a file no longer like this was changed by someone else."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Snapshot:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a worker sends back for one file (picklable: plain data, no exception objects)."""

    path: str
    conversion: Conversion | None = None
    encoding: str = "utf-8"
    failure: Failure | None = None
    read_as: Snapshot | None = None


def read_regular(path: str) -> tuple[bytes, Snapshot]:
    """The bytes of a regular file and its stat; OSError for anything else, without ever blocking on it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"is {kind_of(st.st_mode)}, not a regular file: dpmigrate converts files only")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(), Snapshot.of(st)
    finally:
        os.close(fd)


def convert_path(path: str, options: Options) -> Outcome:
    """Read and convert one file; runs in a worker process under ``-j N``."""
    try:
        source, snapshot = read_regular(path)
    except OSError as exc:
        return Outcome(path, failure=Failure(f"cannot be read: {exc.strerror or exc}"))
    return dataclasses.replace(convert_source(source, path, options), read_as=snapshot)


def convert_source(source: bytes, path: str, options: Options) -> Outcome:
    """Convert the bytes of one script (or notebook), shown to the user as ``path``."""
    try:
        encoding = check_text(source)
        if is_notebook(path):
            from ..userfiles.notebooks import convert_notebook

            return Outcome(path, convert_notebook(source, path, options, convert), encoding)
        return Outcome(path, convert(source, path, options), encoding)
    except NotText as exc:
        return Outcome(path, failure=Failure(exc.reason, exc.line, exc.col))
    except ConversionError as exc:
        return Outcome(path, failure=Failure(exc.reason, exc.line, exc.col))
    except Exception:  # a bug in a rule must not take the other files down, nor lose its traceback
        return Outcome(path, failure=Failure(
            "dpmigrate failed on this file (a bug: please report it with the file and this traceback); "
            "the file was left as it was\n" + traceback.format_exc()))


def convert(source: bytes, path: str, options: Options) -> Conversion:
    """The engine's conversion; a file naming no framework (nor a local module using one) is returned as it
    is without loading the engine.

    libcst and the engine take about a quarter of a second to import: a pre-commit run on files
    that are not training code (most of them) never pays it, and ``--help`` never does.
    """
    helper = options.importer_seeds is not None and options.framework != "auto"  # a script's helper: its writes
    if not helper and not may_use_a_framework(source) and not imports_one_of(source, (m for m, _ in options.local_frameworks)):
        return Conversion(path=path, original=source, output=source)  # (nor imports a local module that does)
    quiet = quiet_conversion(source, path, options.framework)  # converted before, nothing to check: no libcst
    if quiet is not None:
        return quiet
    from ..codemod.engine import convert as engine_convert

    return engine_convert(source, path, options)


def convert_all(sources: Sequence[Source], options: Options, jobs: int) -> Iterator[Outcome]:
    """Outcomes in the order of ``sources``. Closing the iterator early (an interrupt) kills the workers at once.

    The workers are plain processes, each fed one file at a time over its own pipe, and the results
    are read by this thread itself: no pool and no background thread that a killed worker could
    leave waiting on half a message (``ProcessPoolExecutor`` then hangs the interpreter's exit).
    """
    worker = functools.partial(convert_path, options=options)
    paths = [s.path for s in sources]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(paths) < 2:
        yield from map(worker, paths)
        return
    context = multiprocessing.get_context()
    workers: dict[Connection, multiprocessing.process.BaseProcess] = {}
    finished = False
    try:
        for _ in range(min(jobs, len(paths))):
            mine, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, worker), daemon=True, name="dpmigrate-worker")
            process.start()
            theirs.close()
            workers[mine] = process
        yield from _in_order(paths, worker, workers)
        finished = True
    finally:
        for connection, process in workers.items():
            if finished:
                _send(connection, None)  # a clean goodbye
            else:
                process.kill()  # they only read files: nothing of the user's is lost
        for connection, process in workers.items():
            process.join()
            connection.close()


def _in_order(paths: list[str], worker, workers: dict[Connection, multiprocessing.process.BaseProcess]
              ) -> Iterator[Outcome]:
    """Give each idle worker the next file, and yield the outcomes in the order of ``paths``."""
    tasks = iter(enumerate(paths))
    busy: dict[Connection, int] = {}
    done: dict[int, Outcome] = {}

    def feed(connection: Connection) -> None:
        for task in tasks:
            if _send(connection, task):
                busy[connection] = task[0]
                return
            done[task[0]] = worker(task[1])  # the worker is gone: convert here
            return

    for connection in workers:
        feed(connection)
    for index in range(len(paths)):
        while index not in done:
            if not busy:  # every worker is gone: convert the rest here
                for left, path in tasks:
                    done[left] = worker(path)
                continue
            for connection in wait(list(busy)):
                given = busy.pop(connection)
                try:
                    finished, outcome = connection.recv()
                except (EOFError, OSError):  # killed (out of memory...): that file fails, the others go on
                    done[given] = Outcome(paths[given], failure=Failure(
                        "the worker process converting it died (out of memory?); the file was left as it was"))
                    continue
                done[finished] = outcome
                feed(connection)
        yield done.pop(index)


def _send(connection: Connection, message: object) -> bool:
    try:
        connection.send(message)
    except OSError:  # the worker has died
        return False
    return True


def _serve(connection: Connection, worker) -> None:
    """A worker process: convert the files it is sent, one at a time, until told to stop."""
    worker_init()
    while True:
        try:
            task = connection.recv()
        except EOFError:  # the CLI is gone
            return
        if task is None:
            return
        index, path = task
        connection.send((index, worker(path)))
