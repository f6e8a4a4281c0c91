"""Findings that name the runtime by the alias the converted file binds it to.

Why: a file that already uses the name ``dp`` gets the runtime as ``dpr`` (or ``dp_runtime``...), but the
rules' messages and fixes were written with ``dp.``: the report then told the user to call ``dp.barrier()``
in a file where ``dp`` is something else. Every Paddle rule reports through :class:`AliasedReports`, which
writes ``dp.`` in its text as the file's alias, outside backquoted spans (those quote the user's code; a rule
that suggests code in backquotes names the alias itself).
"""

from __future__ import annotations

import re

_DP = re.compile(r"(?<![\w.])dp\.")
_QUOTED = re.compile(r"(`[^`]*`)")  # the user's code, quoted: its `dp` is the user's own name


class AliasedReports:
    """A mixin for :class:`~dpmigrate.codemod.rule.Rule` subclasses: ``dp.`` in findings becomes the file's alias."""

    def report(self, node, severity, message, fix=None, effect=None):
        alias = self.ctx.alias
        if alias != "dp" and not self.q.index.possible({self.vocabulary.runtime_module}):  # (a converted file: dp is it)
            message = _aliased(message, alias)
            fix = _aliased(fix, alias) if fix else fix
        super().report(node, severity, message, fix, effect=effect)


def _aliased(text: str, alias: str) -> str:
    """``dp.`` written as ``alias.`` outside backquoted spans (quotes of the user's code, left as written)."""
    return "".join(part if part.startswith("`") else _DP.sub(f"{alias}.", part) for part in _QUOTED.split(text))
