"""Progress bars, sample images, files and exports once, from the main process."""

from __future__ import annotations

import re

import libcst as cst

from ...codemod import patterns as m
from ...codemod.bindings import Bindings
from ...codemod.models import Models
from ...codemod.query import is_main_guard
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule

PROGRESS_BARS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.trange", "tqdm.auto.trange"}


_REMOVALS = {"os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace", "shutil.rmtree", "shutil.move"}
_FILE_OUTPUTS = {
    # removals and renames: the second rank to run one fails (the file is gone): clean-up after a save, old checkpoints
    "os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace", "shutil.rmtree",
    "torch.onnx.export", "shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.move", "sys.stdout.write",
    "sys.stderr.write", "json.dump", "pickle.dump", "numpy.save", "numpy.savetxt", "numpy.savez", "numpy.savez_compressed",
    "matplotlib.pyplot.savefig",
}
_MODEL_EXPORTS = {"torch.onnx.export"}
_TABLE_WRITES = frozenset({"to_csv", "to_excel", "to_json", "to_parquet", "to_pickle", "to_feather", "to_hdf"})
_PIL_IMAGES = frozenset(f"PIL.Image.{n}" for n in ("fromarray", "open", "new", "frombytes", "merge", "blend", "composite"))
_PROGRESS_FUNCTIONS = {"progress_bar"}  # the CIFAR trainers' own helper, a print in disguise
_TENSORBOARD = {"torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter"}
_WRITE_MODES = set("wax")
_PATH_WRITES = {"write_text", "write_bytes"}  # pathlib: ``path.write_text(json.dumps(history))``
_PATH_READS = {"read_text", "read_bytes", "open"}
_SCHEDULER_PREFIXES = ("paddle.optimizer.lr.", "torch.optim.lr_scheduler.")
# what reads back a file the main process wrote (first argument: its path): the other ranks must wait for it
_READS = {
    "open", "builtins.open", "PIL.Image.open", "torch.load", "numpy.load", "numpy.loadtxt", "json.load", "pandas.read_csv",
    "imageio.imread", "imageio.v2.imread", "imageio.v3.imread", "matplotlib.pyplot.imread", "matplotlib.image.imread",
    "cv2.imread", "paddle.load", "pickle.load", "shutil.copyfile", "shutil.copy",
}


def _opens_for_writing(query, call: cst.Call) -> bool:
    """``open(path, "w")`` / ``open(path, mode="a")`` / pathlib's ``path.open("w")`` (and ``gzip.open(path, "wt")``)
    with a literal mode that writes."""
    mode = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "mode"), None)
    positional = [a.value for a in call.args if a.keyword is None]
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "open":
        if mode is None and positional and _is_mode(positional[0]):
            mode = positional[0]  # Path.open(mode, ...)
    elif not (isinstance(call.func, cst.Name) and call.func.value == "open"):
        return False
    if mode is None and len(positional) >= 2:
        mode = positional[1]
    return isinstance(mode, cst.SimpleString) and bool(_WRITE_MODES & set(str(mode.evaluated_value)))


