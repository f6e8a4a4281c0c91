"""Several nodes: keep the frameworks' servers off every interface but the one the job uses.

Why: Paddle 3.3.1's TCPStore (global rank 0) binds ``0.0.0.0`` and TensorFlow 2.21's gRPC servers bind
``[::]``; neither has an option to bind one address, and neither authenticates its clients. On one node
the job runs in a private loopback-only network namespace (:mod:`.private_network`); on several nodes it
cannot, since the nodes must reach each other. So every process of a multi-node job is started with
``bind_guard.c`` preloaded (``LD_PRELOAD``): its ``bind()`` turns a TCP bind to the wildcard address into
a bind to ``DPMIGRATE_BIND_ADDRESS``, the address this node uses towards the master (:mod:`.network`),
port unchanged. What binds a specific address (gloo, dpmigrate's own rendezvous) is untouched.

The library is compiled when dpmigrate is installed (setup.py, ``pip install``, editable or not) into the
package folder, :data:`INSTALLED` (``dpmigrate/launch/_bind_guard.so``), so a node needs no C compiler to
run a job. It is loaded from there only (never copied or looked for elsewhere), and only when nobody but
its owner (root, or whoever owns this module) can replace it: the file and its folder must not be writable
by group or others, the file no symlink. Loaded into every process of the job, a replaced library would run
in all of them; a folder anyone can write to is what a temporary path offers an attacker.

Where there is no usable installed library (no compiler when dpmigrate was installed, a folder writable by
others, a path LD_PRELOAD cannot hold) it is compiled for the job as before the install-time build existed
(``cc -shared``, well under a second) into a private folder of random name (``mkdtemp``: 0700, never an
existing path or a symlink), removed when the job ends. Without either (or off Linux) a multi-node launch
stops before anything starts, saying why there is no installed library and naming the fix: install a C
compiler, or pass ``--no-bind-guard`` to run with those servers on every interface (the README says what
to firewall).

Under another launcher (torchrun, Paddle's, Slurm): ``python -m dpmigrate.launch.bind_guard`` prints the
installed library's path, for ``LD_PRELOAD`` together with ``DPMIGRATE_BIND_ADDRESS``; with ``DIR`` it
compiles one in ``DIR`` (created 0700, or an existing private folder of this user's) and prints its path.

A plan asks for the guard with :data:`LIBRARY` in a process's ``LD_PRELOAD`` (so ``--dry-run`` shows
it); :func:`prepared` puts the installed library's path there, or builds one. Standard library only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from .backend import Plan

SOURCE = Path(__file__).with_name("bind_guard.c")
INSTALLED = Path(__file__).with_name("_bind_guard.so")
"""Compiled at install time (setup.py); absent where there was no C compiler then, or off Linux."""
LIBRARY = "<bind guard>"
"""In a process's ``LD_PRELOAD``: replaced by :func:`prepared` with the library's path."""
ADDRESS_VARIABLE = "DPMIGRATE_BIND_ADDRESS"
BUILD_TIMEOUT_S = 120


class Unavailable(Exception):
    """The guard cannot be had here (none installed, and no C compiler, not Linux, or the compiler failed)."""


def requested(plan: Plan, address: str, environ: Mapping[str, str] | None = None) -> Plan:
    """``plan`` with the guard asked for in every process it starts (the user's ``LD_PRELOAD`` kept after it)."""
    environ = os.environ if environ is None else environ
    preload = " ".join(x for x in (LIBRARY, environ.get("LD_PRELOAD", "")) if x)
    guard = {"LD_PRELOAD": preload, ADDRESS_VARIABLE: address}
    return dataclasses.replace(plan, processes=tuple(dataclasses.replace(p, env={**p.env, **guard})
                                                     for p in plan.processes))


def wanted(plan: Plan) -> bool:
    return any(LIBRARY in p.env.get("LD_PRELOAD", "") for p in plan.processes)


@contextlib.contextmanager
def prepared(plan: Plan) -> Iterator[Plan]:
    """``plan`` with the guard's path in place of :data:`LIBRARY`: the installed library, else one built for the
    job in a private folder removed on exit."""
    if not wanted(plan):
        yield plan
        return
    try:
        library = installed()
    except NotInstalled as e:
        not_installed = e
    else:
        yield _with_library(plan, library)
        return
    folder = Path(tempfile.mkdtemp(prefix="dpmigrate-bind-guard-"))
    try:
        try:
            library = build(folder)
        except Unavailable as e:
            raise Unavailable(f"{not_installed}, and {e}") from None
        yield _with_library(plan, library)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _with_library(plan: Plan, library: Path) -> Plan:
    return dataclasses.replace(plan, processes=tuple(
        dataclasses.replace(p, env={k: v.replace(LIBRARY, str(library)) for k, v in p.env.items()})
        for p in plan.processes))


class NotInstalled(Unavailable):
    """No installed library that may be loaded (why, in the message)."""


def installed() -> Path:
    """:data:`INSTALLED`, if it may be preloaded: a regular file that only its owner (root, or this module's
    owner) can replace, in such a folder, at a path LD_PRELOAD can hold. Else NotInstalled says why not."""
    _linux_only()
    try:
        found = os.lstat(INSTALLED)
    except FileNotFoundError:
        raise NotInstalled(f"dpmigrate was installed without its compiled bind guard ({INSTALLED} is missing: no C "
                           "compiler at install time)") from None
    except OSError as e:
        raise NotInstalled(f"cannot read the installed bind guard {INSTALLED}: {e.strerror or e}") from None
    problem = ("not a regular file (a symlink?)" if not stat.S_ISREG(found.st_mode)
               else _replaceable(found, "it") or _replaceable(os.stat(INSTALLED.parent), "its folder"))
    if not problem and any(c.isspace() or c == ":" for c in str(INSTALLED)):  # LD_PRELOAD splits on both
        problem = "its path has a space or ':', which LD_PRELOAD cannot hold"
    if problem:
        raise NotInstalled(f"the installed bind guard {INSTALLED} is not loaded: {problem}")
    return INSTALLED


def _linux_only() -> None:
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"the bind guard is built for Linux only (this is {sys.platform})")


