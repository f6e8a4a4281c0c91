"""A training loader whose making code also feeds an evaluation loop: said, since that loop then reads a share."""

from __future__ import annotations

import libcst as cst

from ...codemod.loaders import LoaderFlow, evaluating_loops


def evaluated_share_note(rule, loader) -> None:
    """A note where a sharded training loader also feeds a loop that does not train (see ``evaluating_loops``)."""
    loops = evaluating_loops(rule.q, loader)
    if loops:
        line = rule.ctx.positions[loops[0].node].start.line
        rule.report(loader.call, "note", f"the same DataLoader(...) also feeds a loop that does not train (line {line}): "
                    "sharded with it, each rank evaluates its own share there, so what that loop prints is this "
                    "rank's figure, not the whole set's", "build the evaluation loader apart (left whole on every "
                    "rank), or add up that loop's sums over the ranks (dp.all_reduce(total, op=\"sum\"))")


def imported_share_notes(rule) -> None:
    """The same note where the loader-making function lives in a local module (``dataset.get_dataloader``,
    converted with the script so that its one ``DataLoader(...)`` is sharded): said at this file's call that
    feeds the loop that does not train (PaddleViT's ResNet-18 class: its validation printed rank 0's half)."""
    flow = rule.ctx.analysis(LoaderFlow)
    options = rule.ctx.options
    for call, reader in flow.imported_evaluated_shares(options.local_modules, options.local_training_parameters):
        line = rule.ctx.positions[reader].start.line
        what = f"the loop reading it (line {line})" if not isinstance(reader, cst.Call) else \
            f"`{rule.code(reader.func)}(...)`, which it is handed to (line {line}),"
        rule.report(call, "note", "this loader comes from the same local function as the training loader, whose "
                    f"DataLoader(...) is sharded for training: {what} does not train, "
                    "so each rank evaluates its own share there and what it computes is this rank's figure, "
                    "not the whole set's", "build the evaluation loader apart (left whole on every rank), or add "
                    "up that loop's sums over the ranks (dp.all_reduce(total, op=\"sum\"))")


def unaveraged_note(rule, loader) -> None:
    """A training loader left whole because nothing in the file would average gradients (see
    :func:`dpmigrate.codemod.loaders.nothing_averages`): every rank trains alike on all of it, as it says."""
    name = f" `{loader.name}`" if loader.name else ""
    rule.report(loader.call, "declined", f"training DataLoader{name} left whole: this file updates its parameters by "
                "hand (no optimizer, no model handed its parameters), so nothing averages gradients across ranks; "
                "sharded, each rank would train on its own part apart. Left whole, every rank trains on all of it as the "
                "original does (correct, no speed-up)", "to split the work, average each gradient before the update "
                f"(w.grad = {rule.ctx.alias}.all_reduce(w.grad)) and wrap the loader: "
                f"{rule.ctx.alias}.distributed_loader(...); or build the model as a Layer/Module with an optimizer")
