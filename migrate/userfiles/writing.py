"""Put converted bytes on disk so that a crash, a full disk or a kill never leaves half a script.

The writing itself is the runtime's one atomic writer (:mod:`dpmigrate.runtime.atomic`): a private
temporary file in the destination's own folder, fsynced, given the original file's mode (and owner,
when we may set it), then ``os.replace``d over the destination, so a reader sees the old file or the
new one, never a torn one. This module adds what the converter needs on top: refusing files the
user made read-only or edited while they were being converted, creating ``-o`` folders (never through
a link planted in them), following the user's own symbolic links, and errors that say what was left
as it was. The bytes are written exactly as given: the engine already kept the encoding, the BOM and
the line endings, and nothing here translates them.
"""

from __future__ import annotations

import os
import stat

from ..run.converting import Snapshot
from ..runtime.atomic import atomic_write


class WriteError(Exception):
    """The destination could not be (or must not be) replaced; it is left as it was."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def check_replaceable(path: str, *, folder_only: bool = False, follow_symlinks: bool = True) -> None:
    """Refuse to write a file, or into a folder, that carries no write permission at all.

    ``os.replace`` only needs the folder to be writable, and root may write anywhere, so without
    this check a file the user made read-only (``chmod a-w``) would silently be replaced.
    ``folder_only`` is for ``-o`` copies: a copy of a read-only script is read-only too, and
    the next ``-o`` run into the same folder must still refresh it.
    """
    target = os.path.realpath(path) if follow_symlinks else os.path.abspath(path)
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


def copy_destination(output_dir: str, relative: str) -> str:
    """Where ``-o`` writes a copy; WriteError when a folder on the way inside ``output_dir`` is a link.

    ``output_dir`` itself may be a link (the user named it); below it, a link (planted, or left by
    another tool) could lead the copy anywhere, so it is refused, never followed. A link at the copy's
    own name is replaced by the copy (``write_atomic(..., follow_symlinks=False)``), never written through.
    """
    destination = os.path.join(output_dir, relative)
    folder = os.path.dirname(destination)
    while folder and os.path.normpath(folder) != os.path.normpath(output_dir):
        if os.path.islink(folder):
            raise WriteError(destination, f"its copy {destination} was not written: {folder} is a symbolic link "
                                          f"(to {os.readlink(folder)}) inside -o {output_dir}, and copies are never "
                                          "written through links; remove the link or choose another -o folder")
        folder = os.path.dirname(folder)
    return destination


def write_copy(output_dir: str, relative: str, data: bytes, like: str) -> str:
    """Write one ``-o`` copy, ``output_dir/relative``, with the mode of ``like``; return its path.

    The same rules for every copy (a converted script, or a local module it imports copied unchanged):
    never through a link inside ``output_dir`` (:func:`copy_destination`), a link at the copy's own name
    replaced rather than followed, a write-protected folder refused, the bytes replaced atomically."""
    destination = copy_destination(output_dir, relative)
    check_replaceable(destination, folder_only=True, follow_symlinks=False)
    write_atomic(destination, data, like=like, follow_symlinks=False)
    return destination


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (through links, hard links or ``.``); False if either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class ChangedMeanwhile(WriteError):
    """The file is no longer what was read and converted: the user (or a tool) changed it meanwhile."""


def write_atomic(path: str, data: bytes, like: str | None = None, *, follow_symlinks: bool = True,
                 expect: tuple[bytes, Snapshot] | None = None) -> None:
    """Replace (or create) ``path`` with ``data``; the file's mode is that of ``like`` or of ``path``.

    With ``follow_symlinks`` a symbolic link is followed: its target is rewritten and the link stays a
    link (the user's own script); without, a link at ``path`` is replaced (``-o`` copies). Root
    rewriting a user's file gives it back to that user. ``expect``: the bytes and stat the conversion
    read; if the file no longer has them when the new bytes are ready to replace it, ChangedMeanwhile.
    """
    target = os.path.realpath(path) if follow_symlinks else path

    def write(handle) -> None:
        handle.write(data)
        if expect is not None:
            _check_unchanged(path, target, *expect)

    try:
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        atomic_write(path, write, like=like, follow_symlinks=follow_symlinks, keep_owner=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and exc.filename not in (path, target) else ""
        raise WriteError(path, f"cannot be written: {reason}{where}; the file was left as it was") from None


def _check_unchanged(path: str, target: str, original: bytes, snapshot: Snapshot) -> None:
    try:
        with open(target, "rb") as handle:
            now, current = Snapshot.of(os.fstat(handle.fileno())), handle.read()
    except OSError:
        now, current = None, None
    if now != snapshot or current != original:
        raise ChangedMeanwhile(path, "changed while it was being converted; left as the user left it "
                                     "(run dpmigrate on it again)")
