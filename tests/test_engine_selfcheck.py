"""The engine checks every conversion itself (issue 18's invariants), whatever the rules did.

1. Its own output passes its own lint: a plan that would put a collective where only some ranks run it is
   rejected: the rule that made it is dropped and its changes reported declined, the rest of the conversion kept.
2. Coverage: a training loop whose data nothing shards or speaks about, and an optimizer that steps with nothing
   said about it, get a ``declined`` finding with the fix (a TF loop over ``enumerate(ds.take(n), 1)`` was left
   whole on every worker with nothing reported).
3. The report says each thing once.

Both run over every fixture of the three frameworks.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from fixture_cases import FIXTURES, options
from libcst.metadata import MetadataWrapper
from rule_testing import convert_text

from dpmigrate.codemod import selfcheck
from dpmigrate.codemod.engine import convert
from dpmigrate.codemod.index import TreeIndex
from dpmigrate.codemod.rule import Rule
from dpmigrate.findings import Options
from dpmigrate.frameworks import REGISTRY

# --- 1. no converter-made divergence -----------------------------------------------------------------------------


def _index(code: str) -> TreeIndex:
    return TreeIndex(MetadataWrapper(cst.parse_module(code), unsafe_skip_copy=True))



@pytest.mark.parametrize("code, found", [
    ("if dp.is_main_process():\n    dp.save(m, 'x')\n", "dp.save(...) under `if dp.is_main_process()`"),
    ("if dp.rank() == 0:\n    y = dp.all_reduce(x)\n", "dp.all_reduce(...) under `if dp.rank() == 0`"),
    ("with dp.main_process_first():\n    data = dp.broadcast(make())\n",
     "dp.broadcast(...) under `with dp.main_process_first()`"),
    ("x = dp.barrier() if dp.is_main_process() else None\n", "dp.barrier(...) under `... if dp.is_main_process()`"),
])
def test_a_collective_the_conversion_puts_under_a_rank_guard_is_found(code, found):
    new = cst.parse_module("import torch\n" + code)
    assert selfcheck.divergent_sites(new, _index("import torch\n"), "dp") == [found]


@pytest.mark.parametrize("code", [
    "with dp.main_process_first():\n    data = download()\n",  # entering the block is every rank's
    "if dp.is_main_process():\n    print('saved')\ndp.save(m, 'x')\n",
    "if dp.is_main_process():\n    def later():\n        dp.barrier()\n",  # defined there, called elsewhere
    "if args.verbose:\n    dp.save(m, 'x')\n",  # not a rank condition (the lint's business, not the engine's)
])
def test_what_every_rank_reaches_is_not_a_divergence(code):
    assert selfcheck.divergent_sites(cst.parse_module(code), _index(""), "dp") == []


def test_unchanged_statements_are_not_read():
    index = _index("if dp.is_main_process():\n    dp.save(m, 'x')\n")
    assert selfcheck.divergent_sites(index.module, index, "dp") == []  # the user's own code: the lint reports it


class _GuardsPrintsWithABarrier(Rule):
    """A deliberately wrong rule: each print goes under `if dp.is_main_process():` with a barrier inside."""

    name = "bad-guard"

    def visit_SimpleStatementLine(self, node):
        if any(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Name)
               and s.value.func.value == "log" for s in node.body):
            self.ctx.plan.replace(node, lambda updated: self.statement(
                f"if {{dp}}.is_main_process():\n    {{dp}}.barrier()\n    {self.code(updated).strip()}\n"))
            self.report(node, "change", "log under the main process, with a barrier")


SCRIPT = textwrap.dedent("""\
    import torch
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(range(8), batch_size=2)
    for x in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    log("done")
    torch.save(model.state_dict(), "m.pt")
