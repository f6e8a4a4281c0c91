"""Random data drawn once, before training, with no seed: different on every rank unless shared."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule
from .main_process_output import _opens_for_writing

PYTHON_DRAWS = frozenset(f"random.{n}" for n in (
    "random", "randint", "randrange", "uniform", "gauss", "normalvariate", "lognormvariate", "choice", "choices",
    "sample", "shuffle", "betavariate", "expovariate", "gammavariate", "triangular", "vonmisesvariate",
    "paretovariate", "weibullvariate", "getrandbits"))
NUMPY_DRAWS = frozenset(f"numpy.random.{n}" for n in (
    "rand", "randn", "random", "random_sample", "ranf", "sample", "randint", "random_integers", "uniform", "normal",
    "standard_normal", "choice", "permutation", "shuffle", "binomial", "poisson", "beta", "gamma", "exponential",
    "multivariate_normal", "dirichlet", "laplace", "logistic", "lognormal", "multinomial", "geometric", "bytes"))
_SEEDS = {"random.seed": "python", "numpy.random.seed": "numpy"}
_LOOPS = (cst.For, cst.While)
_OWN_GENERATOR = ("generator", "seed", "random_state", "rng", "key")
_IN_PLACE = {"numpy.random.shuffle", "random.shuffle"}


class SharedRandomData(Rule):
    """Broadcast rank 0's copy of random data a script draws once, before training, without a seed.

    Why: the original draws it once, in one process. Launched on N processes, each rank draws its
    own: a synthetic dataset, a random target function or a random train/test split then differs
    from rank to rank, the shards are not parts of one dataset, and averaged gradients pull toward
    an average of N different problems. ``dp.broadcast`` gives every rank rank 0's draw; on one
    process it returns the value itself. Draws of Python's ``random``, NumPy's global generator and the
    framework's own (the vocabulary's ``random_draws``) count, each unless its own generator is seeded
    somewhere in the file.
    Example:  W_target = torch.randn(4, 1) * 5  ->  W_target = dp.broadcast(torch.randn(4, 1) * 5)
              x = np.random.random((2048, 100)).astype("float32")  ->  x = dp.broadcast(np.random.random(...)...)
              train_rows = make_rows(800)  (a helper looping random.randint)  ->  train_rows = dp.broadcast(make_rows(800))
              rows = []; for i in range(n): rows.append(random.random())  ->  ... then rows = dp.broadcast(rows)
    Also a data set class's ``__init__`` drawing its samples (``self.x = torch.randn(n, 8)``), a random split
    (``random_split(full, [500, 100])``) and an in-place shuffle of indices (``np.random.shuffle(order)``, then
    ``order = dp.broadcast(order)``). In a local module a converted script imports (``datautils.py`` with
    ``MyTrainDataset``), only its data sets' constructors, unless the script seeds that generator first.
    Leaves alone: draws after a seed of their generator (every rank then draws the same), draws a training loop
    makes or calls (fresh data per step is what data parallelism splits), draws inside other classes (model
    initialisation, which the framework broadcasts), draws inside a ``with open(..., "w")`` block (its file
    is written by the main process only), and values that are not data (a loader built around a draw).
    """

    name = "shared-random-data"
    about_training = False

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._calls: dict[str, list[cst.Call]] | None = None
        self._in_loop: dict[str, bool] = {}
        self._draws: dict[str, bool] = {}
        self._done: set[int] = set()

    def finish(self) -> None:
        helper = self.ctx.options.importer_seeds  # a local module of a training script: its data sets only
        if not self.q.is_training_script() and helper is None:
            return
        calls = list(self.q.index.of_type(self.ctx.module, cst.Call))  # in source order
        seeds = [(i, family, self.q.function_of(c)) for i, c in enumerate(calls) for family in self._families_seeded(c)]
        for i, call in enumerate(calls):
            family = self._family(call)
            if family is None or self._seeded_before(i, family, self.q.function_of(call), seeds):
                continue
            function = self.q.function_of(call)
            if helper is not None and (family in helper or function is None or self._dataset_of(function) is None):
                continue  # the script seeds it before building the data set, or not a data set's constructor
            if self._drawn_once(call):
                self._share(call)

    # --- what is a draw ---------------------------------------------------------------------------

    def _families_seeded(self, call: cst.Call) -> set[str]:
        names = self.q.index.qualified_names_among(call.func, {*_SEEDS, *self._framework_seeds(),
                                                               *self.vocabulary.random_seeds_all})
        found = {_SEEDS[n] for n in names if n in _SEEDS}
        if names & set(self._framework_seeds()):
            found.add("framework")
        if names & self.vocabulary.random_seeds_all:
            found |= {"python", "numpy", "framework"}
        return found

    def _framework_seeds(self) -> frozenset[str]:
        return self.vocabulary.random_seeds

    def _family(self, call: cst.Call) -> str | None:
        """Which global generator ``call`` draws from (a draw given its own ``generator=``/``seed=`` is seeded)."""
        if any(a.keyword is not None and a.keyword.value in _OWN_GENERATOR for a in call.args):
            return None
        names = self.q.index.qualified_names_among(call.func, PYTHON_DRAWS | NUMPY_DRAWS | self.vocabulary.random_draws)
        if names & PYTHON_DRAWS:
            return "python"
        if names & NUMPY_DRAWS:
            return "numpy"
        return "framework" if names else None

    @staticmethod
    def _seeded_before(index: int, family: str, function, seeds) -> bool:
        """A seed of the draw's generator runs before it: earlier in the same function (or at module level for a
        module-level draw), or anywhere else for a draw in a function (called once the script has seeded)."""
        return any(f == family and (i < index if scope is function else function is not None)
                   for i, f, scope in seeds)

    def _drawn_once(self, call: cst.Call) -> bool:
        """Not in a class, a lambda or a file-writing block; its function not called by a loop."""
        for ancestor in self.q.ancestors(call):
            if isinstance(ancestor, cst.ClassDef) and not self._in_dataset_init(call, ancestor):
                return False
            if isinstance(ancestor, cst.Lambda):
                return False
            if isinstance(ancestor, cst.With) and any(
                    isinstance(i.item, cst.Call) and _opens_for_writing(self.q, i.item) for i in ancestor.items):
                return False
        function = self.q.function_of(call)
        if function is None:
            return True
        name = function.name.value
        if self._dataset_of(function) is not None:
            return True  # a data set's constructor: built once, before training
        return name in self.q.module_functions() and not self._called_in_a_loop(name)

    def _dataset_of(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        """The data set class whose ``__init__`` ``function`` is (``class Noise(Dataset)``: its samples drawn there),
        or whose method only ``__init__`` calls (``self.rows = self.parse(path)``, a static ``parse`` shuffling the
        list: the cats-and-dogs reader of paddle-workbook, each rank in its own order)."""
        owner = self.q.parent(self.q.parent(function))
        if not isinstance(owner, cst.ClassDef):
            return None
        bases = [self.code(b.value).rsplit(".", 1)[-1] for b in owner.bases]
        if not any(b in ("Dataset", "IterableDataset", "TensorDataset") for b in bases):
            return None
        if function.name.value == "__init__":
            return owner
        callers = {self.q.function_of(c) for c in self.q.index.of_type(self.ctx.module, cst.Call)
                   if isinstance(c.func, cst.Attribute) and c.func.attr.value == function.name.value
                   and m.matches(c.func.value, m.Name("self") | m.Name(owner.name.value))}
        return owner if callers and all(f is not None and f.name.value == "__init__" for f in callers) else None

    def _in_dataset_init(self, call: cst.Call, cls: cst.ClassDef) -> bool:
        function = self.q.function_of(call)
        return function is not None and self._dataset_of(function) is cls

    # --- where the draw becomes data ---------------------------------------------------------------

    def _share(self, call: cst.Call) -> None:
        function = self.q.function_of(call)
        loop = next((a for a in self.q.ancestors(call) if isinstance(a, _LOOPS)), None)
        if loop is None and self._shuffled_in_place(call):
            return
        if loop is None:
            assign = self._assignment_of(call)
            if assign is not None and self._is_data(assign.value, call):
                self._broadcast_value(assign, call)
                return
        elif function is None and not self.q.trains(loop) and self._broadcast_after(self._outermost_loop(loop), call):
            return
        if function is not None and not self.q.trains(function) and not self._builds_loaders(function):
            self._share_results_of(function.name.value, call)

    def _shuffled_in_place(self, call: cst.Call) -> bool:
        """``np.random.shuffle(order)`` as a statement of its own: ``order = dp.broadcast(order)`` after it (a random
        split made by shuffling indices is rank 0's on every rank)."""
        statement = self.q.statement_of(call)
        first = call.args[0].value if call.args else None
        if not (self.q.is_call_to(call, _IN_PLACE) and isinstance(first, cst.Name)
                and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call):
            return False
        if id(statement) not in self._done:
            self._done.add(id(statement))
            self.ctx.plan.insert_after(statement, self.statement(f"{first.value} = {{dp}}.broadcast({first.value})\n"))
            self.report(call, "change", f"`{first.value}` is shuffled at random once, with no seed: dp.broadcast after it "
                        "gives every rank rank 0's order, as the single process had one")
        return True

    def _assignment_of(self, call: cst.Call) -> cst.Assign | None:
        statement = self.q.statement_of(call)
        if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
                and isinstance(statement.body[0].targets[0].target, (cst.Name, cst.Tuple, cst.Attribute))):
            return statement.body[0]
        return None

    def _is_data(self, value: cst.BaseExpression, call: cst.Call) -> bool:
        """The value is the draw, arithmetic or methods around it, a comprehension of draws, or a call of the
        array libraries and builtins on it; never an object such as a loader or a model built around it."""
        if value is call or _wraps(value, call) or isinstance(value, (cst.ListComp, cst.DictComp, cst.SetComp)):
            return True
        vocabulary = self.vocabulary
        packages = ("numpy", "builtins", *vocabulary.tensor_packages)
        for inner in self.q.index.of_type(value, cst.Call):
            if inner is call or self._family(inner):
                continue
            if self.q.is_call_to(inner, vocabulary.data_loaders) or any(
                    self.q.callee_starts_with(inner, p + ".") or self.q.is_call_to(inner, {p})
                    for p in vocabulary.object_prefixes):
                return False  # a model, layer, dataset, loader or optimizer: not data to send
            if isinstance(inner.func, cst.Attribute) and not isinstance(inner.func.value, cst.Name):
                continue  # a method of a value built here (.astype, .reshape)
            if not any(self.q.named_under(inner.func, p) for p in packages) and not _is_local_data_helper(
                    self.q, inner):
                return False
        return True

    def _broadcast_value(self, assign: cst.Assign, call: cst.Call) -> None:
        if id(assign) in self._done or self._becomes_a_seed(assign):
            return
        self._done.add(id(assign))
        self.ctx.plan.replace(assign.value, lambda updated: self.dp_call("broadcast", updated))
        self.report(call, "change", f"`{self.code(assign.targets[0].target)}` is drawn at random once, with no seed: "
                    "dp.broadcast gives every rank rank 0's draw, as the single process had one")

    def _becomes_a_seed(self, assign: cst.Assign) -> bool:
        """``seed = ... random.randrange(...)`` handed to a seed call: a seed of its own per rank, not data (the
        framework broadcasts the model; per-rank noise is what data parallelism wants)."""
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            return False
        scope = self.q.function_of(assign) or self.ctx.module
        seeds = {*_SEEDS, *self.vocabulary.random_seeds, *self.vocabulary.random_seeds_all}
        return any(self.q.is_call_to(c, seeds) and any(isinstance(a.value, cst.Name) and a.value.value == target.value
                                                        for a in c.args)
                   for c in self.q.index.of_type(scope, cst.Call))

    def _outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        outer = loop
        for ancestor in self.q.ancestors(loop):
            if isinstance(ancestor, _LOOPS):
                outer = ancestor
        return outer

    def _broadcast_after(self, loop: cst.CSTNode, call: cst.Call) -> bool:
        """A module-level loop that fills a list with draws: the list is broadcast once it is filled."""
        if id(loop) in self._done or self.q.parent(loop) is not self.ctx.module:
            return id(loop) in self._done
        filled = _filled_names(loop)
        if not filled:
            return False
        self._done.add(id(loop))
        self.ctx.plan.insert_after(loop, *(self.statement(f"{n} = {{dp}}.broadcast({n})\n") for n in filled))
        self.report(call, "change", f"{', '.join(f'`{n}`' for n in filled)} filled with random draws once, with no "
                    "seed: dp.broadcast after the loop gives every rank rank 0's draws, as the single process had one")
        return True

    def _share_results_of(self, helper: str, call: cst.Call) -> None:
        """``rows = make_rows(800)``: a helper drawing data once per call; each call's result is broadcast."""
        for site in self._call_sites().get(helper, []):
            if self.q.function_of(site) is not None and self.q.function_of(site).name.value == helper:
                continue  # recursion
            if any(isinstance(a, (*_LOOPS, cst.ClassDef, cst.Lambda)) for a in self.q.ancestors(site)):
                continue
            assign = self._assignment_of(site)
            if assign is not None and self._is_data(assign.value, site):
                self._broadcast_value(assign, site)

    def _builds_loaders(self, function: cst.FunctionDef) -> bool:
        return any(self.q.is_call_to(c, self.vocabulary.data_loaders) for c in self.q.index.of_type(function, cst.Call))

    def _call_sites(self) -> dict[str, list[cst.Call]]:
        if self._calls is None:
            self._calls = {}
            for c in self.q.index.of_type(self.ctx.module, cst.Call):
                if isinstance(c.func, cst.Name):
                    self._calls.setdefault(c.func.value, []).append(c)
        return self._calls

    def _called_in_a_loop(self, function: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a loop calls ``function``, directly or through other functions of the file."""
        if function not in self._in_loop:
            self._in_loop[function] = any(_in_loop(self.q, c) or (
                (caller := self.q.function_of(c)) is not None and caller.name.value not in seen | {function}
                and self._called_in_a_loop(caller.name.value, seen | {function}))
                for c in self._call_sites().get(function, []))
        return self._in_loop[function]


def _in_loop(q, node: cst.CSTNode) -> bool:
    return any(isinstance(a, _LOOPS) for a in q.ancestors(node))


def _is_local_data_helper(q, call: cst.Call) -> bool:
    """A call of the file's own function (its result is what it returns: data, when it draws data)."""
    return isinstance(call.func, cst.Name) and call.func.value in q.module_functions()


def _filled_names(loop: cst.CSTNode) -> list[str]:
    """Names a loop fills: ``rows.append(...)``, ``rows.extend(...)``, ``rows[i] = ...``."""
    names: list[str] = []

    class Filled(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if (isinstance(func, cst.Attribute) and func.attr.value in ("append", "extend")
                    and isinstance(func.value, cst.Name) and func.value.value not in names):
                names.append(func.value.value)

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            target = node.target
            if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and target.value.value not in names:
                names.append(target.value.value)

    loop.visit(Filled())
    return names


def _wraps(value: cst.BaseExpression, call: cst.Call) -> bool:
    """``torch.randn(4, 1) * 5`` or ``torch.randn(4).to(device)``: arithmetic or methods around one draw."""
    node = value
    while True:
        if node is call:
            return True
        if isinstance(node, cst.BinaryOperation):
            node = node.left if not isinstance(node.left, (cst.Integer, cst.Float)) else node.right
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            node = node.func.value
        else:
            return False
