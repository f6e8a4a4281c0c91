"""Legacy ``paddle.fluid`` 1.x static-graph scripts: the seed's four-step Fleet conversion."""

from __future__ import annotations

import dataclasses

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule
from .fluid_data import chosen_on_a_condition, first_trainer_only, split_readers
from .static_common import (
    CPU_PLACES,
    CUDA_PLACES,
    argument,
    executor_runs,
    free_name,
    leading_imports,
    minimize_calls,
    names_used,
    program_kind,
    simple_assignments,
)

FLEET_IMPORTS = (
    "from paddle.fluid.incubate.fleet.collective import fleet, DistributedStrategy\n",
    "from paddle.fluid.incubate.fleet.base import role_maker\n",
)
SELECTED_GPU = 'int(os.getenv("FLAGS_selected_gpus", "0"))'
_BUILD_STRATEGIES = frozenset({"paddle.fluid.BuildStrategy", "paddle.fluid.compiler.BuildStrategy"})
_EXEC_STRATEGIES = frozenset({"paddle.fluid.ExecutionStrategy", "paddle.fluid.compiler.ExecutionStrategy"})
_SAVES = {"paddle.fluid.io.save_persistables": "save_persistables",
          "paddle.fluid.io.save_inference_model": "save_inference_model"}
REMOVED = ("paddle.fluid was removed in Paddle 2.6: this output uses fluid's incubate Fleet API, as the seed's "
           "train_with_fleet.py does, and runs on the Paddle 1.x installations the script was written for "
           "(launch: python -m paddle.distributed.launch --selected_gpus=0,1,... train.py)")


class Declined(Exception):
    """The file cannot be converted safely: (node, message, fix)."""


@dataclasses.dataclass
class _Strategies:
    build: str | None = None  # the BuildStrategy variable, kept as the DistributedStrategy
    build_assign: cst.Assign | None = None
    execution: str | None = None  # the ExecutionStrategy variable, attached to it
    compiled: list[cst.Assign] = dataclasses.field(default_factory=list)  # `train_prog = CompiledProgram(...)...`


