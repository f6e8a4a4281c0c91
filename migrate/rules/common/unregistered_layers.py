"""Layers a model keeps in a plain Python list: not its parameters, so not broadcast to the ranks, said."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule


class UnregisteredLayers(Rule):
    """Note a model class whose ``__init__`` keeps layers in a plain list (``self.hidden = []`` then
    ``self.hidden.append(nn.Linear(16, 16))``, or a list of them).

    Why: a plain list does not register its layers, so they are not among the model's parameters: the optimizer does
    not train them, and the distributed model (DDP, fleet's DataParallel) does not broadcast them. Unseeded, each
    rank draws its own initial weights for them, so the ranks compute with different layers and the averaged
    gradients are no single process's (the recommender of awesome-DeepLearning's chapter 7, issue 19 audit round H:
    0.022 from one process; 3e-08 with ``nn.LayerList``). The fix is the container the framework registers.
    Example (note):  self.hidden = []; self.hidden.append(nn.Linear(16, 16))
    fix: self.hidden = nn.LayerList([...]) (Paddle) / nn.ModuleList([...]) (torch), or seed the framework's generator
    alike on every rank before the model is built.
    Leaves alone: the code (a note); lists whose layers the class registers itself (``add_sublayer``, ``add_module``).
    """

    name = "unregistered-layers"
    about_training = False

    def finish(self) -> None:
        if not self.q.is_training_script():
            return
        prefix = f"{self.vocabulary.framework}.nn."
        for cls in (s for s in self.ctx.module.body if isinstance(s, cst.ClassDef) and s.bases):
            init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
            if init is None or self.q.findall(init, m.Call(func=m.Attribute(attr=m.Name("add_sublayer") | m.Name(
                    "add_module") | m.Name("register_module")))):
                continue
            for name, site in self._listed_layers(init, prefix).items():
                self.report(site, "note", f"{cls.name.value}.{name} keeps layers in a plain list: they are not the "
                            "model's parameters, so the optimizer does not train them and the distributed model does "
                            "not give every rank rank 0's weights for them (unseeded, each rank computes with its own)",
                            f"keep them in the framework's list: self.{name} = "
                            f"{'nn.LayerList' if self.vocabulary.framework == 'paddle' else 'nn.ModuleList'}([...])")

    def _listed_layers(self, init: cst.FunctionDef, prefix: str) -> dict[str, cst.CSTNode]:
        """``self.name`` made a list and given layers (in the literal, a comprehension, or by ``append``)."""
        lists: dict[str, cst.Assign] = {}
        for assign in self.q.findall(init, m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("self")))])):
            if isinstance(assign.value, (cst.List, cst.ListComp)):
                lists[assign.targets[0].target.attr.value] = assign
        found: dict[str, cst.CSTNode] = {}
        for name, assign in lists.items():
            layers = [c for c in self.q.index.of_type(assign.value, cst.Call) if self._is_layer(c, prefix)]
            for call in self.q.findall(init, m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"),
                                                                                        attr=m.Name(name)),
                                                                      attr=m.Name("append") | m.Name("extend")))):
                layers += [c for c in self.q.index.of_type(call, cst.Call) if c is not call and self._is_layer(c, prefix)]
            if layers:
                found[name] = assign
        return found

    def _is_layer(self, call: cst.Call, prefix: str) -> bool:
        name = self.q.callee_starts_with(call, prefix)
        return name is not None and name.rsplit(".", 1)[-1][:1].isupper()
