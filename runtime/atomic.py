"""Write a file so that readers see the old version or the new one, never a torn one: the one writer.

Every backend's ``save`` and the converter's rewrites (``dpmigrate.userfiles.writing``) use it. The bytes go to a
temporary file in the target's folder (same file system, so the rename is atomic), are flushed and
fsynced, then ``os.replace``d over the target and the folder is fsynced. If the writer fails, or the
process dies mid-write, the previous file is intact.

Safe in a folder other users can write to (a shared checkpoint folder):
- the temporary is created by ``tempfile.mkstemp``: ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, a random
  name, so a symbolic link planted at a predictable name is never opened, written through or chmod-ed;
  its final mode is set on the open descriptor, never by path;
- the rename replaces the directory entry: a link at the target is replaced, never followed (the
  converter asks for ``follow_symlinks=True`` to rewrite the user's own linked script, resolved first);
- the replaced file's mode is kept only when it is a regular file that keeps its owner: ours, or
  given back to its owner by root with ``keep_owner`` (the converter). A checkpoint replacing another
  user's file gets the mode a new file gets (0666 minus the umask).

A temporary left by a killed process is named ``.<name>.<pid>@<host>.<random>.dpmigrate-tmp``. The next
successful write of the same path removes the ones whose process is gone: only on this host (a pid
means nothing elsewhere), only regular files owned by us (``lstat``: a link is never followed), and
never one whose process is alive (a concurrent writer).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from typing import IO, Callable

TMP_SUFFIX = ".dpmigrate-tmp"
_NAME_KEPT = 100  # characters of the target's name kept in its temporaries' names (names are <= 255 bytes)
_OWNER = re.compile(r"(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9-]+)\.[a-z0-9_]+")  # mkstemp's random part: [a-z0-9_]


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object], *, like: str | None = None,
                 follow_symlinks: bool = False, keep_owner: bool = False) -> None:
    """Call ``write(file)`` on a fresh private temporary file, then atomically move it to ``path``.

    The new file takes the mode of ``like`` (the converter's copies: the source's) or of the file it
    replaces, under the rule in the module docstring. ``follow_symlinks``: when ``path`` is a link,
    rewrite what it points to (it stays a link); otherwise the link itself is replaced.
    ``keep_owner``: when root replaces another user's file, the new file is given to that user.
    Raises what ``write`` or the file system raised; the temporary is removed and ``path`` untouched.
    """
    path = os.fspath(path)
    target = os.path.realpath(path) if follow_symlinks else path
    folder, name = os.path.split(target)
    folder = folder or "."
    reference = _reference(like, target)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name[:_NAME_KEPT]}.{_owner_tag()}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if keep_owner and reference is not None:
                _give_back_to_owner(f.fileno(), reference)  # before the chmod: a chown may clear set-id bits
            keeps_mode = reference is not None and (keep_owner or reference.st_uid == os.geteuid())
            os.fchmod(f.fileno(), stat.S_IMODE(reference.st_mode) if keeps_mode else 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_folder(folder)
    remove_stale_temporaries(target)


def _reference(like: str | None, target: str) -> os.stat_result | None:
    """The file whose mode (and owner) the new one takes: ``like``, else the regular file being replaced."""
    if like is not None:
        return os.stat(like)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _give_back_to_owner(fd: int, st: os.stat_result) -> None:
    """Root rewriting a user's file should not leave it owned by root; others cannot chown, and need not."""
    if hasattr(os, "fchown") and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except PermissionError:
            pass


def _umask() -> int:
    """This process's umask, read without changing it when /proc tells (os.umask can only swap it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _host() -> str:
    node = os.uname().nodename if hasattr(os, "uname") else os.environ.get("COMPUTERNAME", "")
    return re.sub(r"[^A-Za-z0-9-]", "-", node)[:64] or "localhost"


def _owner_tag() -> str:
    return f"{os.getpid()}@{_host()}"


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


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporaries of ``path`` that processes of this host, now gone, left; return their names."""
    folder, name = os.path.split(path)
    prefix, host, me = f".{name[:_NAME_KEPT]}.", _host(), os.geteuid()
    removed = []
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(TMP_SUFFIX)):
            continue
        owner = _OWNER.fullmatch(entry.name[len(prefix):-len(TMP_SUFFIX)])
        if owner is None or owner["host"] != host or _process_exists(int(owner["pid"])):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == me:
                os.unlink(entry.path)  # unlink never follows a link
                removed.append(entry.name)
        except OSError:
            pass
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no process can have: leave it
    return True
