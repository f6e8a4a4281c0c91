"""A training loader whose making code also feeds an evaluation loop: said, since that loop then reads a share."""

from __future__ import annotations

from ...codemod.loaders import evaluating_loops


def evaluated_share_note(rule, loader) -> None:
    """A note where a sharded training loader also feeds a loop that does not train (see ``evaluating_loops``)."""
    loops = evaluating_loops(rule.q, loader)
    if loops:
        line = rule.ctx.positions[loops[0].node].start.line
        rule.report(loader.call, "note", f"the same DataLoader(...) also feeds a loop that does not train (line {line}): "
                    "sharded with it, each rank evaluates its own share there, so what that loop prints is this "
                    "rank's figure, not the whole set's", "build the evaluation loader apart (left whole on every "
                    "rank), or add up that loop's sums over the ranks (dp.all_reduce(total, op=\"sum\"))")
