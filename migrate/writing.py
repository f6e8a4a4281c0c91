"""Put converted bytes on disk so that a crash, a full disk or a kill never leaves half a script.

The writing itself is the runtime's one atomic writer (:mod:`dpmigrate.runtime.atomic`): a private
temporary file in the destination's own folder, fsynced, given the original file's mode (and owner,
when we may set it), then ``os.replace``d over the destination, so a reader sees the old file or the
new one, never a torn one. This module adds what the converter needs on top: refusing files the user
made read-only, creating ``-o`` folders, following the user's symbolic links, and errors that say what
was left as it was. The bytes are written exactly as given: the engine already kept the encoding, the
BOM and the line endings, and nothing here translates them.
"""

from __future__ import annotations

import os
import stat

from .runtime.atomic import atomic_write


class WriteError(Exception):
    """The destination could not be (or must not be) replaced; it is left as it was."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def check_replaceable(path: str, *, folder_only: bool = False) -> None:
    """Refuse to write a file, or into a folder, that carries no write permission at all.

    ``os.replace`` only needs the folder to be writable, and root may write anywhere, so without
    this check a file the user made read-only (``chmod a-w``) would silently be replaced.
    ``folder_only`` is for ``-o`` copies: a copy of a read-only script is read-only too, and
    the next ``-o`` run into the same folder must still refresh it.
    """
    target = os.path.realpath(path)
    folder = os.path.dirname(target) or "."
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)  # -o DIR/new/sub: the folder that would receive the new ones
    if not folder_only and os.path.exists(target) and not _writable_bits(target):
        raise WriteError(path, f"is write-protected (mode {stat.filemode(os.stat(target).st_mode)}), so it was "
                               f"not rewritten; make it writable (chmod u+w {path}) or write copies with -o DIR")
    if not _writable_bits(folder):
        raise WriteError(path, f"cannot be written: its folder {folder} is write-protected "
                               f"(mode {stat.filemode(os.stat(folder).st_mode)}); make it writable (chmod u+w {folder})")


def _writable_bits(path: str) -> bool:
    return bool(os.stat(path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def write_atomic(path: str, data: bytes, like: str | None = None) -> None:
    """Replace (or create) ``path`` with ``data``; the file's mode is that of ``like`` or of ``path``.

    A symbolic link is followed: its target is rewritten and the link stays a link. Root rewriting a
    user's file gives it back to that user.
    """
    target = os.path.realpath(path)
    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        atomic_write(path, lambda handle: handle.write(data), like=like, follow_symlinks=True, keep_owner=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and exc.filename not in (path, target) else ""
        raise WriteError(path, f"cannot be written: {reason}{where}; the file was left as it was") from None
