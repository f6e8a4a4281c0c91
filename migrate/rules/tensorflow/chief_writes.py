"""Files every worker would write into one path: TensorFlow's own writers, and images, written for the chief."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule

# (callee, position, keyword) of the folder or file every worker must write, the chief's being the real one
_PATHS = (
    ("tensorflow.saved_model.save", 1, "export_dir"),
    ("tensorflow.summary.create_file_writer", 0, "logdir"),
    ("tensorflow.summary.trace_on", None, "profiler_outdir"),
    ("tensorflow.summary.trace_export", None, "profiler_outdir"),
)
_IMAGES = {"tensorflow.keras.utils.array_to_img", "keras.utils.array_to_img", "tf_keras.utils.array_to_img",
           "tensorflow.keras.preprocessing.image.array_to_img", "keras.preprocessing.image.array_to_img",
           "PIL.Image.fromarray"}
_WRITERS = {"imageio.get_writer", "imageio.v2.get_writer", "imageio.v3.imopen"}


class ChiefWrites(Rule):
    """Give the chief the real path of what every worker writes; write images on the chief only.

    Why: launched on N workers, every worker runs the script's writes into the same path at once: a
    SavedModel folder torn by N writers, N TensorBoard event files in one log dir, N copies of each image.
    What runs collectives must still run on every worker (saving distributed variables reads them with
    collectives), so those write the real path on the chief and a private temporary path elsewhere
    (TensorFlow's own multi-worker pattern), through ``dp.chief_path``; plain image writes run on the chief.
    Example:  tf.saved_model.save(model, export_dir)        -> tf.saved_model.save(model, dp.chief_path(export_dir))
              writer = tf.summary.create_file_writer(logdir) -> writer = tf.summary.create_file_writer(dp.chief_path(logdir))
              img = keras.utils.array_to_img(x); img.save(p) -> img = ...; if dp.is_main_process(): img.save(p)
              with imageio.get_writer("a.gif") as w: ...      -> if dp.is_main_process(): with imageio.get_writer(...)
    ``CheckpointManager.save`` is ``keras-save``'s (``dp.save``); ``keras.utils.plot_model``, ``save_img``,
    ``imageio.imwrite``/``mimsave`` are the shared ``main-process-output`` rule's (the vocabulary's image writers).
    Leaves alone: writes already under a rank condition; a ``with`` writer block that trains or meets the others.
    """

    name = "tf-chief-writes"

    def finish(self) -> None:
        if not self.q.is_training_script():
            return
        ranks = self.ctx.analysis(RankAnalysis)
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            for callee, position, keyword in _PATHS:
                if not self.q.is_call_to(call, {callee}):
                    continue
                path = argument(call, position, keyword)
                if path is None or "chief_path" in self.code(path.value):
                    continue
                self.ctx.plan.replace(path, lambda updated: updated.with_changes(
                    value=self.dp_call("chief_path", updated.value)))
                self.report(path, "change", f"{self.code(call.func)}(...): every worker writes it (its variables are "
                            "read with collectives), the chief into the real path, the others into private temporary "
                            "ones (dp.chief_path)")
        images = self._image_names()
        for call in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.Name("save")))):
            owner = call.func.value
            made_here = isinstance(owner, cst.Call) and self.q.is_call_to(owner, _IMAGES)
            if (made_here or (isinstance(owner, cst.Name) and owner.value in images)) and \
                    ranks.rank_condition(call) is None:
                self._guard(self.q.statement_of(call), call, "image written")
        for block in self.q.findall(self.ctx.module, m.With()):
            if any(isinstance(i.item, cst.Call) and self.q.is_call_to(i.item, _WRITERS) for i in block.items) and \
                    not self.q.has_backward(block) and not ranks.has_collective(block) and \
                    ranks.rank_condition(block) is None:
                self._guard(block, block.items[0].item, "images written")

    def _image_names(self) -> set[str]:
        """Names assigned an image made from an array (``img = keras.utils.array_to_img(x)``)."""
        found = set()
        for assign in self.q.findall(self.ctx.module, m.Assign(value=m.Call())):
            if self.q.is_call_to(assign.value, _IMAGES) and len(assign.targets) == 1 and \
                    isinstance(assign.targets[0].target, cst.Name):
                found.add(assign.targets[0].target.value)
        return found

    def _guard(self, statement: cst.BaseStatement | None, where: cst.CSTNode, what: str) -> None:
        if statement is None or not isinstance(self.q.parent(statement), (cst.Module, cst.IndentedBlock)):
            return
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) != 1:
            return
        if not self.ctx.plan.group([statement], self.main_process_only):
            return
        self.report(where, "change", f"{what} by the chief only (under `if dp.is_main_process():`): every worker "
                    "would write the same file")

