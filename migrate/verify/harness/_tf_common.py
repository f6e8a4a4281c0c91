"""What the TensorFlow harness and its Keras half both use, in a module of its own so neither imports the other."""

from __future__ import annotations

import functools
import sys


def quietly(what: str):
    """The harness must never be what breaks a run: report the first failure of ``what``, go on."""
    def decorate(function):
        failed = []

        @functools.wraps(function)
        def guarded(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except Exception as e:
                if not failed:
                    failed.append(e)
                    print(f"dpmigrate verify: harness: {what}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return None
        return guarded
    return decorate


def is_numeric(tf, value) -> bool:
    """A tensor of numbers with a batch dimension (strings have no bytes of their own to fingerprint)."""
    return (isinstance(value, tf.Tensor) and bool(value.shape.rank)
            and (value.dtype.is_floating or value.dtype.is_integer or value.dtype.is_bool))
