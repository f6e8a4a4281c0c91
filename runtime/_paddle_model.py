"""The dygraph model wrapper: a ``paddle.DataParallel`` that behaves like the layer it wraps, and reducers kept alive.

Three behaviours of Paddle 3.3.1 (measured on 2 gloo ranks) that a converted script must not trip over:

- ``paddle.DataParallel`` does not forward attributes: ``net = dp.distributed_model(net); net.weight`` raised
  ``AttributeError`` (the torch backend's wrapper forwards them). :class:`ForwardingDataParallel` looks up what
  the wrapper lacks on the layer inside (``_layers``): parameters, sub-layers and the user's own methods.
  ``state_dict`` keys stay the layer's own (``DataParallel.state_dict`` is the layer's).
- ``paddle.jit.to_static(wrapper, input_spec=...)`` replaces the *wrapper's* ``forward``, so the layer inside is
  never converted and ``paddle.jit.save(dp.unwrap(model), ...)`` fails ("No valid transformed program").
  The wrapper hands such a ``forward`` to the layer inside instead: the layer is converted with the same
  ``input_spec`` and build strategy, and the wrapper keeps calling it (gradients still averaged).
- Each ``DataParallel`` builds an ``EagerReducer`` that registers hooks on the layer's parameters, and the
  hooks outlive it: once a first wrapper is garbage-collected, the next ``backward()`` through a second
  wrapper of the same layer (two ``paddle.Model`` objects over one network, or a layer wrapped twice) fails
  ("parameter ... has been ready before") or segfaults in ``EagerReducer::AddDistHook``, depending on when
  the collector ran. :func:`keep_reducers_alive` keeps every reducer of the job for its whole life (a live
  reducer's hooks do nothing when its own wrapper did not run the forward pass). ``dp.init()`` turns it on
  when launched; importing the runtime changes nothing.
"""

from __future__ import annotations

import functools

import paddle

_REDUCERS: list = []  # every DataParallel reducer of this job: freed with the process (see the module docstring)


class ForwardingDataParallel(paddle.DataParallel):
    """A ``paddle.DataParallel`` that reads what it lacks from the layer it wraps (never built directly: the
    runtime re-classes the wrapper ``fleet.distributed_model`` returns)."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_sub_layers", {}).get("_layers")
            if inner is None:
                raise
            return getattr(inner, name)

    def __setattr__(self, name, value):
        if name == "forward" and _is_static_function(value) and "_layers" in self.__dict__.get("_sub_layers", {}):
            _to_static_like(self._sub_layers["_layers"], value)  # paddle.jit.to_static(wrapper, ...)
            return
        super().__setattr__(name, value)


def forwarding(wrapper: paddle.DataParallel) -> paddle.DataParallel:
    """``wrapper`` (a plain ``paddle.DataParallel``) as a :class:`ForwardingDataParallel`, the same object."""
    if type(wrapper) is paddle.DataParallel:
        wrapper.__class__ = ForwardingDataParallel
    return wrapper


def _is_static_function(value) -> bool:
    from paddle.jit.dy2static.program_translator import StaticFunction

    return isinstance(value, StaticFunction)


def _to_static_like(layer: paddle.nn.Layer, static) -> None:
    """Convert ``layer``'s own forward as ``static`` (a StaticFunction made for the wrapper) was asked to be."""
    from paddle.jit.api import copy_decorator_attrs

    original = layer.forward
    layer._original_funcs["forward"] = original
    layer.forward = copy_decorator_attrs(
        original_func=original,
        decorated_obj=type(static)(function=original, input_spec=static._input_spec, **static._kwargs),
    )


def keep_reducers_alive() -> None:
    """From now on, every ``paddle.DataParallel`` built in this process keeps its reducer until the process ends.

    Idempotent. Applies to the runtime's wrappers and to those ``paddle.Model.prepare`` builds itself.
    """
    init = paddle.DataParallel.__init__
    if getattr(init, "_dpmigrate_keeps_reducers", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        reducer = self.__dict__.get("_reducer")
        if reducer is not None:
            _REDUCERS.append(reducer)

    __init__._dpmigrate_keeps_reducers = True
    paddle.DataParallel.__init__ = __init__