""")


def test_a_plan_that_would_hang_the_job_is_rejected_and_the_rule_declined(monkeypatch):
    rule_set = REGISTRY["torch"].rule_set()
    monkeypatch.setattr(rule_set, "RULES", (*rule_set.RULES, _GuardsPrintsWithABarrier))
    result = convert(SCRIPT.encode(), "train.py", Options())
    output = result.output.decode()
    assert "barrier" not in output and 'log("done")' in output
    assert "dp.distributed_model(model)" in output and "dp.save(" in output  # the other rules' work is kept
    declined = [f for f in result.findings if f.rule == selfcheck.SELF_CHECK_RULE]
    assert [f.severity for f in declined] == ["declined"]
    assert "bad-guard" in declined[0].message and "dp.barrier(...) under `if dp.is_main_process()`" in declined[0].message
    assert not [f for f in result.findings if f.rule == "bad-guard" and f.severity == "change"]


# --- 2. coverage ----------------------------------------------------------------------------------------------------


TF_LOOP = """
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices((tf.ones((64, 3)), tf.ones((64, 1)))).repeat().shuffle(64).batch(8)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.1)
        for step, (x, y) in enumerate(ds.take(20), 1):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    """


def test_a_tf_loop_over_a_dataset_nothing_shards_is_declined(monkeypatch):
    # the TF rules follow this loop's data now; with the custom-loop rule missing (a rule that would miss the
    # shape), the engine's own check must still decline the loop and the optimizer
    rule_set = REGISTRY["tensorflow"].rule_set()
    monkeypatch.setattr(rule_set, "RULES", tuple(r for r in rule_set.RULES if r.name != "tf-custom-loop"))
    result = convert_text(TF_LOOP)
    coverage = [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]
    assert [(f.severity, f.line) for f in coverage] == [("declined", 6), ("declined", 10)]
    assert "enumerate(ds.take(20), 1)" in coverage[0].message and "dp.distributed_loader" in coverage[0].fix
    assert "`opt` steps here" in coverage[1].message


def test_the_tf_rules_now_shard_that_loop_themselves():
    result = convert_text(TF_LOOP)
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]
    assert [f.effect for f in result.findings if f.rule == "tf-custom-loop" and f.effect] == ["shard"]


def test_an_optimizer_nothing_speaks_about_is_declined():
    result = convert_text("""
        import torch
        from mylib import make_optimizer
        model = torch.nn.Linear(3, 1)
        optimizer = make_optimizer(model)
        loader = torch.utils.data.DataLoader(range(8), batch_size=2)
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    """)
    coverage = [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]
    assert [f.line for f in coverage] == [10] and "`optimizer` steps here" in coverage[0].message


def test_a_parameter_that_shadows_an_imported_module_is_traced_to_its_callers():
    result = convert_text("""
        import torch
        import torch.optim as opt
        def train(model, loader, opt):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        model = torch.nn.Linear(3, 1)
        sgd = opt.SGD(model.parameters(), lr=0.1)
        train(model, torch.utils.data.DataLoader(range(8), batch_size=2), sgd)
    """)
    assert "sgd = dp.distributed_optimizer(opt.SGD(" in result.output.decode()
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]  # `opt` in train is sgd, wrapped


def test_a_loop_whose_loader_is_sharded_is_covered():
    result = convert_text(SCRIPT.replace('log("done")\n', ""))
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]


def test_data_built_in_a_local_module_is_that_modules_conversion_to_answer_for():
    result = convert(textwrap.dedent("""
        import torch
        import data
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in data.loader():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    """).encode(), "main.py", Options(local_modules=("data",)))
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]


def test_a_rule_the_user_turned_off_is_their_call():
    result = convert_text(SCRIPT, ignore=("distributed-optimizer",))
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE]


# --- over every fixture --------------------------------------------------------------------------------------------

FIXTURE_FILES = sorted(FIXTURES.glob("*/*/before.py"))


@pytest.mark.parametrize("before", FIXTURE_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_fixture_passes_the_engines_own_checks(before):
    result = convert(before.read_bytes(), "before.py", options(before.parent))
    assert not [f for f in result.findings if f.rule == selfcheck.SELF_CHECK_RULE], "a rule made a divergence"
    assert not [f for f in result.findings if f.rule == selfcheck.COVERAGE_RULE], "a training site left unsaid"
    assert len(set(result.findings)) == len(result.findings)  # each finding once
    if result.changed:  # the output's lint finds no more than the input's
        again = convert(result.output, "after.py", options(before.parent))
        errors = [f.message for f in again.findings if f.severity == "error"]
        assert len(errors) <= len([f for f in result.findings if f.severity == "error"]), errors


def test_a_loop_calling_its_sharded_loader_variable_is_covered_and_one_over_a_plain_generator_is_not():
    """Paddle's `for data in loader():` calls the loader variable: the coverage check read only the arguments of
    calls, found no data there and declined a loop whose loader was sharded (issue 19 audit). A plain generator's
    loop is declined (by the rule that says what it reads, or else by the coverage check)."""
    source = '''\
        import paddle
        loader = {loader}
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(parameters=model.parameters())
        for data in loader():
            model(data).mean().backward()
            opt.step()
            opt.clear_grad()
        '''
    sharded = convert_text(source.format(loader="paddle.io.DataLoader(dataset, batch_size=8)"))
    assert "dp.distributed_loader(" in sharded.output.decode()
    assert not [f for f in sharded.findings if f.rule == "coverage"]
    plain = convert_text("def make_batches():\n    yield paddle.ones([8, 4])\n" + textwrap.dedent(
        source.format(loader="make_batches")))
    assert [f.severity for f in plain.findings if f.rule in ("coverage", "paddle-manual-batching")] == ["declined"]
