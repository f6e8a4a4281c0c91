"""What the Paddle dygraph rules share: the file's high-level-API models. (Which rules run on a file is decided
by its API generation, one mechanism for every framework: each rule's ``generations``.)

Analyses (``ctx.analysis(Kind)``), computed once per file from the original tree:

- :class:`HighLevelModels`: ``paddle.Model(network)`` objects and what their methods are handed.
  Under a launcher the high-level API distributes itself (measured with Paddle 3.3.1: ``prepare``
  wraps the network in ``DataParallel``; ``fit``/``evaluate`` on a Dataset shard it with
  ``batch_size`` per rank; a DataLoader handed to ``fit`` is read whole by every rank; ``save``
  writes on local rank 0 only, without waiting for the other ranks). So the network and the
  optimizer it is prepared with are not wrapped again, and the loaders it is given are the data
  rules' business.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from ...codemod.bindings import Bindings
from ...codemod.calls import argument
from ...codemod.flow import returned_at
from ...codemod.loaders import Loader, LoaderFlow, own_sampling, returned_directly
from ...codemod.query import Query, parameter_owners

HIGH_LEVEL_MODEL = {"paddle.Model", "paddle.hapi.Model", "paddle.hapi.model.Model"}


@dataclasses.dataclass
class HighLevelCall:
    """``model.fit(...)``: the method called on a ``paddle.Model`` and the call."""

    model: str
    method: str
    call: cst.Call


# (method, position, keyword) of the data arguments; the first entry of each method trains for ``fit``
TRAINING_DATA = {("fit", 0, "train_data")}
EVALUATION_DATA = {("fit", 1, "eval_data"), ("evaluate", 0, "eval_data"), ("predict", 0, "test_data")}
GATHERED_EVALUATION = {("fit", 1, "eval_data"), ("evaluate", 0, "eval_data")}  # metrics gathered over the ranks
PREDICTION = {("predict", 0, "test_data")}


class HighLevelModels:
    """The file's ``paddle.Model(...)`` objects: their names, networks, method calls and optimizers."""

    def __init__(self, ctx) -> None:
        q: Query = ctx.query
        self.q = q
        self.ctx = ctx
        self.constructions: list[cst.Call] = []
        self.names: set[str] = set()  # variables that hold a paddle.Model somewhere (see holds() for a given point)
        self.networks: set[str] = set()  # variables handed to paddle.Model(...)
        self.calls: list[HighLevelCall] = []
        self._bindings: set[int] = set()  # ids of the statements binding a paddle.Model to a name
        self._network_bindings: set[int] = set()  # ids of the statements binding a network a paddle.Model is given
        if not q.index.possible(HIGH_LEVEL_MODEL):
            return
        for call in q.index.of_type(ctx.module, cst.Call):
            if not q.is_call_to(call, HIGH_LEVEL_MODEL):
                continue
            self.constructions.append(call)
            network = argument(call, 0, "network")
            if network is not None and isinstance(network.value, cst.Name):
                self.networks.add(network.value.value)
                bound = ctx.analysis(Bindings).reaching(call, network.value.value)
                if bound is not None:
                    self._network_bindings.add(id(bound))
            self._bind_result(call)
        self._bind_factory_results(ctx)
        for call in q.index.of_type(ctx.module, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in self.names:
                if self.holds(call, func.value.value, networks=False):
                    self.calls.append(HighLevelCall(func.value.value, func.attr.value, call))

    def _bind_factory_results(self, ctx) -> None:
        """``model = make_model()`` where the file's ``make_model`` returns a ``paddle.Model`` (built in its return,
        or bound there first) holds one too: taken for a Layer, it was wrapped by dp.distributed_model and every
        rank failed (``TypeError ... got Model``; NLPProject's emb_softmax, issue 19 audit)."""
        q = self.q
        factories = set()
        for name, function in q.module_functions().items():
            for ret in q.index.of_type(function, cst.Return):
                if q.function_of(ret) is not function or ret.value is None:
                    continue
                value = ret.value
                if q.is_call_to(value, HIGH_LEVEL_MODEL) or (isinstance(value, cst.Name) and value.value in self.names and any(
                        id(b) in self._bindings for b in ctx.analysis(Bindings).reachings(ret, value.value) or ())):
                    factories.add(name)
        if not factories:
            return
        for call in q.index.of_type(ctx.module, cst.Call):
            if isinstance(call.func, cst.Name) and call.func.value in factories:
                self._bind_result(call)

    def _bind_result(self, call: cst.Call) -> None:
        """``model = call`` holds a ``paddle.Model``: its name, and the statement binding it."""
        statement = self.q.statement_of(call)
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and small.value is call:
                for target in small.targets:
                    if isinstance(target.target, cst.Name):
                        self.names.add(target.target.value)
                        self._bindings.add(id(statement))

    def holds(self, node: cst.CSTNode, name: str, *, networks: bool = True) -> bool:
        """``name`` read at ``node`` is a ``paddle.Model`` (or, with ``networks``, a network given to one).

        Followed by binding (the same name may hold a plain Layer elsewhere); where the binding cannot be
        told, by name, as before."""
        if name not in self.names and not (networks and name in self.networks):
            return False
        bound = self.ctx.analysis(Bindings).reachings(node, name)
        if bound is None:
            return True
        return any(id(b) in self._bindings or (networks and id(b) in self._network_bindings) for b in bound)

    def of(self, method: str) -> list[HighLevelCall]:
        return [c for c in self.calls if c.method == method]

    def prepared_optimizers(self) -> tuple[set[str], set[int]]:
        """Names of the optimizers handed to ``model.prepare(optimizer, ...)``, and the ids of the statements
        binding them there (empty where that cannot be told)."""
        names, bindings = set(), set()
        for found in self.of("prepare"):
            arg = argument(found.call, 0, "optimizer")
            if arg is not None and isinstance(arg.value, cst.Name):
                names.add(arg.value.value)
                bound = self.ctx.analysis(Bindings).reaching(found.call, arg.value.value)
                if bound is not None:
                    bindings.add(id(bound))
        return names, bindings

    def prepares(self, optimizer: cst.Call) -> bool:
        """The optimizer built by ``optimizer`` belongs to a high-level model (the API averages its gradients)."""
        if any(self.holds(optimizer, owner, networks=False) for owner in parameter_owners(self.q, optimizer)) and (
                not self._stepped_by_hand(optimizer)):
            return True  # (over a network a paddle.Model holds, only when prepare() is given it: below)
        for ancestor in self.q.ancestors(optimizer):
            if isinstance(ancestor, cst.Call) and any(c.call is ancestor for c in self.of("prepare")):
                return True
        if self._made_for_prepare(optimizer):
            return True
        statement = self.q.statement_of(optimizer)
        names, bindings = self.prepared_optimizers()
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and any(
                isinstance(t.target, cst.Name) and t.target.value in names for t in small.targets
            ):
                return not bindings or id(statement) in bindings
        return False

    def _made_for_prepare(self, optimizer: cst.Call) -> bool:
        """Built by a module-level function that returns it (``return Momentum(...)``, or the name bound to it), whose
        result ``prepare`` gets: ``optimizer = make_optimizer(model.parameters()); model.prepare(optimizer, ...)``
        (a MobileViT trainer of round R: wrapped by dp.distributed_optimizer, while the note said the high-level API's
        optimizer is not wrapped again)."""
        q = self.q
        function = q.function_of(optimizer)
        if function is None or function not in q.module.body:
            return False
        statement = q.statement_of(optimizer)
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        names = [t.target.value for t in small.targets if isinstance(t.target, cst.Name)] if (
            isinstance(small, cst.Assign) and small.value is optimizer) else []
        if returned_directly(q, optimizer) != (function, -1) and not any(returned_at(q, function, n) == -1 for n in names):
            return False
        for found in self.of("prepare"):
            arg = argument(found.call, 0, "optimizer")
            value = arg.value if arg is not None else None
            if isinstance(value, cst.Name):
                value = self.ctx.analysis(Bindings).assigned_value(found.call, value.value)
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == function.name.value:
                return True
        return False

    def _stepped_by_hand(self, optimizer: cst.Call) -> bool:
        """``optim = Adam(parameters=model.parameters())``, never given to ``prepare``, whose ``optim.step()`` a
        plain loop calls (study notes training one LeNet six ways: the note said the high-level API averaged it,
        and each rank stepped on its own half-batch gradient)."""
        names = assigned_names(self.q, optimizer)
        if not names or names & self.prepared_optimizers()[0]:
            return False
        return bool(step_calls(self.q, optimizer, names))

    def becomes_model(self, statement: cst.CSTNode, name: str) -> bool:
        """``name`` holds a ``paddle.Model`` once ``statement`` has run: it binds one (``model = paddle.Model(model)``,
        the network's own name rebound to the high-level model over it), or one reaches it (``model.prepare(...)``)."""
        if name in self.q.assigned_names(statement):
            return id(statement) in self._bindings  # what it binds now decides, not what reached it
        return self.holds(statement, name, networks=False)

    def network_of(self, node: cst.CSTNode, name: str) -> str | None:
        """The variable of the network the ``paddle.Model`` bound to ``name`` (read at ``node``) was built over:
        ``model = paddle.Model(net)`` gives ``net``."""
        for bound in self.ctx.analysis(Bindings).reachings(node, name) or ():
            if id(bound) in self._bindings and isinstance(bound, cst.SimpleStatementLine):
                value = getattr(bound.body[0], "value", None)
                if isinstance(value, cst.Call) and self.q.is_call_to(value, HIGH_LEVEL_MODEL):
                    network = argument(value, 0, "network")
                    if network is not None and isinstance(network.value, cst.Name):
                        return network.value.value
        return None

    def trained_outside(self, optimizer: cst.Call, name: str) -> bool:
        """``optimizer`` trains ``name``, a network a ``paddle.Model`` holds, without being prepared with it:
        a plain loop after ``fit`` (the Paddle guide's train/eval/predict notebook) calls the raw Layer, which
        nothing averages."""
        return self.holds(optimizer, name) and not self.holds(optimizer, name, networks=False) \
            and not self.prepares(optimizer)

    def data_arguments(self, kinds: set[tuple[str, int, str]]) -> list[tuple[HighLevelCall, cst.Arg]]:
        found = []
        for call in self.calls:
            for method, position, keyword in kinds:
                if call.method == method:
                    arg = argument(call.call, position, keyword)
                    if arg is not None:
                        found.append((call, arg))
        return found

    def reads(self, loader: Loader, kinds: set[tuple[str, int, str]]) -> bool:
        """``loader`` (by its variable, or built inline) is handed to one of the methods in ``kinds``."""
        return any(self.is_argument(loader, arg.value) for _, arg in self.data_arguments(kinds))

    def is_argument(self, loader: Loader, value: cst.BaseExpression) -> bool:
        """``value``, an argument of a high-level call, is ``loader``: built inline, read by its variable, or
        returned by a local function."""
        if value is loader.call:
            return True
        if loader.name and isinstance(value, cst.Name) and value.value == loader.name:
            # the binding the argument reads is this loader's (a name rebound to another loader later,
            # ``test_loader = DataLoader(...)`` for evaluate, then again for predict, is two loaders)
            reaching = self.ctx.analysis(Bindings).reaching(value, loader.name)
            if reaching is None or reaching is self.q.statement_of(loader.call):
                return True
        return self._returned_by(loader, value)

    def _returned_by(self, loader: Loader, value: cst.BaseExpression) -> bool:
        """``value`` is what a module-level function returning ``loader`` alone gave: ``make_loader(...)`` inline,
        or a name bound to it (NLPProject's lstm: ``train_loader = loader(...)``, then ``fit(train_loader,
        eval_data=test_loader)``; the DataLoader read whole by fit was declined as one whose use it could not tell)."""
        q = self.q
        function = q.function_of(loader.call)
        if function is None or function not in q.module.body:
            return False
        if returned_directly(q, loader.call) != (function, -1) and not (
                loader.name and returned_at(q, function, loader.name) == -1):
            return False
        if isinstance(value, cst.Name):
            value = self.ctx.analysis(Bindings).assigned_value(value, value.value)
        return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == function.name.value


def assigned_names(q: Query, call: cst.Call) -> set[str]:
    """The plain names ``call`` is assigned to (``optim = Adam(...)``); empty for any other statement."""
    statement = q.statement_of(call)
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign) and statement.body[0].value is call):
        return set()
    return {t.target.value for t in statement.body[0].targets if isinstance(t.target, cst.Name)}


