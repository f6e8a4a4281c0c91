"""Write a file so that readers see the old version or the new one, never a torn one.

Every backend's ``save`` uses this: the bytes go to a temporary file in the same folder (same file
system, so the rename is atomic), are flushed and fsynced, then ``os.replace``d over the target and the
folder is fsynced. If the writer fails, or the process dies mid-write, the previous file is intact; a
temporary left by a killed process is named ``.<name>.<pid>.dpmigrate-tmp`` and removed by the next
successful save of the same path.
"""

from __future__ import annotations

import glob
import os
from typing import IO, Callable

TMP_SUFFIX = ".dpmigrate-tmp"


def temporary_path(path: str) -> str:
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{os.getpid()}{TMP_SUFFIX}")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(file)`` on a temporary file, then atomically move it to ``path``."""
    path = os.fspath(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            # keep the mode the user gave the checkpoint, as editors do
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_folder(os.path.dirname(os.path.abspath(path)))
    _remove_stale_temporaries(path)


def fsync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable; a folder that cannot be opened or fsynced is not an error."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not let a folder be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_temporaries(path: str) -> None:
    """Remove temporaries of this path left by processes that no longer exist."""
    folder, name = os.path.split(os.path.abspath(path))
    for tmp in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(name)}.*{TMP_SUFFIX}")):
        pid_text = tmp[len(os.path.join(folder, f".{name}.")) : -len(TMP_SUFFIX)]
        if pid_text.isdigit() and not _process_exists(int(pid_text)):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