def _is_mode(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and re.fullmatch(r"[rwxabt+U]{1,4}", str(node.evaluated_value)) is not None


def _path_open(call: cst.Call) -> bool:
    """``path.open("w", ...)``: pathlib's, whose arguments are the builtin ``open``'s after the file."""
    positional = [a.value for a in call.args if a.keyword is None]
    return isinstance(call.func, cst.Attribute) and (_is_mode(positional[0]) if positional else bool(call.args))


class MainProcessOutput(Rule):
    """Show progress bars and write sample images on the main process only.

    Why: launched on N processes, N progress bars fight over one terminal and N processes write the
    same image file at once.
    Example:  for x, y in tqdm(train_loader):
           -> for x, y in tqdm(train_loader, disable=not dp.is_main_process()):
              vutils.save_image(fake, path)
           -> if dp.is_main_process():
                  vutils.save_image(fake, path)
    Matched by qualified name (``tqdm.tqdm``; image writers from the framework's vocabulary, e.g.
    ``torchvision.utils.save_image``), in files that train.
    Also under ``if dp.is_main_process():``: ``torch.onnx.export``, ``shutil`` copies, writes to
    ``sys.stdout``, ``json.dump``/``numpy.save``/``savefig``, a ``progress_bar(...)`` helper, and a
    ``with open(path, "w")`` block (or pathlib's ``path.open("w")``) that neither trains nor meets the other
    ranks, pathlib's ``path.write_text(...)``/``write_bytes(...)``, and removals and renames of
    files (``os.remove``, ``shutil.rmtree``...: the second rank to remove a file fails), and a
    ``print(line, file=open(log, "a"))`` (the ``open`` too: ``dp.print`` would still open it on every rank). A file
    written so that a later statement reads it back (``plt.savefig(p)`` then ``Image.open(p)``) gets
    ``dp.barrier()`` after the write, so no rank reads it before it exists (also when the script reads it by the
    same literal path elsewhere, after the function that writes it); a ``f.close()`` right after the block goes
    with it; a removal of a path an earlier statement of the same function handed to a call gets one before it, so
    no rank is still reading it.
    A learning-rate scheduler's ``verbose=True`` becomes ``verbose=dp.is_main_process()``.
    TensorBoard's ``SummaryWriter`` is reported (every rank writes its own event file).
    Leaves alone: progress bars that already pass ``disable=``; writes that are not a statement of
    their own, whose value is kept, or already under a rank condition.
    """

    name = "main-process-output"
    about_training = False

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.main_process_only_blocks: set[int] = set()

    def visit_Module(self, node: cst.Module) -> bool:
        """A training script, or a helper module converted with one (``importer_seeds`` set): its writers run
        on every rank of the script (image_classification_paddle's ``write_json`` of the history: issue 19)."""
        return self.q.is_training_script() or self.ctx.options.importer_seeds is not None

    def visit_Call(self, node: cst.Call) -> None:
        if self.q.is_call_to(node, PROGRESS_BARS):
            if any(a.keyword is not None and a.keyword.value == "disable" for a in node.args):
                return
            if node.args:
                self.ctx.plan.replace(node, self._disabled_off_main)
            self.report(node, "change", "progress bar shown by the main process only (disable=not dp.is_main_process())")
        elif self.q.is_call_to(node, self.vocabulary.image_writers) or self._saves_a_pil_image(node):
            self._once(node, "image written")
        elif self.q.is_call_to(node, _FILE_OUTPUTS) or (
                isinstance(node.func, cst.Attribute) and node.func.attr.value == "savefig") or (  # fig.savefig
                self._writes_a_table(node)):
            self._once(node, f"{self.code(node.func)}(...) run")
        elif isinstance(node.func, cst.Name) and node.func.value in _PROGRESS_FUNCTIONS:
            self._once(node, f"{node.func.value}(...) shown")
        elif _opens_for_writing(self.q, node) and node.args and (node.args[0].keyword is None or _path_open(node)):
            self._kept_file(node)
        elif (opened := self._print_to_opened_file(node)) is not None:
            self._once(node, "print(..., file=open(...)) run", paths={self.code(opened.args[0].value)})
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in _PATH_WRITES and node.args:
            self._once(node, f"{self.code(node.func)}(...) run", paths={self.code(node.func.value)})
        elif (verbose := self._verbose_scheduler(node)) is not None:
            self.ctx.plan.replace(verbose.value, lambda updated: self.dp("is_main_process()"))
            self.report(verbose, "change", "the learning-rate scheduler's messages are printed by the main process only "
                        "(verbose=dp.is_main_process()): each rank prints them otherwise")
        elif self.q.is_call_to(node, _TENSORBOARD):
            self.report(
                node, "note",
                "every rank writes its own TensorBoard event file into this folder (TensorBoard shows N runs)",
                "to log once, create the writer only when dp.is_main_process() and guard its calls",
            )

    def _print_to_opened_file(self, node: cst.Call) -> cst.Call | None:
        """The ``open(path, "a")`` of ``print(line, file=open(path, "a"))`` (an MLP homework's whole log): every rank
        opened and appended, so the log held each line N times with each rank's own figures, and a ``"w"`` at
        start-up could truncate what another rank had written. The statement runs on the main process (``dp.print``
        would not do: its arguments, the ``open`` among them, are evaluated on every rank)."""
        if not self.q.is_call_to(node, {"builtins.print"}):
            return None
        target = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "file"), None)
        if not (isinstance(target, cst.Call) and _opens_for_writing(self.q, target) and target.args):
            return None
        return None if self.ctx.analysis(RankAnalysis).has_collective(node) else target

    def _verbose_scheduler(self, node: cst.Call) -> cst.Arg | None:
        """``verbose=True`` given to a learning-rate scheduler (Paddle's ``paddle.optimizer.lr.*``, torch's
        ``lr_scheduler.*``): the framework prints its line at every step, on every rank (round L: 202 lines for 101)."""
        verbose = next((a for a in node.args if a.keyword is not None and a.keyword.value == "verbose"), None)
        if verbose is None or not m.matches(verbose.value, m.Name("True")):
            return None
        names = self.q.qualified_names(node.func)
        return verbose if any(n.startswith(_SCHEDULER_PREFIXES) for n in names) else None

    def visit_With(self, node: cst.With) -> None:
        """``with open(path, "w") as f:`` writing a file: by the main process only."""
        opened = [item.item for item in node.items if isinstance(item.item, cst.Call) and _opens_for_writing(self.q, item.item)]
        if not opened or self.q.has_backward(node) or self.ctx.analysis(RankAnalysis).has_collective(node):
            return
        if any(self.q.is_call_to(c, self.vocabulary.save_calls) for c in self.q.index.of_type(node, cst.Call)):
            return  # the save rule decides (its dp.save is a meeting point every rank must reach)
        if not isinstance(self.q.parent(node), (cst.Module, cst.IndentedBlock)):
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        closing = self._closing_after(node)
        if closing is None:
            return  # the file object is used later on every rank: guarding the block would leave it unbound there
        self.ctx.plan.group([node, *closing], self.main_process_only)
        self.main_process_only_blocks.add(id(node))
        self.report(opened[0], "change", "file written by the main process only (under `if dp.is_main_process():`)")
        self._unwrap_model_calls(node)
        self._wait_before_reads(node, {self.code(a.value) for a in opened[0].args[:1]})
        self._wait_for_an_input_file(node, opened[0], [node, *closing])

    def _wait_for_an_input_file(self, node: cst.With, opened: cst.Call, group: list[cst.BaseStatement]) -> None:
        """A file the main process now writes alone, in a function's (or the module's) own body, that the script
        reads elsewhere by the same literal path (a skip-gram notebook's ``download()`` writes ``./text8.txt``, which
        the module then opens): every rank waits for it with ``dp.barrier()`` after the write (measured: the other
        rank failed on a file not yet there, or would read a stale one)."""
        path = opened.args[0].value if opened.args else None
        block = self.q.block_of(node)
        if not isinstance(path, cst.SimpleString) or block is None or not self._every_rank_runs(block):
            return
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if self.q.index.contains(node, call) or _opens_for_writing(self.q, call):
                continue
            first = next((a.value for a in call.args if a.keyword is None), None)
            if (isinstance(first, cst.SimpleString) and first.evaluated_value == path.evaluated_value
                    and self.q.is_call_to(call, _READS) and self.q.block_of(self.q.statement_of(call)) is not block):
                self.ctx.plan.insert_after(group[-1], self.statement("{dp}.barrier()\n"))
                self.report(call, "change", f"dp.barrier() after the main process writes {self.code(path)} (line "
                            f"{self.ctx.positions[node].start.line}): the other ranks wait for it before this read")
                return

    def _closing_after(self, node: cst.With) -> list[cst.BaseStatement] | None:
        """The statements right after ``with open(p, "w") as f:`` that only close or flush ``f`` (a skip-gram
        notebook's ``f.close()``: left outside the guard, it failed on every other rank, ``f`` unbound there), to
        guard with the block; None when ``f`` is read anywhere else after the block."""
        names = {item.asname.name.value for item in node.items
                 if item.asname is not None and isinstance(item.asname.name, cst.Name)}
        block = self.q.block_of(node)
        if not names or block is None:
            return []
        later = list(block.body)[[id(s) for s in block.body].index(id(node)) + 1:]
        closing = []
        for statement in later:
            if not m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
                    value=m.OneOf(*[m.Name(n) for n in names]), attr=m.OneOf(m.Name("close"), m.Name("flush")))))])):
                break
            closing.append(statement)
        for statement in later[len(closing):]:
            rebound = {i.asname.name.value for i in getattr(statement, "items", ())
                       if i.asname is not None and isinstance(i.asname.name, cst.Name)}
            if names & (self.q.assigned_names(statement) | rebound):
                break  # a later `with open(q, "w") as f:` (or `f = ...`) binds f anew: what follows reads that one
            if any(n.value in names for n in self.q.index.of_type(statement, cst.Name)):
                return None
        return closing

    def _kept_file(self, node: cst.Call) -> None:
        """``log = open("log.txt", "w+")`` kept for the run (BJTUcaptcha's log, written from the training loop): every
        rank opened and wrote it, so it held half of each rank's lines and a stray byte. The main process opens the
        file; the others open ``os.devnull``, so every ``log.write(...)`` after it stays as it is."""
        assign = self.q.parent(node)
        if not (isinstance(assign, cst.Assign) and assign.value is node and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None or "os" in self._other_names():
            return
        if _path_open(node):  # log_path.open("w"): the other ranks open os.devnull with the same arguments
            path, target = node.func.value, node

            def devnull(updated: cst.Call) -> cst.BaseExpression:
                return self._main_or(updated, cst.Call(func=cst.Name("open"), args=[
                    cst.Arg(cst.parse_expression("os.devnull"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    *updated.args]))
        else:
            path = target = node.args[0].value

            def devnull(updated: cst.BaseExpression) -> cst.BaseExpression:
                return self._main_or(updated, cst.parse_expression("os.devnull"))
        self.ctx.plan.replace(target, devnull)
        self.ctx.plan.standard_imports.add("os")
        self.report(node, "change", f"file `{self.code(path)}` opened for writing and kept in "
                    f"`{assign.targets[0].target.value}`: opened by the main process; the other ranks write to os.devnull")

    def _main_or(self, main: cst.BaseExpression, other: cst.BaseExpression) -> cst.IfExp:
        return cst.IfExp(test=self.dp("is_main_process()"), body=main, orelse=other,
                         whitespace_before_if=cst.SimpleWhitespace(" "), whitespace_after_if=cst.SimpleWhitespace(" "),
                         whitespace_before_else=cst.SimpleWhitespace(" "), whitespace_after_else=cst.SimpleWhitespace(" "))

    def _other_names(self) -> set[str]:
        """Names bound in the file to something other than the ``os`` module (an ``os`` variable would shadow it)."""
        return {t.value for a in self.q.index.of_type(self.ctx.module, cst.AssignTarget)
                for t in [a.target] if isinstance(t, cst.Name)}

    def _disabled_off_main(self, updated: cst.Call) -> cst.Call:
        disable = cst.Arg(
            cst.UnaryOperation(cst.Not(), self.dp("is_main_process()")),
            keyword=cst.Name("disable"),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        last = updated.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=[*updated.args[:-1], last, disable])

    def _writes_a_table(self, node: cst.Call) -> bool:
        """``frame.to_csv(path)`` in a file that imports pandas: a submission file written by every rank (round R:
        twice the rows in append mode). Without a path, ``to_csv()`` returns the text: no write."""
        func = node.func
        return (isinstance(func, cst.Attribute) and func.attr.value in _TABLE_WRITES and bool(node.args)
                and not (isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == "None")
                and bool(self.q.index.possible({"pandas"})))

    def _saves_a_pil_image(self, node: cst.Call) -> bool:
        """``image.save(path)`` of an image PIL made (``image = Image.fromarray(a)``, or the call itself with its
        methods: ``Image.fromarray(a).convert("L").save(p)``): a super-resolution script's sample grid, written by
        both ranks at once (round R)."""
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "save") or not self.q.index.possible(_PIL_IMAGES):
            return False
        value = func.value
        if isinstance(value, cst.Name):
            value = self.ctx.analysis(Bindings).assigned_value(node, value.value)
        while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
               and not self.q.is_call_to(value, _PIL_IMAGES)):
            value = value.func.value  # (.convert(...), .resize(...): still the image)
        return isinstance(value, cst.Call) and self.q.is_call_to(value, _PIL_IMAGES)

    def _once(self, node: cst.Call, what: str, paths: set[str] | None = None) -> None:
        if any(id(a) in self.main_process_only_blocks for a in self.q.ancestors(node)):
            return  # inside a `with open(..., "w")` block that is guarded as a whole
        statement = self.q.statement_of(node)
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return
        if not isinstance(statement.body[0], cst.Expr):
            return  # a value the script keeps (onnx program, copied path): every rank needs it
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        self.ctx.plan.group([statement], self.main_process_only)
        self._wait_before_reads(statement, paths if paths is not None else
                                {self.code(a.value) for a in node.args if a.keyword is None})
        if self.q.is_call_to(node, _REMOVALS):
            self._wait_before_removal(statement, node)
        exported = self._exported_model(node)
        if exported is not None:
            self.ctx.plan.replace(exported, lambda updated: self.dp_call("unwrap", updated))
            what += f" on dp.unwrap({self.code(exported)}), the model as built"
        self.report(node, "change", f"{what} by the main process only (under `if dp.is_main_process():`)")

    def _unwrap_model_calls(self, block: cst.With) -> None:
        """A wrapped model called inside a block only the main process now runs: its wrapper's forward meets the
        other ranks (DDP broadcasts buffers there), so the block calls the model itself, ``dp.unwrap(model)(...)``
        (its weights are every rank's)."""
        wrapped = {site.name for site in self.ctx.analysis(Models).sites if site.verdict in ("wrap", "attribute")}
        for call in self.q.index.of_type(block, cst.Call):
            func = call.func
            name = self.code(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
            if name in wrapped:
                self.ctx.plan.replace(func, lambda updated: self.dp_call("unwrap", updated))
                self.report(call, "change", f"{name}(...) inside the main process's block calls dp.unwrap({name}): the "
                            "wrapped model's forward would wait for the other ranks")

    def _wait_before_reads(self, statement: cst.BaseStatement, paths: set[str]) -> None:
        """A file the main process now writes alone and a later statement of the same block reads back (a saved
        plot opened again, a written file loaded): every rank waits for it with ``dp.barrier()`` after the write."""
        block = self.q.block_of(statement)
        if block is None or not paths:
            return
        later = list(block.body)[[id(s) for s in block.body].index(id(statement)) + 1:]
        for following in later:
            for call in self.q.index.of_type(following, cst.Call):
                first = next((a.value for a in call.args if a.keyword is None), None)
                reads = self.q.is_call_to(call, _READS)
                if not reads and isinstance(call.func, cst.Attribute) and call.func.attr.value in _PATH_READS:
                    first, reads = call.func.value, True  # (out / "history.json").read_text()
                if reads and _opens_for_writing(self.q, call):
                    continue  # open(path, "a"): another write (the main process's too, when it is guarded), no read
                if first is not None and self.code(first) in paths and reads:
                    self.ctx.plan.insert_after(statement, self.statement("{dp}.barrier()\n"))
                    self.report(call, "change", f"dp.barrier() before this read of {self.code(first)}: the main "
                                "process writes it alone, the other ranks wait until it is there")
                    return

    def _wait_before_removal(self, statement: cst.SimpleStatementLine, node: cst.Call) -> None:
        """A removal the main process now runs alone, of a path an earlier statement of the same top-level block
        hands to a call (a device smoke test's ``jit.save(model, "output/model")``, ``infer("output")``, then
        ``shutil.rmtree("output")``): the other ranks may still be reading it, so every rank waits with
        ``dp.barrier()`` before the removal (measured: a rank 5 s late failed on a deleted ``output/model.json``).
        Only in a function's or the module's own body (or ``if __name__ == "__main__":``), which every rank runs."""
        first = next((a.value for a in node.args if a.keyword is None), None)
        block = self.q.block_of(statement)
        if first is None or block is None or not self._every_rank_runs(block):
            return
        path = self.code(first)
        literal = first.evaluated_value if isinstance(first, cst.SimpleString) else None
        earlier = list(block.body)[:[id(s) for s in block.body].index(id(statement))]
        for before in reversed(earlier):  # the nearest: the last to read it
            for call in self.q.index.of_type(before, cst.Call):
                for arg in call.args:
                    value = arg.value
                    same = self.code(value) == path or (
                        isinstance(literal, str) and isinstance(value, cst.SimpleString)
                        and isinstance(value.evaluated_value, str) and value.evaluated_value.startswith(literal + "/"))
                    if same and call is not node:
                        self.ctx.plan.insert_before(statement, self.statement("{dp}.barrier()\n"))
                        self.report(node, "change", f"dp.barrier() before this removal of {path}: the other ranks "
                                    f"may still be reading what {self.code(call.func)}(...) was handed")
                        return

    def _every_rank_runs(self, block: cst.CSTNode) -> bool:
        owner = self.q.parent(block)
        return isinstance(block, cst.Module) or isinstance(owner, cst.FunctionDef) or (
            isinstance(owner, cst.If) and is_main_guard(owner) and isinstance(self.q.parent(owner), cst.Module))

    def _exported_model(self, node: cst.Call) -> cst.Name | None:
        """The model a ``torch.onnx.export(model, ...)`` exports: the plain module, not its wrapper."""
        if not self.q.is_call_to(node, _MODEL_EXPORTS):
            return None
        first = next((a.value for a in node.args if a.keyword is None), None)
        return first if isinstance(first, cst.Name) else None