def step_calls(q: Query, optimizer: cst.Call, names: set[str]) -> list[cst.Call]:
    """``optim.step()`` / ``optim.minimize(loss)`` (the vocabulary's step methods) of any of ``names``, in the
    function that builds ``optimizer`` (or the module)."""
    scope = q.function_of(optimizer) or q.module
    return [c for c in q.index.of_type(scope, cst.Call)
            if isinstance(c.func, cst.Attribute) and c.func.attr.value in q.vocabulary.optimizer_step_methods
            and isinstance(c.func.value, cst.Name) and c.func.value.value in names]


def training_loaders(ctx) -> list[Loader]:
    """The loaders the dygraph rules shard for training: those a loop trains with, and those handed to a
    high-level model's ``fit`` as its training data (the API does not shard a DataLoader), even when a loop
    peeks at one of its batches first; not those with a ``batch_sampler=`` of their own (declined)."""
    high_level = ctx.analysis(HighLevelModels)
    return [
        loader for loader in ctx.analysis(LoaderFlow).loaders
        if (loader.role == "train" or high_level.reads(loader, TRAINING_DATA)) and not own_sampling(loader)
    ]


def evaluated_by_a_model(ctx, loader: Loader) -> bool:
    """A DataLoader a ``paddle.Model`` evaluates (``evaluate``, ``fit(eval_data=)``), to shard as it shards a
    Dataset: under a launcher it gathers the metrics of every rank and drops the padding of the
    ``DistributedBatchSampler`` it would have used, so a whole loader on every rank counts each sample N
    times (measured: "Eval samples: 688" for 400, accuracy 0.6349 for 0.6486); sharded the same way, the
    metrics are the original's. Only when the model has metrics (``prepare(..., metrics=)``): the loss it
    reports is each rank's own, exact over a whole loader. Not one ``predict`` reads too (it does not gather: it would return rank
    0's share), one trained on, or one a loop of the file evaluates (``paddle-evaluation-loader``) unless
    that loop only peeks at a batch (``break``)."""
    high_level = ctx.analysis(HighLevelModels)
    if loader.role == "train" or not high_level.reads(loader, GATHERED_EVALUATION) or own_sampling(loader):
        return False
    if not high_level.data_arguments({("prepare", 2, "metrics")}):
        return False  # no metric to gather: the loss it reports is this rank's, exact when the loader is whole
    if high_level.reads(loader, PREDICTION) or high_level.reads(loader, TRAINING_DATA):
        return False
    return all(ctx.query.index.of_type(loop.node, cst.Break) for loop in loader.loops)