def _replaceable(found: os.stat_result, what: str) -> str | None:
    """Why another user could replace the file (or folder) ``found``, if one could."""
    if found.st_mode & 0o022:
        whom = "others" if found.st_mode & 0o002 else "its group"
        return f"{what} is writable by {whom} (mode {stat.S_IMODE(found.st_mode):o}; install with umask 022)"
    trusted = {0, os.geteuid(), os.stat(__file__).st_uid}
    if found.st_uid not in trusted:
        return f"{what} belongs to uid {found.st_uid}, neither root nor the owner of dpmigrate's code"
    return None


def build(folder: Path) -> Path:
    """Compile ``bind_guard.c`` into ``folder/bind_guard.so`` (``folder`` must be private)."""
    _linux_only()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        raise Unavailable("no C compiler found (cc, gcc or clang; or set CC) to build the bind guard; install one "
                          "(e.g. apt-get install gcc)")
    library = folder / "bind_guard.so"
    if any(c.isspace() or c == ":" for c in str(library)):  # LD_PRELOAD splits on both
        raise Unavailable(f"the bind guard's folder {folder} has a space or ':' in its path; set TMPDIR to another")
    argv = [*compiler.split(), "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE), "-ldl"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"cannot run the C compiler {compiler!r} to build the bind guard: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise Unavailable(f"{compiler} failed to build the bind guard from {SOURCE}: {last}")
    return library


def describe(address: str) -> str:
    """The launcher's log line."""
    return (f"dpmigrate launch: bind guard: a server of this job that asks for every interface (Paddle's TCPStore, "
            f"TensorFlow's gRPC servers) listens on {address} only")


def main(argv: list[str]) -> int:
    """``python -m dpmigrate.launch.bind_guard [DIR]``: print the installed guard's path, or build one in DIR."""
    if len(argv) > 1:
        print("usage: python -m dpmigrate.launch.bind_guard [DIR]   (prints the library's path, for LD_PRELOAD; "
              "with DIR, compiles one there)", file=sys.stderr)
        return 2
    if not argv:
        try:
            print(installed())
        except Unavailable as e:
            print(f"dpmigrate: {e}; give a new private folder (e.g. \"$(mktemp -d)\") to compile one there",
                  file=sys.stderr)
            return 2
        return 0
    folder = Path(argv[0])
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        found = os.lstat(folder)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
            print(f"dpmigrate: {folder}: not a private folder of yours (a symlink, another owner's, or writable by "
                  "others); give a new path or one from mktemp -d", file=sys.stderr)
            return 2
    except OSError as e:
        print(f"dpmigrate: {folder}: cannot create it ({e.strerror or e})", file=sys.stderr)
        return 2
    try:
        print(build(folder))
    except Unavailable as e:
        print(f"dpmigrate: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
