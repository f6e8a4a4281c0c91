"""What the script's process does to files, per optimizer step: the evidence of :mod:`dpmigrate.verify.files`.

Why: the weights of N ranks can match the original's while the ranks trample each other's files: a checkpoint
or a plot written by every rank, a folder outside the run deleted by every worker (a Keras script's module-level
``tf.io.gfile.rmtree`` crashed 2 workers of 3 every time), a file the main process deletes while the others list
its folder. Weights cannot show that; the file events can.

How: one ``sys.addaudithook`` sees what Python itself opens, moves, deletes and lists (``open``, ``os.rename``
(``os.replace`` too), ``os.remove``, ``os.mkdir``, ``os.rmdir``, ``shutil.rmtree``, ``os.listdir``, ``os.scandir``,
``os.walk``, ``glob.glob/2``, ...): pathlib, csv, json, NumPy, PIL and matplotlib included. Writers in C++ (``torch.save``
to a path, ``paddle.jit.save``, ``tf.io.gfile``, Keras' ``save``) are invisible to it: :mod:`.file_wrappers` wraps them
and calls :meth:`FileEvents.note`. It also records when the process enters and leaves a barrier or a collective,
which orders the ranks' file events (TF's in-graph collectives order nothing here).

Each event: its kind (write, delete, mkdir, read, list), the path made absolute, where it lands (the folder part's
links resolved: the runs work in scratch folders whose entries link to the user's), the steps counted by then, a
``time.monotonic()`` (one clock for every process of the machine) and the line of the script (or of a local module)
that caused it. Not kept: what no line of the script caused (a library's own bookkeeping), Python's imports, the
record folders, ``/proc``, ``/dev``, ``/sys``, the interpreter's folders and the frameworks' caches. The hook runs on
every audited event of the process: it drops the others at once, and never raises into the script.
"""

from __future__ import annotations

import os
import sys
import threading
import time

