"""The file events Python's audit hook cannot see, and the barriers that order them (:mod:`.files`).

Why: ``torch.save`` to a path, ``paddle.jit.save``, ``tf.io.gfile`` and Keras' ``save`` write and delete in C++, so a
checkpoint written by every rank (the commonest file fault of a conversion) never reaches ``sys.addaudithook``. Each
framework adapter calls its ``install_*`` here as it installs; the wrappers note the path argument, then call the
original. Collectives (``torch.distributed``'s and ``paddle.distributed``'s barrier, all-reduce, broadcast, gather)
and ``dpmigrate.runtime``'s ``barrier`` (which its ``save`` and ``main_process_first`` call) are timed: a file
event before a barrier on one rank and one after it on another are ordered. TF's strategy collectives run inside
graphs: they order nothing here (``dp.barrier`` does). Nothing here may break the script: a wrapper that cannot be
installed is said in the report.
"""

from __future__ import annotations

import functools

from . import files

_TORCH_COLLECTIVES = ("barrier", "all_reduce", "broadcast", "broadcast_object_list", "all_gather", "all_gather_object",
                      "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
                      "reduce_scatter", "monitored_barrier")
_PADDLE_COLLECTIVES = ("barrier", "all_reduce", "broadcast", "broadcast_object_list", "all_gather",
                       "all_gather_object", "reduce", "scatter", "alltoall", "reduce_scatter")
_GFILE = {"rmtree": ("delete", 0), "remove": ("delete", 0), "makedirs": ("mkdir", 0), "mkdir": ("mkdir", 0),
          "copy": ("write", 1), "listdir": ("list", 0), "walk": ("list", 0), "glob": ("list", 0)}
_KERAS_MODELS = {"tf_keras": ("tf_keras.src.engine.training", "Model"), "keras": ("keras.src.models.model", "Model")}


def _argument(args, kwargs, index: int, name: str):
    return args[index] if len(args) > index else kwargs.get(name)


def noting(kind: str, function, index: int, name: str):
    """``function`` noting ``kind`` of its argument ``index`` (or keyword ``name``) before it runs."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        events = files.current()
        if events is not None:
            path = _argument(args, kwargs, index, name)
            if kind == "list" and name == "pattern" and isinstance(path, str):
                path = files._glob_root(path)
            events.note(kind, path)
        return function(*args, **kwargs)
    wrapper._dpmigrate_files = True
    return wrapper


def timed(function):
    """``function`` (a barrier or a collective) recorded as a barrier: when this rank entered and left it."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        events = files.current()
        outermost = events.entered() if events is not None else False
        try:
            return function(*args, **kwargs)
        finally:
            if events is not None:
                events.left(outermost)
    wrapper._dpmigrate_files = True
    return wrapper


def _replace(owner, name: str, make) -> None:
    original = getattr(owner, name, None)
    if callable(original) and not getattr(original, "_dpmigrate_files", False):
        setattr(owner, name, make(original))


def _guarded(what: str):
    def decorate(function):
        @functools.wraps(function)
        def run(module, recorder):
            if files.current() is None:
                return
            try:
                function(module)
            except Exception as e:  # the run goes on; the report says which events are missing
                recorder.changed(f"files not recorded for {what}: {type(e).__name__}: {e}")
        return run
    return decorate


@_guarded("torch.save")
def install_torch(torch) -> None:
    _replace(torch, "save", lambda f: noting("write", f, 1, "f"))
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available():
        for name in _TORCH_COLLECTIVES:
            _replace(dist, name, timed)


@_guarded("paddle.save")
def install_paddle(paddle) -> None:
    _replace(paddle, "save", lambda f: noting("write", f, 1, "path"))
    _replace(paddle.jit, "save", lambda f: noting("write", f, 1, "path"))
    for name in _PADDLE_COLLECTIVES:
        _replace(paddle.distributed, name, timed)


@_guarded("tf.io.gfile")
def install_tensorflow(tf) -> None:
    gfile = tf.io.gfile
    for name, (kind, index) in _GFILE.items():
        keyword = {"copy": "newpath", "glob": "pattern", "walk": "top"}.get(name, "path")
        _replace(gfile, name, lambda f, kind=kind, index=index, keyword=keyword: noting(kind, f, index, keyword))
    _replace(gfile, "rename", _renaming)
    opened = gfile.GFile.__mro__[-2]  # tensorflow's FileIO: GFile's base
    _replace(opened, "__init__", _opening)


def _renaming(rename):
    @functools.wraps(rename)
    def wrapper(oldname, newname, *args, **kwargs):
        events = files.current()
        if events is not None:
            events.note("delete", oldname)
            events.note("write", newname)
        return rename(oldname, newname, *args, **kwargs)
    wrapper._dpmigrate_files = True
    return wrapper


def _opening(init):
    @functools.wraps(init)
    def wrapper(self, name, mode="r", *args, **kwargs):
        events = files.current()
        if events is not None:
            events.note("read" if set(str(mode)) <= {"r", "b"} else "write", name)
        return init(self, name, mode, *args, **kwargs)
    wrapper._dpmigrate_files = True
    return wrapper


@_guarded("Keras' Model.save")
def install_keras(keras) -> None:
    import importlib

    where = _KERAS_MODELS.get(keras.__name__.split(".")[0])
    if where is None:
        return
    try:
        model = getattr(importlib.import_module(where[0]), where[1])
    except (ImportError, AttributeError):
        return  # another Keras: its saves are seen where Python writes them
    for name in ("save", "save_weights"):
        _replace(model, name, lambda f: noting("write", f, 1, "filepath"))


def wrap_runtime(module) -> None:
    """``dpmigrate.runtime.<framework>``: its ``barrier`` (which ``save`` and ``main_process_first`` call by name)."""
    if files.current() is not None:
        _replace(module, "barrier", timed)
