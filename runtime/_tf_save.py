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

``tf.train.Checkpoint``: ``save(prefix)`` on every worker (the others with a temporary prefix), which
numbers the files ``prefix-<n>``; the chief's real path is returned on every worker.
"""

from __future__ import annotations

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
    path = os.fspath(path)
    if not isinstance(obj, tf.Module) and not hasattr(obj, "save") and not weights_only:
        if is_chief:  # a plain Python object: no variables, no collectives
            atomic_write(path, lambda f: pickle.dump(obj, f))
        barrier()
        return path
    folder, name = os.path.split(os.path.abspath(path))
    if is_chief and isinstance(obj, tf.train.Checkpoint):
        os.makedirs(folder, exist_ok=True)  # as Checkpoint.save itself does
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
        if is_chief:
            _replace(os.path.join(scratch, name), path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    barrier()
    return path


def _update_checkpoint_state(folder: str, prefix_name: str) -> None:
    """The ``checkpoint`` index file ``tf.train.latest_checkpoint`` reads, pointing at the new prefix."""
    tf.compat.v1.train.update_checkpoint_state(folder, os.path.join(folder, prefix_name),
                                     all_model_checkpoint_paths=[os.path.join(folder, prefix_name)])