class FluidFleet(Rule):
    """Convert a single-card fluid 1.x static-graph script as the seed's ``train_with_fleet.py`` does.

    Why: Paddle's own four steps for fluid (seed 001): import Fleet and the role maker; define the
    strategy, the role and ``fleet.init(role)``; wrap the optimizer with
    ``fleet.distributed_optimizer(optimizer, strategy=...)`` and call its ``minimize`` with the startup
    program; save through ``fleet.save_persistables``. Each trainer takes its card from
    ``FLAGS_selected_gpus`` (set by ``paddle.distributed.launch``) and runs ``fleet.main_program``.
    The output uses Fleet directly, not ``dpmigrate.runtime``: the runtime is built on Paddle 2.x/3.x
    (``paddle.distributed.fleet``), which does not exist where fluid 1.x runs (and fluid was removed in
    Paddle 2.6), so the seed's own form is the one that runs on those installations.
    Example:  optimizer.minimize(cost)
           -> dist_strategy = DistributedStrategy()
              role = role_maker.PaddleCloudRoleMaker(is_collective=True)
              fleet.init(role)
              optimizer = fleet.distributed_optimizer(optimizer, strategy=dist_strategy)
              optimizer.minimize(cost, fluid.default_startup_program())
              train_prog = fleet.main_program
    Tuning knobs (the seed's tuning section) are kept: a ``fluid.BuildStrategy`` (``fuse_all_reduce_ops``,
    ``nccl_comm_num``, ``use_hierarchical_allreduce``...) becomes the ``DistributedStrategy`` (in fluid 1.x
    a DistributedStrategy is a BuildStrategy with Fleet's knobs added), the ``fluid.ExecutionStrategy``
    (``num_threads``, ``num_iteration_per_drop_scope``) becomes its ``exec_strategy``, and the
    ``CompiledProgram(...).with_data_parallel(...)`` they configured becomes ``fleet.main_program``
    (Fleet compiles the program with them); a fetch frequency in the loop is left as it is.
    Leaves alone (declined, file unchanged): fluid dygraph, several optimizers, a strategy set up
    after ``minimize`` (Fleet reads it inside ``minimize``), ``with_data_parallel(places=...)``.
    """

    name = "fluid-fleet"
    generations = ("fluid",)

    def finish(self) -> None:
        try:
            self._convert()
        except Declined as declined:
            node, message, fix = declined.args
            self.report(node, "declined", message, fix)

    # --- decisions ------------------------------------------------------------------------------------

    def _convert(self) -> None:
        q = self.q
        dygraph = next((c for c in q.findall(q.module, m.Call()) if q.callee_starts_with(c, "paddle.fluid.dygraph")), None)
        if dygraph is not None:
            raise Declined(dygraph, "fluid dygraph (paddle.fluid.dygraph) training is not converted to Fleet",
                           "port it to Paddle 2.x dygraph (paddle.nn.Layer, paddle.optimizer) and convert that with "
                           "dpmigrate; fluid dygraph's own multi-card path was prepare_context + DataParallel")
        minimizes = list(minimize_calls(q))
        if not minimizes:
            return  # builds no training program: a module of networks or helpers
        if len(minimizes) > 1:
            raise Declined(minimizes[1][0], *_several_minimizes(self, minimizes))
        call, owner, _ = minimizes[0]
        statement = q.statement_of(call)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and m.matches(statement.body[0], m.Expr() | m.Assign()) and statement.body[0].value is call):
            raise Declined(call, "minimize is called inside a larger statement", "call it on a line of its own")
        self.fluid = self._fluid_alias()
        imports = leading_imports(self.ctx.module)
        if not imports:
            raise Declined(call, "no imports at the top of the file to add Fleet's after", "import paddle.fluid at the top")
        strategies = self._strategies(statement)
        used = names_used(q)
        for imported in ("fleet", "role_maker", "DistributedStrategy"):
            if imported in used:
                raise Declined(call, f"the file already uses the name {imported!r}, which Fleet's import would take",
                               f"rename the script's {imported!r}")
        self._edit(call, owner, statement, strategies, imports, used)

    def _fluid_alias(self) -> str:
        for statement in self.ctx.module.body:
            if m.matches(statement, m.SimpleStatementLine(body=[m.Import()])):
                for alias in statement.body[0].names:
                    if self.code(alias.name) == "paddle.fluid":
                        return alias.asname.name.value if alias.asname else "paddle.fluid"
            if m.matches(statement, m.SimpleStatementLine(body=[m.ImportFrom()])):
                node = statement.body[0]
                if node.module is not None and self.code(node.module) == "paddle" and not isinstance(node.names, cst.ImportStar):
                    for alias in node.names:
                        if self.code(alias.name) == "fluid":
                            return alias.asname.name.value if alias.asname else "fluid"
        return "paddle.fluid"

    def _strategies(self, minimize: cst.SimpleStatementLine) -> _Strategies:
        """The BuildStrategy / ExecutionStrategy a ``CompiledProgram`` of the main program was given."""
        q, found = self.q, _Strategies()
        assigned = simple_assignments(q)
        for run in executor_runs(q):
            program = argument(run, 0, "program")
            if program is None or program_kind(q, program.value, assigned) != "compiled":
                continue
            [compiled] = assigned[program.value.value]
            if compiled not in found.compiled:
                found.compiled.append(compiled)
            for call in q.findall(compiled.value, m.Call()):
                if argument(call, 99, "places") is not None:
                    raise Declined(call, "with_data_parallel(places=...) picks the cards itself",
                                   "drop places=: under Fleet each trainer runs on its own card (FLAGS_selected_gpus)")
                for keyword, classes, slot in (("build_strategy", _BUILD_STRATEGIES, "build"),
                                               ("exec_strategy", _EXEC_STRATEGIES, "execution")):
                    arg = argument(call, 99, keyword)
                    if arg is not None:
                        setattr(found, slot, self._strategy_before(arg.value, classes, minimize, assigned, found))
        return found

    def _strategy_before(self, value, classes, minimize, assigned, found: _Strategies) -> str:
        """The strategy's variable, once every statement setting it up runs before ``minimize``."""
        fix = ("move its construction and settings before optimizer.minimize(...): Fleet compiles the program "
               "inside minimize, with the DistributedStrategy as it is then")
        if not isinstance(value, cst.Name) or len(assigned.get(value.value, [])) != 1 \
                or not self.q.is_call_to(assigned[value.value][0].value, classes):
            raise Declined(value, f"{self.code(value)} is not one strategy built once with {sorted(classes)[0]}()", fix)
        name, assign = value.value, assigned[value.value][0]
        block = self.q.block_of(minimize)
        body = list(block.body) if block is not None else []
        settings = [self.q.statement_of(a) for a in self.q.findall(self.ctx.module, m.AssignTarget(
            target=m.Attribute(value=m.Name(name))))]
        for setting in [self.q.statement_of(assign), *settings]:
            if setting not in body or body.index(setting) > body.index(minimize):
                raise Declined(setting or assign, f"{name} is set up after optimizer.minimize (or elsewhere)", fix)
        if classes is _BUILD_STRATEGIES:
            found.build_assign = assign
        return name

    # --- edits ----------------------------------------------------------------------------------------

    def _edit(self, call, owner, minimize, strategies: _Strategies, imports, used) -> None:
        plan, fluid = self.ctx.plan, self.fluid
        strategy = strategies.build or free_name(used, "dist_strategy", "fleet_strategy")
        role = free_name(used, "role", "fleet_role")
        block: list[cst.BaseStatement] = []
        if strategies.build_assign is not None:
            plan.replace(strategies.build_assign.value, lambda _: cst.parse_expression("DistributedStrategy()"))
            self.report(strategies.build_assign, "change", f"{strategies.build} = BuildStrategy() -> DistributedStrategy(): "
                        "its settings (fuse_all_reduce_ops, nccl_comm_num...) are now Fleet's strategy")
        else:
            block.append(self._statement(f"{strategy} = DistributedStrategy()\n"))
        block += [self._statement(f"{role} = role_maker.PaddleCloudRoleMaker(is_collective=True)\n"),
                  self._statement(f"fleet.init({role})\n")]
        if strategies.execution is not None:
            block.append(self._statement(f"{strategy}.exec_strategy = {strategies.execution}\n"))
        wrap = f"fleet.distributed_optimizer({{}}, strategy={strategy})"
        if isinstance(owner, cst.Name):
            block.append(self._statement(f"{owner.value} = {wrap.format(owner.value)}\n", blank=True))
        else:
            plan.replace(owner, lambda updated: cst.parse_expression(wrap.format(self.ctx.module.code_for_node(updated))))
        plan.insert_before(minimize, *block)
        self.report(call, "change", f"fleet.init(role) with a DistributedStrategy, and {self.code(owner)} -> "
                    "fleet.distributed_optimizer(..., strategy=...): its minimize adds the gradient all-reduce")
        if argument(call, 1, "startup_program") is None:
            startup = cst.Arg(cst.parse_expression(f"{fluid}.default_startup_program()"))
            if any(a.keyword is not None for a in call.args):  # minimize(loss=cost): no positional after it
                startup = startup.with_changes(keyword=cst.Name("startup_program"), equal=_NO_SPACES)
            plan.replace(call, lambda updated: updated.with_changes(args=[*_with_comma(updated.args), startup]))
            self.report(call, "change", "minimize(..., default_startup_program()): Fleet adds the trainers' "
                        "communicator set-up to the startup program")
        train = self._programs(minimize, strategies, used)
        if train is not None:
            plan.insert_after(minimize, self._statement(f"{train} = fleet.main_program\n", blank=True))
        needs_os = self._places()
        needs_os = split_readers(self, fluid) or needs_os
        self._saves()
        new_imports = [*(["import os\n"] if needs_os and not self._imports_os() else []), *FLEET_IMPORTS]
        plan.insert_after(imports[-1], *(self._statement(code) for code in new_imports))
        self.report(imports[0], "note", REMOVED)

    def _programs(self, minimize, strategies: _Strategies, used) -> str | None:
        """Runs of the main program run ``fleet.main_program``; returns the variable to bind it to, if any."""
        q, plan = self.q, self.ctx.plan
        for compiled in strategies.compiled:
            plan.replace(compiled.value, lambda _: cst.parse_expression("fleet.main_program"))
            self.report(compiled, "change", "the compiled program -> fleet.main_program (Fleet compiled it in minimize, "
                        "with the strategy's build and execution settings)")
        assigned = simple_assignments(q)
        runs = [r for r in executor_runs(q) if program_kind(q, _program(r), assigned) == "main"]
        if not runs:
            return None
        scope = q.function_of(minimize)
        same_scope = all(q.function_of(r) is scope for r in runs)
        train = free_name(used, "train_prog", "fleet_train_prog") if same_scope else None
        program = train or "fleet.main_program"
        for run in runs:
            given = argument(run, 0, "program")
            if given is None:
                new = cst.Arg(cst.parse_expression(program), keyword=cst.Name("program"), equal=_NO_SPACES)
                plan.replace(run, lambda updated, new=new: updated.with_changes(args=[new.with_changes(
                    comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *updated.args]))
            else:
                plan.replace(given.value, lambda _, p=program: cst.parse_expression(p))
            self.report(run, "change", f"exe.run(program={program}): the program Fleet made, with the all-reduce")
        return train

    def _places(self) -> bool:
        """Every place becomes this trainer's card (FLAGS_selected_gpus); True when ``os`` is needed."""
        q, plan = self.q, self.ctx.plan
        changed = False
        assigned_gpu = False
        for place in q.findall(q.module, m.Call()):
            if not q.is_call_to(place, CUDA_PLACES | CPU_PLACES):
                continue
            if q.is_call_to(place, CPU_PLACES) and chosen_on_a_condition(q, place):
                self.report(place, "note", "the CPU branch of this device choice is kept: a CPU run stays on the CPU "
                            "(fluid's collective Fleet trains on GPUs, one per trainer: launch with --selected_gpus)")
                continue
            statement = q.statement_of(place)
            plain = m.matches(statement, m.SimpleStatementLine(body=[m.Assign()])) and statement.body[0].value is place
            if plain and not assigned_gpu:
                gpu = free_name(q.names_in(q.module), "gpu_id", "fleet_gpu_id")
                plan.insert_before(statement, self._statement(f"{gpu} = {SELECTED_GPU}\n"))
                card, assigned_gpu = gpu, True
            else:
                card = SELECTED_GPU
            plan.replace(place, lambda _, card=card: cst.parse_expression(f"{self.fluid}.CUDAPlace({card})"))
            kind = "CPUPlace" if q.is_call_to(place, CPU_PLACES) else "CUDAPlace"
            self.report(place, "change", f"{kind} -> CUDAPlace of this trainer's card (FLAGS_selected_gpus, set by "
                        "paddle.distributed.launch): fluid's collective Fleet trains on GPUs, one per trainer")
            changed = True
        return changed

    def _saves(self) -> None:
        q, plan = self.q, self.ctx.plan
        for call in q.findall(q.module, m.Call()):
            names = q.qualified_names(call.func) & _SAVES.keys()
            if not names:
                continue
            method = _SAVES[min(names)]
            if method == "save_inference_model":
                positional = [a for a in call.args if a.keyword is None and not a.star]
                if len(positional) < 4 or len(call.args) != len(positional):
                    self.report(call, "declined", "fluid.io.save_inference_model with keyword arguments: Fleet's "
                                "takes the executor first", "call fleet.save_inference_model(exe, dirname, "
                                "feeded_var_names, target_vars) (every trainer writes; guard with "
                                "fleet.worker_index() == 0)")
                    continue
                plan.replace(call, lambda updated: updated.with_changes(
                    func=cst.parse_expression("fleet.save_inference_model"),
                    args=_arguments([updated.args[3], *updated.args[:3], *updated.args[4:]])))
            else:
                plan.replace(call.func, lambda _, name=method: cst.parse_expression(f"fleet.{name}"))
            self.report(call, "change", f"fluid.io.{method} -> fleet.{method}: saves the trained program's "
                        "parameters (fleet's original program, not the transpiled one)")
            first_trainer_only(self, call, method)

    def _imports_os(self) -> bool:
        return any(self.code(a.name) == "os" and a.asname is None
                   for i in self.q.findall(self.ctx.module, m.Import()) for a in i.names)

    def _statement(self, code: str, *, blank: bool = False) -> cst.BaseStatement:
        statement = cst.parse_statement(code, config=self.ctx.config())
        return statement.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) if blank else statement


