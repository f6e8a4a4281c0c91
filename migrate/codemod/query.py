"""Questions the rules ask of the original tree: qualified names, parents, enclosing statements,
which loops train, which calls build an optimizer.

Kept free of any edit so that the rules read as decisions, and the divergence check (which runs on
files left unchanged) can share the same notion of "training loop" as the data rules. What a
training step or an optimizer looks like comes from the framework's vocabulary. Every answer comes
from one :class:`~.index.TreeIndex` of the file (no walk of the tree per question).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper

from . import patterns as m
from .index import TreeIndex
from .vocabulary import Vocabulary, matches

STATEMENT_TYPES = (cst.SimpleStatementLine, cst.BaseCompoundStatement)


class Query:
    """Metadata look-ups over one wrapped module."""

    def __init__(self, wrapper: MetadataWrapper, vocabulary: Vocabulary, index: TreeIndex | None = None) -> None:
        self.module = wrapper.module
        self.vocabulary = vocabulary
        self.index = index or TreeIndex(wrapper)
        self.findall = self.index.findall  # m.findall's answer, from the index
        self._training_functions: set[str] | None = None
        self._module_functions: dict[str, cst.FunctionDef] | None = None
        self.local_trainer_calls: list[cst.Call] = []  # calls of a local module's function that trains (the engine's)

    # --- names ------------------------------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        return self.index.qualified_names(node)

    def is_call_to(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        """True for a call whose callee resolves (by qualified name) to one of ``names``."""
        return isinstance(node, cst.Call) and bool(self.index.qualified_names_among(node.func, names))

    def callee_starts_with(self, node: cst.CSTNode, prefix: str) -> str | None:
        """The callee's qualified name when it starts with ``prefix`` (e.g. ``"torch.optim."``)."""
        if isinstance(node, cst.Call):  # the names under the prefix's package: no scope analysis when plain
            package = prefix[:-1] if prefix.endswith(".") else prefix.split(".", 1)[0]
            names = self.index.qualified_names_under(node.func, package)
            for name in sorted(names):
                if name.startswith(prefix):
                    return name
        return None

    def first_use(self, prefixes: tuple[str, ...]) -> cst.CSTNode | None:
        """The first name or (outermost) attribute whose qualified name is under one of ``prefixes``: where a
        file shows its API generation (the vocabulary's markers), for a finding to point at."""
        if not self.index.possible(prefixes):
            return None
        packages = {p.split(".", 1)[0] for p in prefixes}
        for node in self.index.of_type(self.module, cst.Attribute, cst.Name):
            parent = self.parent(node)
            if isinstance(parent, cst.Attribute) and parent.value is node:
                continue  # the outermost attribute only
            if any(matches(n, prefixes) for p in packages for n in self.index.qualified_names_under(node, p)):
                return node
        return None

    def named_under(self, node: cst.CSTNode, package: str) -> bool:
        """``node`` resolves to ``package`` or a name inside it (``"torch"``: ``torch.cuda``, ``torch``)."""
        return bool(self.index.qualified_names_under(node, package))

    # --- structure --------------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.index.parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        return self.index.ancestors(node)

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement (a whole line or compound statement in a block) that contains ``node``."""
        for candidate in (node, *self.ancestors(node)):
            if isinstance(candidate, STATEMENT_TYPES) and isinstance(
                self.parent(candidate), (cst.Module, cst.IndentedBlock)
            ):
                return candidate
        return None

    def block_of(self, statement: cst.CSTNode) -> cst.Module | cst.IndentedBlock | None:
        parent = self.parent(statement)
        return parent if isinstance(parent, (cst.Module, cst.IndentedBlock)) else None

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return None

    def in_main_guard(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.If) and is_main_guard(a) for a in self.ancestors(node))

    def module_functions(self) -> dict[str, cst.FunctionDef]:
        if self._module_functions is None:
            self._module_functions = {s.name.value: s for s in self.module.body if isinstance(s, cst.FunctionDef)}
        return dict(self._module_functions)

    # --- training ---------------------------------------------------------------------------------

    def training_functions(self) -> set[str]:
        """Module-level functions that run a backward pass, directly or through one another."""
        if self._training_functions is None:
            functions = self.module_functions()
            found = {name for name, fn in functions.items() if self.has_backward(fn.body)}
            changed = True
            while changed:
                changed = False
                for name, fn in functions.items():
                    if name not in found and self.called_names(fn.body) & found:
                        found.add(name)
                        changed = True
            self._training_functions = found
        return self._training_functions

    def is_training_script(self) -> bool:
        """The file runs a backward pass or an optimizer step somewhere (not only models or helpers)."""
        return self.trains(self.module)

    def trains(self, node: cst.CSTNode) -> bool:
        """True when ``node`` runs a backward pass or an optimizer step, directly or via a call (of the file's own
        functions, or of a local module's that trains)."""
        return self.has_backward(node) or bool(self.called_names(node) & self.training_functions()) or any(
            self.index.contains(node, call) for call in self.local_trainer_calls)

    def has_backward(self, node: cst.CSTNode) -> bool:
        """``loss.backward()``, ``scaler.scale(loss).backward()`` or ``optimizer.step()`` somewhere inside.

        The method names are the vocabulary's; a step counts only on a name that says "optim".
        """
        backward, step = self.vocabulary.backward_methods, self.vocabulary.optimizer_step_methods
        for call in self.findall(node, m.Call(func=m.Attribute(attr=m.Name()))):
            attribute = call.func
            if attribute.attr.value in backward:
                return True
            owner = attribute.value
            if attribute.attr.value in step and isinstance(owner, cst.Name) and "optim" in owner.value.lower():
                return True
        return False

    def called_names(self, node: cst.CSTNode) -> set[str]:
        """Names of plain functions called inside ``node`` (``train(...)`` gives ``train``)."""
        return {c.func.value for c in self.findall(node, m.Call(func=m.Name()))}

    def names_in(self, node: cst.CSTNode) -> set[str]:
        """Every variable name read or written inside ``node`` (attribute names excluded)."""
        found: set[str] = set()
        for name in self.index.of_type(node, cst.Name):
            parent = self.parent(name)
            if not (isinstance(parent, cst.Attribute) and parent.attr is name and name is not node):
                found.add(name.value)
        return found

    def assigned_names(self, statement: cst.CSTNode) -> set[str]:
        """Names a statement binds with ``=``, ``+=``, an annotated assignment or a ``for`` target."""
        found: set[str] = set()
        for node in self.findall(statement, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For()):
            found.update(target_names(node.target))
        return found


def is_main_guard(node: cst.If) -> bool:
    """``if __name__ == "__main__":`` (either operand order, either quote)."""
    test = node.test
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    if not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    has_name = any(isinstance(s, cst.Name) and s.value == "__name__" for s in sides)
    has_main = any(isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__" for s in sides)
    return has_name and has_main


def target_names(target: cst.BaseExpression) -> set[str]:
    """``a`` -> {a}; ``a, (b, c)`` -> {a, b, c}; attributes and subscripts bind no name."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(target_names(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return set()


def body_statements(node: cst.CSTNode) -> Iterator[cst.BaseStatement]:
    """The statements of a compound statement's or module's body, in order (not nested ones)."""
    body = getattr(node, "body", None)
    if isinstance(node, cst.Module):
        yield from node.body
    elif isinstance(body, cst.IndentedBlock):
        yield from body.body
    elif isinstance(body, cst.SimpleStatementSuite):
        yield from ()


def optimizer_class(query: Query, node: cst.CSTNode) -> str | None:
    """``"torch.optim.SGD"`` for a call constructing one of the framework's optimizers, else None.

    An optimizer is a class (capitalised) under the vocabulary's ``optimizer_prefix``, schedulers
    and base classes excepted; matched by qualified name, so a script's own ``SGD`` is not one.
    """
    vocabulary = query.vocabulary
    if not vocabulary.optimizer_prefix:
        return None
    name = query.callee_starts_with(node, vocabulary.optimizer_prefix)
    if name is None or matches(name, vocabulary.not_optimizer_prefixes) or not name.rsplit(".", 1)[-1][:1].isupper():
        return None
    return name


def parameter_call(query: Query) -> m.Call:
    """Matches ``x.parameters()`` (the vocabulary's parameter methods)."""
    return m.Call(func=m.Attribute(attr=m.OneOf(*(m.Name(n) for n in query.vocabulary.parameter_methods))))


def parameter_owners(query: Query, call: cst.Call) -> list[str]:
    """Models whose parameters an optimizer takes: ``SGD(model.fc.parameters())`` gives ``["model"]``.

    Given positionally (first in torch; second in Paddle: ``SGD(0.1, net.parameters())``), or as
    ``params=`` (torch) or ``parameters=`` (Paddle).
    """
    params = [a.value for a in call.args if a.keyword is None]
    params += [a.value for a in call.args if a.keyword is not None and a.keyword.value in ("params", "parameters")]
    owners: list[str] = []
    for root in params:
        for found in query.findall(root, parameter_call(query)):
            owner = found.func.value
            while isinstance(owner, cst.Attribute):
                owner = owner.value
            if isinstance(owner, cst.Name) and owner.value not in owners:
                owners.append(owner.value)
    return owners


def attribute_held(owners: list[str]) -> list[str]:
    """Owners that are an object's attributes (``self.model.parameters()``): not a model variable."""
    return [o for o in owners if o in ("self", "cls")]
