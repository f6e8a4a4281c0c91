"""Download datasets once per node, not once per rank at the same time."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.query import is_main_guard
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule

_DOWNLOAD = m.Call(args=[m.ZeroOrMore(), m.Arg(m.Name("True"), keyword=m.Name("download")), m.ZeroOrMore()])


_FETCHES = {"requests.get", "urllib.request.urlretrieve", "urllib.request.urlopen", "wget.download", "gdown.download"}
# what unpacks or writes what was fetched, right after the fetch: one sequence, run once (a second rank downloading
# again truncates the archive the first one is extracting)
_UNPACKS = {"tarfile.open", "zipfile.ZipFile", "shutil.unpack_archive", "gzip.open", "bz2.open", "lzma.open",
            "shutil.copyfileobj", "os.remove", "os.unlink", "os.rename", "os.replace", "subprocess.run",
            "subprocess.call", "subprocess.check_call", "os.system"}
_UNPACK_METHODS = ("extractall", "extract", "write", "iter_content")


def _pretrained(call: cst.Call) -> bool:
    """``pretrained=True`` (anything but False/None) or ``weights=`` anything but None."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in ("pretrained", "weights"):
            return not (isinstance(arg.value, cst.Name) and arg.value.value in ("None", "False"))
    return False


class DownloadMainProcessFirst(Rule):
    """Wrap statements that download (``download=True``, ``requests.get``, ``urlretrieve``, the
    framework's hub/URL loaders, pretrained weights) in ``with dp.main_process_first():``.

    Why: N ranks downloading into the same directory at once corrupt each other's files. The main
    process of each node runs the block first; the others then find the files in place.
    Example:  dataset1 = datasets.MNIST('../data', train=True, download=True, transform=transform)
           -> with dp.main_process_first():
                  dataset1 = datasets.MNIST('../data', train=True, download=True, transform=transform)
    Consecutive download statements share one block, with the statements right after them that unpack or write
    what was fetched (the whole fetch-unpack sequence runs once: a rank downloading again would truncate the
    archive another rank is extracting). A download inside a choice the ranks could take
    differently (``if not os.path.exists(f):``, ``try:``) takes the whole choice into the block; inside an
    ``if`` that only reads names (``if args.synthetic:``), every rank takes the same branch and the download's
    own statement is the block (so what the other branch does, e.g. draw and share random data, stays outside).
    Unsafe when: the statement is reached by only some ranks (the block is a meeting point).
    Leaves alone: downloads inside an expression that is not a whole statement of its own line
    (e.g. on the same line as an ``if``), reported.
    """

    name = "download-main-process-first"
    about_training = False

    def finish(self) -> None:
        statements = []
        for call, what in self._downloads():
            statement = self.q.statement_of(call)
            if self._in_main_process_first(statement):
                continue
            if not isinstance(statement, cst.SimpleStatementLine) or self._in_branch(statement):
                statement = self._whole_branching_statement(statement)
                if statement is None:
                    self.report(call, "declined", f"{what} inside a block that trains or meets the other ranks",
                                "download it in a statement of its own inside `with dp.main_process_first():`")
                    continue
            if not any(s is statement for s in statements):
                statements.append(statement)
            self.report(call, "change", f"{what} runs under dp.main_process_first(): "
                        "downloaded once per node, the other ranks wait for it")
        for run in self._runs(self._with_follow_ups(statements)):
            if self._kept_after(run):
                self.ctx.plan.group(run, self._with_block)
            else:  # only files are left behind: fetched once per node, by its first process, while the others wait
                self.ctx.plan.group(run, self._first_on_node_only)
                self.ctx.plan.insert_after(run[0], self.statement("{dp}.barrier()\n"))

    def _downloads(self):
        """(call, what it is) for every call that fetches files, in source order."""
        vocabulary = self.vocabulary
        words = {p.rstrip(".").rsplit(".", 1)[-1] for p in (*_FETCHES, *vocabulary.download_prefixes)}
        packages = {p.split(".", 1)[0] for p in vocabulary.download_prefixes if p.endswith(".")}
        hinted = {f.rsplit(".", 1)[-1] for f in self.ctx.options.downloading_functions}
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            last = call.func.attr.value if isinstance(call.func, cst.Attribute) else (
                call.func.value if isinstance(call.func, cst.Name) else None)
            keywords = {a.keyword.value for a in call.args if a.keyword is not None}
            if not ({"download", "pretrained", "weights"} & keywords or last in words or last in hinted
                    or last == "from_pretrained" or any(self.q.named_under(call.func, p) for p in packages)):
                continue  # cannot be a download: no scope analysis for it
            if m.matches(call, _DOWNLOAD):
                yield call, "download=True"
            elif self.q.is_call_to(call, _FETCHES) or any(
                self.q.callee_starts_with(call, prefix) for prefix in vocabulary.download_prefixes
            ):
                yield call, f"{self.code(call.func)}(...)"
            elif self.ctx.options.downloading_functions and self.q.is_call_to(call, self.ctx.options.downloading_functions):
                yield call, f"{self.code(call.func)}(...), which downloads in its own module,"
            elif any(self.q.callee_starts_with(call, prefix) for prefix in vocabulary.pretrained_prefixes) and (
                _pretrained(call) or (isinstance(call.func, cst.Attribute) and call.func.attr.value == "from_pretrained")
            ):
                yield call, f"pretrained weights of {self.code(call.func)}(...)"

    def _with_follow_ups(self, statements: list) -> list:
        """Each download with the statements right after it that unpack or write what it fetched (``tarfile.open(f)
        .extractall()``, ``with open(p, "wb") as out: out.write(r.content)``): the whole fetch-unpack sequence runs
        once per node."""
        out: list = []
        for statement in statements:
            if any(s is statement for s in out):
                continue
            out.append(statement)
            block = self.q.block_of(statement)
            if block is None:
                continue
            body = list(block.body)
            index = next(i for i, s in enumerate(body) if s is statement)
            for following in body[index + 1:]:
                if not self._follows_up(following):
                    break
                if not any(s is following for s in out):
                    out.append(following)
        return out

    def _follows_up(self, statement: cst.BaseStatement) -> bool:
        if self.q.trains(statement) or self.ctx.analysis(RankAnalysis).has_collective(statement):
            return False
        calls = list(self.q.index.of_type(statement, cst.Call))
        return any(self.q.is_call_to(c, _UNPACKS) or (isinstance(c.func, cst.Attribute) and c.func.attr.value in
                                                       _UNPACK_METHODS) for c in calls)

    def _in_branch(self, statement: cst.CSTNode) -> bool:
        """Inside an ``if``/``try`` of its function that some ranks may not take (a file exists on one)."""
        owner = self._owner(statement)
        if isinstance(owner, cst.If) and (is_main_guard(owner) or self._same_on_every_rank(owner)):
            return False
        if isinstance(owner, cst.Else) and self._same_on_every_rank(self.q.parent(owner)):
            return False
        return isinstance(owner, (cst.If, cst.Else, cst.Try, cst.ExceptHandler, cst.Finally))

    def _same_on_every_rank(self, node: cst.CSTNode | None) -> bool:
        """An ``if`` whose test reads only names and attributes (``args.synthetic``, ``not cfg.cached``): every rank
        takes the same branch, so the download's own statement can be the block. A test that calls anything
        (``os.path.exists``) may differ once the main process has downloaded."""
        return (isinstance(node, cst.If) and not self.q.index.of_type(node.test, cst.Call)
                and not isinstance(self.q.parent(node), cst.If))

    def _owner(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        block = self.q.parent(statement)
        return self.q.parent(block) if isinstance(block, cst.IndentedBlock) else None

    def _whole_branching_statement(self, statement: cst.CSTNode) -> cst.BaseStatement | None:
        """The outermost ``if``/``try`` around ``statement`` (not past a ``with`` or the ``__main__`` block), which every rank
        reaches: the ``main_process_first`` block (a meeting point) must wrap the whole choice
        (``if os.path.exists(f): ... else: download()``), or the ranks would meet in different places."""
        while True:
            owner = self._owner(statement)
            while isinstance(owner, (cst.Else, cst.ExceptHandler, cst.Finally)):
                owner = self.q.parent(owner)
            while isinstance(owner, cst.If) and isinstance(self.q.parent(owner), cst.If):  # elif
                owner = self.q.parent(owner)
            if not isinstance(owner, (cst.If, cst.Try)) or (isinstance(owner, cst.If) and is_main_guard(owner)):
                break  # a `with` or the __main__ block: every rank that gets here gets in
            statement = owner
        if self.q.trains(statement) or self.ctx.analysis(RankAnalysis).has_collective(statement):
            return None
        return statement if isinstance(self.q.parent(statement), (cst.Module, cst.IndentedBlock)) else None

    def _in_main_process_first(self, statement: cst.CSTNode) -> bool:
        """Already inside ``with dp.main_process_first():`` (or ``with ....main_process_first():``)."""
        for ancestor in self.q.ancestors(statement):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and isinstance(item.item.func, cst.Attribute)
                and item.item.func.attr.value == "main_process_first" for item in ancestor.items
            ):
                return True
        return False

    def _runs(self, statements):
        """Group statements that follow each other in the same block."""
        runs: list[list[cst.BaseStatement]] = []
        for statement in statements:
            block = self.q.block_of(statement)
            body = list(block.body)
            index = next(i for i, s in enumerate(body) if s is statement)
            previous = runs[-1][-1] if runs else None
            if previous is not None and index > 0 and body[index - 1] is previous:
                runs[-1].append(statement)
            else:
                runs.append([statement])
        return runs

    def _kept_after(self, run: list) -> bool:
        """A name the run binds is read after it (a dataset object, loaded arrays): every rank must run it (the main
        process first); otherwise it only leaves files, and running it again on the other ranks would download
        and unpack over files the first process may already be reading."""
        if any(self.q.index.of_type(s, cst.Return) for s in run):
            return True  # what it returns: every rank needs it
        index = self.q.index
        targets = [t.target for s in run for a in index.of_type(s, cst.Assign) for t in a.targets]
        targets += [a.target for s in run for a in (*index.of_type(s, cst.AnnAssign), *index.of_type(s, cst.AugAssign))]
        if any(isinstance(t, (cst.Attribute, cst.Subscript)) for t in targets):
            return True  # `self.backbone = resnet18(weights=...)`: read through the object, wherever it goes
        bound = set().union(*(_names_bound(s) for s in run))
        if not bound:
            return False
        scope = self.q.function_of(run[0]) or self.ctx.module
        return any(n.value in bound and index.follows(n, run[-1]) for n in index.of_type(scope, cst.Name))

    def _first_on_node_only(self, statements):
        first = statements[0]
        body = [first.with_changes(leading_lines=())] + list(statements[1:])
        return cst.If(test=self.dp("local_rank() == 0"), body=cst.IndentedBlock(body=body),
                      leading_lines=first.leading_lines)

    def _with_block(self, statements):
        first = statements[0]
        body = [first.with_changes(leading_lines=())] + list(statements[1:])
        return cst.With(
            items=[cst.WithItem(self.dp("main_process_first()"))],
            body=cst.IndentedBlock(body=body),
            leading_lines=first.leading_lines,
        )


def _names_bound(statement: cst.CSTNode) -> set[str]:
    """Names a statement assigns (``r = requests.get(...)``, ``with open(p) as f``): a follow-up reads them."""
    found: set[str] = set()

    def names(target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            found.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                names(element.value)

    class Bound(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            names(node.target)

        def visit_AsName(self, node: cst.AsName) -> None:
            names(node.name)

    statement.visit(Bound())
    return found

