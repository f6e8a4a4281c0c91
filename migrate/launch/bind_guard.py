"""Several nodes: keep the frameworks' servers off every interface but the one the job uses.

Why: Paddle 3.3.1's TCPStore (global rank 0) binds ``0.0.0.0`` and TensorFlow 2.21's gRPC servers bind
``[::]``; neither has an option to bind one address, and neither authenticates its clients. On one node
the job runs in a private loopback-only network namespace (:mod:`.private_network`); on several nodes it
cannot, since the nodes must reach each other. So every process of a multi-node job is started with
``bind_guard.c`` preloaded (``LD_PRELOAD``): its ``bind()`` turns a TCP bind to the wildcard address into
a bind to ``DPMIGRATE_BIND_ADDRESS``, the address this node uses towards the master (:mod:`.network`),
port unchanged. What binds a specific address (gloo, dpmigrate's own rendezvous) is untouched.

The library is compiled from source for this machine when a job starts (``cc -shared``, well under a
second), into a private folder of random name (``mkdtemp``: 0700, never an existing path or a symlink)
that is removed when the job ends; nothing prebuilt is shipped or cached. Without a C compiler (or off
Linux) a multi-node launch stops before anything starts, with the fix: install one, or pass
``--no-bind-guard`` to run with those servers on every interface (the README says what to firewall).

Under another launcher (torchrun, Paddle's, Slurm): ``python -m dpmigrate.launch.bind_guard DIR`` builds it
in ``DIR`` (created 0700, or an existing private folder of this user's) and prints its path, for
``LD_PRELOAD`` together with ``DPMIGRATE_BIND_ADDRESS``.

A plan asks for the guard with :data:`LIBRARY` in a process's ``LD_PRELOAD`` (so ``--dry-run`` shows
it); :func:`prepared` builds the library and puts its path there. Standard library only.
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
LIBRARY = "<bind guard>"
"""In a process's ``LD_PRELOAD``: replaced by the path of the library :func:`prepared` built."""
ADDRESS_VARIABLE = "DPMIGRATE_BIND_ADDRESS"
BUILD_TIMEOUT_S = 120


class Unavailable(Exception):
    """The guard cannot be built here (no C compiler, not Linux, the compiler failed)."""


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
    """``plan`` with the guard built and its path in place of :data:`LIBRARY`; removed on exit."""
    if not wanted(plan):
        yield plan
        return
    folder = Path(tempfile.mkdtemp(prefix="dpmigrate-bind-guard-"))
    try:
        library = build(folder)
        yield dataclasses.replace(plan, processes=tuple(
            dataclasses.replace(p, env={k: v.replace(LIBRARY, str(library)) for k, v in p.env.items()})
            for p in plan.processes))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def build(folder: Path) -> Path:
    """Compile ``bind_guard.c`` into ``folder/bind_guard.so`` (``folder`` must be private)."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"the bind guard is built for Linux only (this is {sys.platform})")
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
    """``python -m dpmigrate.launch.bind_guard DIR``: build the guard in DIR, print its path."""
    if len(argv) != 1:
        print("usage: python -m dpmigrate.launch.bind_guard DIR   (prints the library's path, for LD_PRELOAD)",
              file=sys.stderr)
        return 2
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
