"""Paddle's retired multi-card APIs (ParallelDo, fluid dygraph's prepare_context + DataParallel): reported."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule
from .static_common import minimize_calls

_PARALLEL_DO = ("paddle.fluid.layers.ParallelDo", "paddle.fluid.layers.parallel_do",
                "paddle.fluid.layers.control_flow.ParallelDo")
_PREPARE_CONTEXT = ("paddle.fluid.dygraph.prepare_context", "paddle.fluid.dygraph.parallel.prepare_context")
_FLUID_DATA_PARALLEL = ("paddle.fluid.dygraph.DataParallel", "paddle.fluid.dygraph.parallel.DataParallel")
_PARALLEL_EXECUTOR = ("paddle.fluid.ParallelExecutor", "paddle.fluid.parallel_executor.ParallelExecutor")

# Files using these are written for (several cards') data parallelism by hand: detection leaves them
# byte-identical (the Paddle vocabulary's distributed_prefixes include these), and this rule says what
# replaced each one. fluid's incubate Fleet marks a file the seed's conversion already made.
LEGACY_DISTRIBUTED_PREFIXES = (
    *_PARALLEL_DO, *_PREPARE_CONTEXT, *_FLUID_DATA_PARALLEL, *_PARALLEL_EXECUTOR, "paddle.fluid.incubate.fleet",
)
LEGACY_DISTRIBUTED_DESCRIPTION = "fluid's ParallelDo / ParallelExecutor / dygraph DataParallel / incubate Fleet"

COMPILED = frozenset({"paddle.static.CompiledProgram", "paddle.fluid.CompiledProgram", "paddle.fluid.compiler.CompiledProgram",
                      "paddle.base.CompiledProgram", "paddle.static.compiler.CompiledProgram"})
_MODERN = ("one process per card, launched by python -m paddle.distributed.launch (or dpmigrate launch): start "
           "from the single-card script (build the network once, on the whole batch) and let dpmigrate convert "
           "it (Paddle 2.x/3.x static graph: dp.distributed_optimizer(optimizer).minimize(loss); dygraph: "
           "dp.distributed_model / fleet.distributed_model; fluid 1.x: the seed's fleet.distributed_optimizer)")
_MESSAGES = (
    (_PARALLEL_DO, "fluid.layers.ParallelDo splits each batch over the cards inside one process (pd.do(), "
     "read_input, write_output); Paddle removed it long ago (ParallelExecutor, then Fleet, replaced it) and "
     "dpmigrate does not rewrite it: left unchanged"),
    (_PARALLEL_EXECUTOR, "fluid.ParallelExecutor drives every card from one process; Paddle replaced it with "
     "CompiledProgram.with_data_parallel and then Fleet's one process per card: left unchanged"),
    (_PREPARE_CONTEXT, "fluid.dygraph.prepare_context() starts fluid 1.x dygraph's multi-card context; Paddle 2.x "
     "replaced it with paddle.distributed.init_parallel_env() (or fleet.init(is_collective=True)): left unchanged"),
    (_FLUID_DATA_PARALLEL, "fluid.dygraph.DataParallel(layer, strategy) needs loss = model.scale_loss(loss) and "
     "model.apply_collective_grads() around backward(); Paddle 2.x's paddle.DataParallel(layer) does both "
     "itself: left unchanged"),
)
_DYGRAPH_FIX = ("port it to Paddle 2.x dygraph: paddle.distributed.init_parallel_env() (or fleet.init(is_collective=True)) "
                "instead of prepare_context, paddle.DataParallel(model) instead of fluid.dygraph.DataParallel(model, "
                "strategy), and drop scale_loss/apply_collective_grads; or start from the single-card script and let "
                "dpmigrate convert it (dp.distributed_model)")


class LegacyParallel(Rule):
    """Report ``ParallelDo``/``parallel_do``, ``ParallelExecutor`` and fluid dygraph's ``prepare_context`` +
    ``DataParallel`` with what replaced them.

    Why: these are multi-card APIs Paddle retired (seed 002 uses ParallelDo). Rewriting them in place
    into today's API would need the author's network split undone (``pd.do()``'s block, ``read_input``,
    ``write_output``, ``scale_loss``...), so the file is left byte-identical and each site gets a
    declined finding with the modern replacement: one process per card.
    Example:  pd = fluid.layers.ParallelDo(places)  ->  (unchanged) declined: one process per card...
    ``CompiledProgram(...).with_data_parallel(...)`` (one process driving every card) is reported the same way,
    except in a fluid file ``fluid-fleet`` converts (it becomes ``fleet.main_program`` there).
    Runs on files left unchanged too (detection leaves these files alone as hand-distributed).
    Leaves alone: the whole file, always (this rule only reports).
    """

    name = "legacy-parallel"
    checks_only = True

    def finish(self) -> None:
        self._with_data_parallel()
        if not self.q.index.possible(LEGACY_DISTRIBUTED_PREFIXES):
            return
        for call in self.q.findall(self.ctx.module, m.Call()):
            for prefixes, message in _MESSAGES:
                if self.q.is_call_to(call, prefixes):
                    dygraph = prefixes in (_PREPARE_CONTEXT, _FLUID_DATA_PARALLEL)
                    self.report(call, "declined", message, _DYGRAPH_FIX if dygraph else _MODERN)
                    break

    def _with_data_parallel(self) -> None:
        """``CompiledProgram(prog).with_data_parallel(...)``: one process driving every card (or CPU_NUM threads).

        Reported unless fluid-fleet turns it into ``fleet.main_program`` (a fluid file with one ``minimize``)."""
        if not self.q.index.possible(COMPILED):
            return
        if self.ctx.generation == "fluid" and len(list(minimize_calls(self.q))) == 1:
            return  # fluid-fleet converts the compiled program it runs (with its build and execution strategies)
        for call in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.Name("with_data_parallel")))):
            owner = call.func.value
            if isinstance(owner, cst.Call) and self.q.is_call_to(owner, COMPILED):
                self.report(call, "declined", "CompiledProgram(...).with_data_parallel(...) runs the program on every "
                            "card (or CPU_NUM CPU places) from one process, splitting each batch itself: launched as one "
                            "process per card, every process would do that again (Paddle replaced it with Fleet's one "
                            "process per card); dpmigrate does not rewrite it", "run the program itself instead, "
                            "exe.run(main_program, ...) without with_data_parallel, and convert the script again: each "
                            "process then trains on its part of every batch and the gradients are averaged")
