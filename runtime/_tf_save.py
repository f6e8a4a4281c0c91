"""Saving under MultiWorkerMirroredStrategy: every worker saves, the chief's copy is the real one.

Why not "rank 0 writes" as in torch: saving distributed variables (a SavedModel, a checkpoint) may run
collectives, so a save that only the chief reaches deadlocks the job (TensorFlow's own guidance: every
worker saves, the chief to the real path, the others to a temporary path they then delete). So here:

- the chief writes into a fresh private temporary folder next to the target (``mkdtemp``: random
  name, mode 0700, same file system), under the target's own name (Keras picks the format from the
  suffix: ``.keras``, ``.h5``, ``.weights.h5``, or a SavedModel folder), then renames it onto the
  target: a reader sees the old file or the new one, never half of one. A folder target (SavedModel)
  replaces an existing one by two renames (the old one moved aside, then removed);
- every other worker writes the same way into a private temporary folder of this machine
  (``tempfile.mkdtemp``) and removes it;
- then all workers meet, so nobody reads the file before the chief has finished it.

``tf.train.CheckpointManager``: the chief saves through it, the others write a private copy (see
:func:`_save_managed`). ``tf.train.Checkpoint``: ``save(prefix)`` on every worker (the others with a temporary prefix), which
numbers the files ``prefix-<n>``; the chief's real path is returned on every worker. ``save_weights(path)``
with no ``.h5``/``.keras`` suffix (tf-keras' TensorFlow checkpoint format) writes several files, never one
named ``path``: ``path.index``, ``path.data-*`` and the folder's ``checkpoint`` (relative to the folder),
which the chief moves in, the index and ``checkpoint`` last, so a reader sees a whole checkpoint.

:func:`private_copy_path` is the other workers' side of ``dp.chief_path``: the same name in a private
temporary folder, removed when the process ends.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import tempfile

import tensorflow as tf

from .atomic import atomic_write, fsync_folder


def _write(obj, path: str, weights_only: bool, kwargs: dict):
    if isinstance(obj, tf.train.Checkpoint):
        return obj.save(path, **kwargs)
    if weights_only:
        obj.save_weights(path, **kwargs)
    elif hasattr(obj, "save") and callable(obj.save) and hasattr(obj, "weights"):  # a Keras model
        obj.save(path, **kwargs)
    elif isinstance(obj, tf.Module):
        tf.saved_model.save(obj, path, **kwargs)
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    return path


def _checkpoint_format(path: str, weights_only: bool, kwargs: dict) -> bool:
    """``save_weights`` writing TensorFlow's checkpoint format: no ``.h5``/``.keras`` suffix, or ``save_format="tf"``."""
    if not weights_only:
        return False
    given = str(kwargs.get("save_format") or "").lower()
    if given:
        return given in ("tf", "tensorflow")
    return not path.endswith((".h5", ".hdf5", ".keras"))


def _move_checkpoint_files(scratch: str, folder: str) -> None:
    """The files of a TF-format ``save_weights`` moved from ``scratch`` into ``folder``: data, index, then
    the ``checkpoint`` state (its paths are relative to the folder, so it reads the same there)."""
    def order(entry: str) -> int:
        return 2 if entry == "checkpoint" else 1 if entry.endswith(".index") else 0

    for entry in sorted(os.listdir(scratch), key=order):
        os.replace(os.path.join(scratch, entry), os.path.join(folder, entry))
    fsync_folder(folder)


def _makes_its_folder(obj, path: str, weights_only: bool, kwargs: dict) -> bool:
    """Whether the save creates a missing parent folder itself: a checkpoint, TensorFlow's checkpoint format of
    ``save_weights``, a SavedModel (a Keras model saved to a path without ``.h5``/``.keras``, a ``tf.Module``)."""
    if isinstance(obj, tf.train.Checkpoint) or _checkpoint_format(path, weights_only, kwargs):
        return True
    if weights_only:
        return False
    return isinstance(obj, tf.Module) and not path.endswith((".h5", ".hdf5", ".keras"))


def private_copy_path(path, rank: int):
    """The basename of ``path`` in a fresh private temporary folder (0700) removed at exit, same type as ``path``."""
    folder = tempfile.mkdtemp(prefix=f"dpmigrate-worker{rank}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    name = os.path.basename(os.path.normpath(os.fspath(path))) or "output"
    copy = os.path.join(folder, name)
    return type(path)(copy) if isinstance(path, os.PathLike) else copy


def _replace(new: str, target: str) -> None:
    """Move ``new`` onto ``target``: atomically for a file; for a folder, old one aside, new in, old removed."""
    if os.path.isdir(target) and not os.path.islink(target):
        aside = tempfile.mkdtemp(dir=os.path.dirname(target) or ".", prefix=f".{os.path.basename(target)}.old.")
        os.rename(target, os.path.join(aside, "old"))
        os.rename(new, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(new, target)
    fsync_folder(os.path.dirname(target) or ".")


def save(obj, path, *, is_chief: bool, barrier, weights_only: bool = False, **kwargs):
    """Every worker calls it; returns the chief's path (for a checkpoint: the numbered prefix)."""
    if isinstance(obj, tf.train.CheckpointManager):
        return _save_managed(obj, is_chief, barrier, kwargs)
    path = os.fspath(path)
    if not isinstance(obj, tf.Module) and not hasattr(obj, "save") and not weights_only:
        if is_chief:  # a plain Python object: no variables, no collectives
            atomic_write(path, lambda f: pickle.dump(obj, f))
        barrier()
        return path
    folder, name = os.path.split(os.path.abspath(path))
    if is_chief and _makes_its_folder(obj, path, weights_only, kwargs):
        os.makedirs(folder, exist_ok=True)  # as the save itself does (a single .h5/.keras file does not)
    scratch = tempfile.mkdtemp(dir=folder if is_chief else None, prefix=f".{name}.dpmigrate-save.")
    try:
        written = _write(obj, os.path.join(scratch, name), weights_only, kwargs)
        if isinstance(obj, tf.train.Checkpoint):
            real = os.path.join(folder, os.path.basename(written))
            if is_chief:
                for entry in os.listdir(scratch):
                    if entry != "checkpoint":
                        os.replace(os.path.join(scratch, entry), os.path.join(folder, entry))
                _update_checkpoint_state(folder, os.path.basename(written))
            barrier()
            return real
        if is_chief and _checkpoint_format(path, weights_only, kwargs):
            _move_checkpoint_files(scratch, folder)
        elif is_chief:
            _replace(os.path.join(scratch, name), path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    barrier()
    return path


def _save_managed(manager, is_chief: bool, barrier, kwargs: dict):
    """``CheckpointManager.save`` on the chief (numbering, ``max_to_keep``, the ``checkpoint`` file: the manager's);
    the others write the same checkpoint into a private temporary folder (reading distributed variables runs
    collectives) and remove it. Their managers keep reading the real folder (``latest_checkpoint``, restores)."""
    if is_chief:
        written = manager.save(**kwargs)
    else:
        scratch = tempfile.mkdtemp(prefix="dpmigrate-checkpoint.")
        try:
            manager.checkpoint.write(os.path.join(scratch, "ckpt"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        written = None
    barrier()
    return written


def _update_checkpoint_state(folder: str, prefix_name: str) -> None:
    """The ``checkpoint`` index file ``tf.train.latest_checkpoint`` reads, pointing at the new prefix."""
    tf.compat.v1.train.update_checkpoint_state(folder, os.path.join(folder, prefix_name),
                                     all_model_checkpoint_paths=[os.path.join(folder, prefix_name)])
