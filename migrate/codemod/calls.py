"""Reading a call's arguments the way Python binds them: one helper for every rule set.

``f(a, b)`` and ``f(a, size=b)`` both hand ``b`` to the parameter ``size`` at position 1. After a ``*args``
the positions are unknown, so a positional lookup past it finds nothing (the caller then leaves the call
alone or declines), never a wrong argument.
"""

from __future__ import annotations

import libcst as cst


def argument(call: cst.Call, position: int | None, keyword: str | None) -> cst.Arg | None:
    """The argument bound to parameter ``keyword`` (given by name) or at ``position`` (given positionally)."""
    if keyword is not None:
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == keyword:
                return arg
    if position is None:
        return None
    seen = 0
    for arg in call.args:
        if arg.keyword is not None or arg.star == "**":
            continue
        if arg.star == "*":
            return None  # where the later arguments land depends on what *args holds
        if seen == position:
            return arg
        seen += 1
    return None



def appended(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` after its arguments, laid out as the call was (one line, or one argument a line
    with a trailing comma): the one way rules add a keyword to a call."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if last.comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, new])
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
        between = args[-2].comma
    else:  # f(\n    a,\n): the new argument goes where the first one starts
        between = cst.Comma(whitespace_after=call.whitespace_before_args)
    args[-1] = last.with_changes(comma=between)
    return call.with_changes(args=[*args, new.with_changes(comma=last.comma)])
