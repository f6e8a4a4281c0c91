"""The parts of the fluid 1.x Fleet conversion beyond the seed's four steps: the data, the CPU branch, the save.

Issue 19 ran the conversion on the Paddle book's ``fit_a_line`` (fluid 1.x): the ``paddle.batch(...)`` reader fed
every trainer the whole data set while the summary claimed a split, ``CUDAPlace(0) if use_cuda else CPUPlace()``
became the same card on both branches (a CPU run then needed a GPU), and every trainer wrote the inference
model. Here, as fluid 1.x's own distributed-reader guide does:

- each training reader (a ``paddle.batch(...)`` whose batches a loop feeds to the training program) is read
  through ``fluid.contrib.reader.distributed_batch_reader``: trainer ``i`` takes batches ``i, i+N, ...`` (by
  ``PADDLE_TRAINER_ID`` / ``PADDLE_TRAINERS_NUM``, which ``paddle.distributed.launch`` sets); under ``--batch
  global`` its batch size is divided by the number of trainers, so N consecutive batches are the original's one;
- a CPU place the script chooses on a condition (``... if use_cuda else CPUPlace()``) is kept;
- saves run on the first trainer only (``if fleet.worker_index() == 0:``): trainers sharing a file system would
  write the same files at once.
"""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from .static_common import CUDA_PLACES, executor_runs, program_kind, simple_assignments

BATCHES = frozenset({"paddle.batch", "paddle.fluid.io.batch", "paddle.batch.batch", "paddle.fluid.batch"})
TRAINERS = 'int(os.getenv("PADDLE_TRAINERS_NUM", "1"))'


def chosen_on_a_condition(q, place: cst.Call) -> bool:
    """``place`` is one branch of a choice (an ``if``/``else`` or ``... if ... else ...``) that also holds a GPU place."""
    for ancestor in q.ancestors(place):
        if isinstance(ancestor, (cst.IfExp, cst.If)):
            return any(q.is_call_to(c, CUDA_PLACES) for c in q.index.of_type(ancestor, cst.Call))
        if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
            return False
    return False


def training_readers(q) -> list[cst.Call]:
    """The ``paddle.batch(...)`` calls whose batches a loop feeds to the training program (``exe.run(main, ...)``)."""
    assigned = simple_assignments(q)
    found: list[cst.Call] = []
    for run in executor_runs(q):
        program, feed = argument(run, 0, "program"), argument(run, 1, "feed")
        if feed is None or program_kind(q, program.value if program else None, assigned) not in ("main", "compiled"):
            continue
        fed = q.names_in(feed.value)
        for loop in (a for a in q.ancestors(run) if isinstance(a, cst.For)):
            if not (_bound(loop.target) & fed):
                continue
            iterable = loop.iter
            if m.matches(iterable, m.Call(func=m.Name("enumerate"))) and iterable.args:
                iterable = iterable.args[0].value
            if isinstance(iterable, cst.Call) and not iterable.args:
                iterable = iterable.func  # reader(): fluid's reader creators are called
            if isinstance(iterable, cst.Name):
                for assign in _assignments(q, run, iterable.value):
                    if isinstance(assign.value, cst.Call) and q.is_call_to(assign.value, BATCHES) \
                            and assign.value not in found:
                        found.append(assign.value)
    return found


def _assignments(q, node: cst.CSTNode, name: str) -> list[cst.Assign]:
    scope = q.function_of(node)
    return [a for a in simple_assignments(q).get(name, ()) if q.function_of(a) is scope]


def _bound(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_bound(e.value) for e in target.elements))
    return set()


def split_readers(rule, fluid: str) -> bool:
    """Read each training reader per trainer (and, under ``--batch global``, in smaller batches); True when a
    rewrite needs ``os``."""
    needs_os = False
    for reader in training_readers(rule.q):
        wrap = f"{fluid}.contrib.reader.distributed_batch_reader({{}})"
        rule.ctx.plan.replace(reader, lambda updated, wrap=wrap: cst.parse_expression(
            wrap.format(rule.ctx.module.code_for_node(updated))))
        rule.report(reader, "change", "training reader -> fluid.contrib.reader.distributed_batch_reader(...): trainer i "
                    "reads batches i, i+N, ... (PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM, set by the launcher)",
                    effect="shard")
        if _shuffled_unseeded(rule.q, reader):
            rule.report(reader, "note", "this reader shuffles with Python's random generator, unseeded: each trainer "
                        "shuffles its own way, so the batches the trainers take overlap and miss samples",
                        "seed it alike on every trainer before the reader runs: random.seed(0)")
        if rule.ctx.options.batch != "global":
            continue
        size = argument(reader, 1, "batch_size")
        if size is None:
            rule.report(reader, "declined", "--batch global: cannot find this reader's batch size",
                        f"pass batch_size=B // {TRAINERS}, B being the global batch size")
            continue
        rule.ctx.plan.replace(size, lambda updated: updated.with_changes(value=cst.parse_expression(
            f"{_grouped(rule.ctx.module.code_for_node(updated.value))} // {TRAINERS}")))
        rule.report(size, "change", f"--batch global: batch size {rule.code(size.value)} -> {rule.code(size.value)} // "
                    "the number of trainers: N consecutive batches are the original's one", effect="split-batch")
        needs_os = True
    return needs_os


def _shuffled_unseeded(q, reader: cst.Call) -> bool:
    shuffles = any(q.callee_starts_with(c, "paddle.reader.shuffle") or q.callee_starts_with(c, "paddle.fluid.io.shuffle")
                   or q.is_call_to(c, {"paddle.reader.decorator.shuffle"}) for c in q.index.of_type(reader, cst.Call))
    seeded = any(q.is_call_to(c, {"random.seed"}) for c in q.index.of_type(q.module, cst.Call))
    return shuffles and not seeded


def _grouped(code: str) -> str:
    return code if code.replace("_", "").replace(".", "").isalnum() else f"({code})"


def first_trainer_only(rule, call: cst.Call, saver: str) -> None:
    """Put the statement of ``call`` (a Fleet save) under ``if fleet.worker_index() == 0:``, or say why not."""
    q = rule.q
    statement = q.statement_of(call)
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call):
        rule.report(call, "note", "every trainer runs this save (it is part of a larger statement); trainers that "
                    "share a file system write the same files at once",
                    f"write from the first trainer only: if fleet.worker_index() == 0: fleet.{saver}(...)")
        return

    def guarded(updated: cst.SimpleStatementLine) -> cst.If:
        template = cst.parse_statement("if fleet.worker_index() == 0:\n    pass\n", config=rule.ctx.config())
        inner = updated.with_changes(leading_lines=[])
        return template.with_changes(leading_lines=updated.leading_lines, body=template.body.with_changes(body=[inner]))

    rule.ctx.plan.replace(statement, guarded)
    rule.report(call, "change", "the save runs on the first trainer only (if fleet.worker_index() == 0:): trainers "
                "sharing a file system would write the same files at once")