_NO_SPACES = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def _program(run: cst.Call) -> cst.BaseExpression | None:
    given = argument(run, 0, "program")
    return given.value if given is not None else None


def _arguments(args) -> list[cst.Arg]:
    """``args`` in a new order: ", " after each but the last, which has none."""
    last = len(args) - 1
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT if i == last else cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" "))) for i, a in enumerate(args)]


def _with_comma(args) -> list[cst.Arg]:
    """``args`` with a ", " after each one, ready for one more argument."""
    return [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) if a.comma is cst.MaybeSentinel.DEFAULT
            else a for a in args]


def _several_minimizes(rule, minimizes) -> tuple[str, str]:
    """(message, fix) for a file that calls ``minimize`` more than once (a GAN: one loss per program)."""
    owners = {rule.code(owner) for _, owner, _ in minimizes}
    assigned = simple_assignments(rule.q)
    programs = [rule.code(a.value) for run in executor_runs(rule.q) if (a := argument(run, 0, "program")) is not None
                and program_kind(rule.q, a.value, assigned) != "startup"]
    runs = f" ({', '.join(dict.fromkeys(programs))} are run)" if programs else ""
    if len(owners) == 1:
        message = (f"{owners.pop()} minimizes {len(minimizes)} losses, one per program{runs}: the four-step conversion "
                   "handles one program")
    else:
        message = f"{len(owners)} optimizers call minimize{runs}: the four-step conversion handles one program"
    fix = ("after one fleet.init(role), wrap each optimizer once: opt = fleet.distributed_optimizer(opt, "
           "strategy=dist_strategy), call each minimize(loss, startup_program) under the program_guard of the "
           "program it trains (Fleet adds that program's gradient all-reduce there), and keep running each program "
           "with exe.run(program=<that program>): fleet.main_program is only the last one minimized")
    return message, fix
