"""``toyfw.save(obj, path)`` -> ``dp.save(obj, path)``: the toy framework's only rule of its own."""

from dpmigrate.codemod.rule import Rule


class ToySave(Rule):
    """Replace the toy framework's save calls (from its vocabulary) with the runtime's."""

    name = "toy-save"

    def visit_Call(self, node):
        if self.q.is_call_to(node, self.vocabulary.save_calls):
            self.ctx.plan.replace(node, lambda updated: updated.with_changes(func=self.dp_attribute("save")))
            self.report(node, "change", "toyfw.save -> dp.save")