CAP = 5000  # events kept per process; beyond, only counted
BARRIER_CAP = 100_000  # barriers kept; beyond, the events stop too (they could no longer be ordered)
_EVENTS = frozenset({
    "open", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "shutil.rmtree", "os.listdir", "os.scandir", "os.walk",
    "glob.glob/2", "pathlib.Path.glob", "pathlib.Path.rglob", "shutil.copyfile", "os.truncate", "os.link", "os.symlink",
})
_CODE = (".py", ".pyc", ".so", ".pth")  # read by imports
# what these functions do inside is not the script's doing: an rmtree's own steps (its event says it), the probe of
# tempfile.gettempdir() (a random name), temporary files (their audit event names the folder, then a random name);
# and the import system's listings and reads (below)
_INSIDE = {"shutil": frozenset({"rmtree", "_rmtree_safe_fd", "_rmtree_unsafe"}),
           "tempfile": frozenset({"_get_default_tempdir", "TemporaryFile", "NamedTemporaryFile"})}  # (opened as its folder)
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_TMPFILE = getattr(os, "O_TMPFILE", -1)  # tempfile.TemporaryFile on Linux: -1 never matches where it is missing
_CACHES = (".cache", ".keras", ".paddle", ".paddlenlp", ".config", ".nv", ".triton", ".matplotlib", ".torch", ".local")
_CACHE_VARIABLES = ("TORCH_HOME", "KERAS_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "HF_HOME", "PADDLE_HOME")

_events: FileEvents | None = None


class FileEvents:
    """One process's file events and barriers (:meth:`record` is what its record keeps)."""

    def __init__(self, recorder, script: str):
        self.recorder = recorder
        self.cwd = os.getcwd()
        self.events: list[list] = []
        self.barriers: list[list[float]] = []
        self.dropped = 0  # events past CAP
        self.on = True
        self._seen: set[tuple] = set()
        self._local = threading.local()  # depth in a barrier; inside the hook
        self._lands: dict[str, str] = {}
        self._where: dict[str, str | None] = {}  # a code file -> its name as the report shows it, or None
        script = os.path.abspath(script)
        self._scripts = {script, os.path.realpath(script)}
        if sys.argv and sys.argv[0]:
            self._scripts.add(os.path.abspath(sys.argv[0]))
        # (a folder whose modules are the script's own, the script's folder that names them): its folder and the one
        # above (a project root it puts on sys.path), as given and resolved
        self._folders = sorted({(os.path.join(f, ""), s) for s in {os.path.dirname(p) for p in self._scripts}
                                for f in (s, os.path.dirname(s))}, key=lambda pair: len(pair[0]), reverse=True)
        self._ignored = tuple(_ignored_folders(recorder.out))
        self._ignored_exact = frozenset(p.rstrip(os.sep) for p in self._ignored)
        self._inside = {os.path.join(os.path.dirname(os.__file__), f"{module}.py"): names for module, names in _INSIDE.items()}

    # --- what the hook and the wrappers call ---------------------------------------------------------------

    def hook(self, event: str, args: tuple) -> None:
        """One audited event of :data:`_EVENTS` (the others are dropped before: :func:`install`)."""
        if not self.on or self.recorder.finished:
            return
        local = self._local
        if getattr(local, "busy", False):
            return
        local.busy = True
        try:
            self._audited(event, args)
        except Exception as e:  # the script's own call must go on: say it once, stop recording
            self.on = False
            self.recorder.changed(f"files not recorded: {type(e).__name__}: {e}")
        finally:
            local.busy = False

    def note(self, kind: str, path) -> None:
        """A file event a wrapper saw (a C++ writer): ``kind`` of ``path`` (a str or os.PathLike; else ignored)."""
        if not self.on or self.recorder.finished or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            text = _text(path)
            if text is not None and "://" not in text:
                self._add(kind, text, rmtree_ok=True)
        except Exception as e:
            self.on = False
            self.recorder.changed(f"files not recorded: {type(e).__name__}: {e}")
        finally:
            self._local.busy = False

    def entered(self) -> bool:
        """A barrier or collective starts (True: the outermost one, to be closed by :meth:`left`)."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0 and self.on and not self.recorder.finished:
            if len(self.barriers) >= BARRIER_CAP:
                self.on = False
                self.recorder.changed(f"files not recorded after {BARRIER_CAP} barriers")
                return False
            self.barriers.append([time.monotonic(), 0.0])
            return True
        return False

    def left(self, outermost: bool) -> None:
        self._local.depth = max(0, getattr(self._local, "depth", 1) - 1)
        if outermost and self.barriers:
            self.barriers[-1][1] = time.monotonic()

    def record(self) -> dict:
        return {"cwd": self.cwd, "cwd_lands": os.path.realpath(self.cwd), "events": self.events,
                "barriers": [b for b in self.barriers if b[1]], "dropped": self.dropped}

    # --- inside ------------------------------------------------------------------------------------------

    def _audited(self, event: str, args: tuple) -> None:
        if event == "open":
            path, flags = args[0], args[2]
            if isinstance(path, int) or flags & _TMPFILE == _TMPFILE:  # (O_TMPFILE: an unnamed file in that folder)
                return
            kind = "write" if flags & _WRITING else "read"
            text = _text(path)
            if text is None or (kind == "read" and text.endswith(_CODE)):
                return
            self._add(kind, text)
        elif event == "os.rename":
            if _relative_to_fd(args[0], args[2]) or _relative_to_fd(args[1], args[3]):
                return
            self._add("delete", _text(args[0]))
            self._add("write", _text(args[1]))
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree"):
            if not _relative_to_fd(args[0], args[1]):
                self._add("delete", _text(args[0]), rmtree_ok=event == "shutil.rmtree")
        elif event == "os.mkdir":
            if not _relative_to_fd(args[0], args[2]):
                self._add("mkdir", _text(args[0]))
        elif event in ("os.listdir", "os.scandir", "os.walk"):
            path = args[0] if args[0] is not None else "."
            if not isinstance(path, int):
                self._add("list", _text(path))
        elif event == "glob.glob/2":
            pattern, root = _text(args[0]), _text(args[2]) if args[2] is not None else None
            if pattern is not None:
                self._add("list", _glob_root(os.path.join(root, pattern) if root else pattern))
        elif event in ("pathlib.Path.glob", "pathlib.Path.rglob"):
            self._add("list", _text(args[0]))
        elif event in ("shutil.copyfile", "os.link", "os.symlink"):
            self._add("write", _text(args[1]))
        elif event == "os.truncate" and not isinstance(args[0], int):
            self._add("write", _text(args[0]))

    def _add(self, kind: str, text: str | None, rmtree_ok: bool = False) -> None:
        if not text or "__pycache__" in text:
            return
        path = os.path.abspath(text)
        if path in self._ignored_exact or path.startswith(self._ignored):
            return
        where = self._where_in_script(rmtree_ok)
        if not where:  # no line of the script's caused it (a library's own bookkeeping), or inside an rmtree
            return
        folder, name = os.path.split(path)
        real = self._lands.get(folder)
        if real is None:
            if len(self._lands) > 4096:
                self._lands.clear()
            real = self._lands[folder] = os.path.realpath(folder)
        lands = os.path.join(real, name) if name else real
        if lands.startswith(self._ignored):
            return
        epoch = len(self.barriers)
        key = (kind, lands, where, epoch)  # the same event again before the next barrier orders nothing new
        if key in self._seen:
            return
        if len(self.events) >= CAP:
            self.dropped += 1
            return
        self._seen.add(key)
        self.events.append([kind, path, lands, self.recorder.completed, time.monotonic(), where])

    def _where_in_script(self, rmtree_ok: bool) -> str:
        """``file:line`` of the innermost frame of the script or a local module ('' for none, or for what
        ``shutil.rmtree`` does inside: its own event says it)."""
        frame = sys._getframe(3)
        where = self._where
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if code.co_name in self._inside.get(name, ()) and not (rmtree_ok and code.co_name == "rmtree"):
                return ""
            if name.startswith("<frozen importlib"):
                return ""
            shown = where.get(name, "")
            if shown == "":
                shown = where[name] = self._local_name(name)
            if shown is not None:
                return f"{shown}:{frame.f_lineno}"
            frame = frame.f_back
        return ""

    def _local_name(self, filename: str) -> str | None:
        if filename in self._scripts:
            return os.path.basename(filename)
        if filename.startswith("<") or not filename.endswith(".py") or "-packages" in filename:
            return None
        path = os.path.abspath(filename)
        if path.startswith(self._ignored):
            return None
        for folder, base in self._folders:
            if path.startswith(folder):
                return os.path.relpath(path, base)
        return None


def _ignored_folders(out) -> list[str]:
    """Folders whose events are not the script's doing: the records, the interpreter's, dpmigrate's, caches."""
    import getpass
    import site
    import sysconfig
    import tempfile

    home = os.path.expanduser("~")
    try:
        inductor = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")  # torch.compile's cache
    except Exception:
        inductor = ""
    folders = ["/proc", "/dev", "/sys", str(out), sys.prefix, sys.base_prefix, sys.exec_prefix,
               os.path.dirname(os.path.dirname(os.path.abspath(__file__))), inductor,  # dpmigrate/verify: the harness
               *(os.path.join(home, c) for c in _CACHES), *(os.environ[v] for v in _CACHE_VARIABLES if os.environ.get(v))]
    try:
        folders += [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    except Exception:
        pass
    expanded = set()
    for folder in folders:
        if folder and folder != os.sep:
            expanded.update({os.path.abspath(folder), os.path.realpath(folder)})
    return sorted(f.rstrip(os.sep) + os.sep for f in expanded)


def _text(path) -> str | None:
    try:
        value = os.fspath(path)
    except TypeError:
        return None
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _relative_to_fd(path, dir_fd) -> bool:
    """A path relative to an open folder (``dir_fd``): the inside of an rmtree, not the script's own."""
    return dir_fd not in (None, -1) and not os.path.isabs(_text(path) or "")


def _glob_root(pattern: str) -> str:
    """The folder a pattern lists: its part before the first wildcard."""
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=len(pattern))
    head = pattern[:cut]
    return head if head.endswith(os.sep) or cut == len(pattern) else os.path.dirname(head) or "."


# --- activation ---------------------------------------------------------------------------------------------


def install(recorder, script: str) -> FileEvents | None:
    """Start recording in the script's process (called once by the harness core, never in a child)."""
    global _events
    if _events is not None:
        return _events
    try:
        events = FileEvents(recorder, script)
    except Exception as e:
        recorder.changed(f"files not recorded: {type(e).__name__}: {e}")
        return None
    _events = events

    def forked() -> None:  # a DataLoader worker, a Hogwild process: not the script's process
        events.on = False

    os.register_at_fork(after_in_child=forked)
    wanted, hooked = _EVENTS, events.hook

    def hook(event, args):  # every audited event of the process (id(), imports...): the others leave at once
        if event in wanted:
            hooked(event, args)

    sys.addaudithook(hook)  # (dpmigrate.runtime's barrier is timed by :mod:`.file_wrappers`, hooked by the core)
    return events


def current() -> FileEvents | None:
    return _events


def record() -> dict:
    """What the record keeps ({} when nothing was recorded)."""
    return _events.record() if _events is not None else {}
