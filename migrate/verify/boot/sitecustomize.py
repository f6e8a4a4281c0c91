"""Put first on ``PYTHONPATH`` by ``dpmigrate verify``: prepares the harness in every process it starts.

Python imports ``sitecustomize`` before the script runs; this one activates the harness
(:func:`dpmigrate.verify.harness.core.activate`, which does nothing outside the processes running the
script under verification), then runs the ``sitecustomize`` it shadows, if the environment has one.
"""

import os
import sys

if os.environ.get("DPMIGRATE_VERIFY_OUT"):
    try:
        from dpmigrate.verify.harness import core as _core

        _core.activate()
    except Exception as _error:  # never what breaks the run: the comparison will say the record is missing
        print(f"dpmigrate verify: harness not active: {type(_error).__name__}: {_error}", file=sys.stderr, flush=True)


def _run_shadowed() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed()
