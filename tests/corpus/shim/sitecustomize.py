"""The corpus's synthetic-data shim, run in every process of a corpus run by being on ``PYTHONPATH``.

Real public scripts download MNIST, CIFAR, IMDB... and the corpus machine has no network. With
``DPMIGRATE_CORPUS_SHIM=1`` this makes ``keras.datasets``/``tf.keras.datasets``/``tf_keras.datasets``,
``keras.utils.get_file``, ``torchvision.datasets`` and ``paddle.vision``/``paddle.text`` datasets serve
deterministic synthetic data of the real shapes, dtypes and value ranges (``_corpus_shim``), the same in the
original's process and in every rank's, so ``dpmigrate verify`` compares like with like.
``DPMIGRATE_CORPUS_SAMPLES`` sets the training samples per data set (default 512; a quarter of it for test);
``DPMIGRATE_CORPUS_CACHE`` where the few files ``get_file`` makes go (default: a folder in the temp directory).
Without ``DPMIGRATE_CORPUS_SHIM=1`` it does nothing but run the ``sitecustomize`` it shadows, so it is harmless
on the path. It imports no framework: each is patched as the script imports it.

Under ``dpmigrate verify``, the verify boot ``sitecustomize`` comes first on the path and runs this one (the
first ``sitecustomize`` it shadows); this one in turn runs the next one after its own folder, if any.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("DPMIGRATE_CORPUS_SHIM") == "1":
    try:
        if _HERE not in (os.path.abspath(p or os.curdir) for p in sys.path):
            sys.path.append(_HERE)
        import _corpus_shim

        _corpus_shim.install()
    except Exception as _error:  # the run goes on; its first download will fail for want of network
        print(f"dpmigrate corpus shim: not active: {type(_error).__name__}: {_error}", file=sys.stderr, flush=True)


def _run_shadowed() -> None:
    """Run the ``sitecustomize`` found after this folder on ``sys.path`` (never one before it: that one ran us)."""
    import importlib.machinery
    import importlib.util

    places = [os.path.abspath(p or os.curdir) for p in sys.path]
    if _HERE not in places:
        return
    later = [p for p in sys.path[places.index(_HERE) + 1 :] if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed()
