"""Standalone ``keras`` imports of a Keras-2-era script, read through ``tensorflow.keras``."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from ._keras import KerasFile


class StandaloneKeras(Rule):
    """Import Keras through TensorFlow: ``from keras.layers import Dense`` -> ``from tensorflow.keras.layers import Dense``.

    Why: with TF 2.16+ the standalone ``keras`` package is Keras 3, whose ``fit`` fails under
    ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585). ``tensorflow.keras`` is Keras 3 as well
    when run plainly (so the script runs as before) and tf-keras, the Keras 2 API the script was
    written for, when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported, as
    ``dpmigrate launch`` does for TensorFlow jobs.
    Example:  import keras                      ->  from tensorflow import keras
              from keras.models import Sequential  ->  from tensorflow.keras.models import Sequential
    Only in files whose Keras models are compiled and fitted (the ones the strategy runs), and not in files
    using Keras 3-only APIs (``keras.ops``...: tf-keras has none of them; their fit is declined).
    Leaves alone: ``import keras.x.y`` without ``as`` (declined: the names it binds would change).
    """

    name = "keras-through-tensorflow"

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        if not keras.compiles:
            return
        if keras.keras3_only:
            use = keras.keras3_only[0]
            self.report(use, "note", f"Keras 3 imports kept: the script uses {keras.keras3_name(use)}, which tf-keras (what "
                        "tensorflow.keras is on a launched job) does not have")
            return
        for node in self.q.index.of_type(self.ctx.module, cst.Import, cst.ImportFrom):
            if isinstance(node, cst.ImportFrom):
                if node.relative or node.module is None:
                    continue
                module = self.code(node.module)
                if module == "keras" or module.startswith("keras."):
                    new = cst.parse_expression(f"tensorflow.{module}")
                    self.ctx.plan.replace(node, lambda updated, n=new: updated.with_changes(module=n))
                    self.report(node, "change", f"from {module} import ... -> from tensorflow.{module} import ...: "
                                "tf-keras on a launched job, where Keras 3's fit cannot run distributed")
                continue
            for alias in node.names:
                dotted = self.code(alias.name)
                if dotted != "keras" and not dotted.startswith("keras."):
                    continue
                if len(node.names) != 1 or (dotted != "keras" and alias.asname is None):
                    self.report(node, "declined", f"import {dotted}: cannot be read through tensorflow.keras in place",
                                f"write it as `from tensorflow{'.' + dotted.rsplit('.', 1)[0] if '.' in dotted else ''}"
                                f" import {dotted.rsplit('.', 1)[-1]}`")
                    continue
                package, _, last = f"tensorflow.{dotted}".rpartition(".")
                bound = alias.asname.name.value if alias.asname else last
                line = f"from {package} import {last}" + (f" as {bound}" if bound != last else "")
                new = cst.parse_statement(line + "\n", config=self.ctx.config()).body[0]
                self.ctx.plan.replace(node, lambda updated, n=new: n)
                self.report(node, "change", f"import {dotted} -> {line}: tf-keras on a launched job, where Keras 3's "
                            "fit cannot run distributed")
