"""One mechanism decides which rules apply to a file: its API generation, read off the vocabulary's markers.

The generation the report gives (``Conversion.generation``) is the one the rules acted on: every finding comes
from a rule whose ``generations`` admit it (issue 22: the report said ``tf2-keras`` while the TF1 rule declined
the whole file; a Paddle ``BuildStrategy`` made a dygraph script "static" and turned every dygraph rule off).
Checked on files that mix generations, and on every fixture of the three frameworks.
"""

from __future__ import annotations

import textwrap

import pytest
from fixture_cases import FIXTURES, options

from dpmigrate.codemod import selfcheck
from dpmigrate.codemod.engine import DETECT_RULE, UNUSED_IMPORT_RULE, convert
from dpmigrate.findings import Options
from dpmigrate.frameworks import REGISTRY

MIXED = {
    "tf-get-variable-with-fit": ("tensorflow", "tf1-graph", """
        import tensorflow as tf
        w = tf.get_variable("w", [3, 1])
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=32)
        print("done")
    """),
    "tf-session-with-multi-gpu-model": ("tensorflow", "tf1-graph", """
        import tensorflow as tf
        from keras.utils import multi_gpu_model
        from keras import backend as K
        K.set_session(tf.Session())
        model = build()
        parallel = multi_gpu_model(model, gpus=2)
        parallel.compile(optimizer="sgd", loss="mse")
        parallel.fit(x, y, batch_size=64)
    """),
    "tf-compat-logging-with-fit": ("tensorflow", "tf2-keras", """
        import tensorflow as tf
        tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=32)
    """),
    "paddle-dygraph-with-build-strategy": ("paddle", "dygraph", """
        import paddle
        net = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        if to_static:
            build = paddle.static.BuildStrategy()
            net = paddle.jit.to_static(net, build_strategy=build)
        loader = paddle.io.DataLoader(data, batch_size=32)
        for x, y in loader:
            loss = paddle.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
    """),
    "paddle-static-with-fluid": ("paddle", "static", """
        import paddle
        import paddle.fluid as fluid
        paddle.enable_static()
        x = paddle.static.data("x", [None, 4])
        loss = paddle.mean(fluid.layers.fc(x, 1))
        paddle.optimizer.SGD().minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
    """),
    "paddle-fluid-only": ("paddle", "fluid", """
        import paddle.fluid as fluid
        x = fluid.layers.data("x", [4])
        loss = fluid.layers.mean(fluid.layers.fc(x, 1))
        fluid.optimizer.SGD(0.1).minimize(loss)
        exe = fluid.Executor(fluid.CPUPlace())
    """),
}


def _rules_that_apply(framework: str, generation: str) -> set[str]:
    rule_set = REGISTRY[framework].rule_set()
    engine = {DETECT_RULE, UNUSED_IMPORT_RULE, selfcheck.COVERAGE_RULE, selfcheck.SELF_CHECK_RULE}  # (the engine's own)
    return {r.name for r in rule_set.RULES if r.applies_to(generation, rule_set.VOCABULARY)} | engine


def _assert_agrees(conversion, framework: str) -> None:
    allowed = _rules_that_apply(framework, conversion.generation)
    acted = {f.rule for f in conversion.findings}
    assert acted <= allowed, f"{conversion.generation}: rules outside it acted: {sorted(acted - allowed)}"


@pytest.mark.parametrize("case", sorted(MIXED))
def test_a_file_mixing_generations_is_converted_as_the_generation_it_reports(case):
    framework, generation, code = MIXED[case]
    conversion = convert(textwrap.dedent(code).lstrip().encode(), f"{case}.py", Options(batch="global"))
    assert (conversion.framework, conversion.generation) == (framework, generation)
    _assert_agrees(conversion, framework)
    legacy = generation in REGISTRY[framework].rule_set().VOCABULARY.legacy_generations
    if legacy and framework == "tensorflow":  # a TF1 graph file is left whole, with the reason
        assert conversion.output == conversion.original
        assert [f.severity for f in conversion.findings if f.rule == "tf-legacy-graph"] == ["declined"]
    if case == "tf-session-with-multi-gpu-model":
        [declined] = [f for f in conversion.findings if f.severity == "declined"]
        assert "multi_gpu_model" in declined.message and "tower" not in declined.message
    if case == "paddle-dygraph-with-build-strategy":  # the dygraph rules ran: the model and the loader are distributed
        assert b"dp.distributed_model(net)" in conversion.output and b"dp.distributed_loader(" in conversion.output


FIXTURE_FILES = sorted(FIXTURES.glob("*/*/before.py"))


@pytest.mark.parametrize("before", FIXTURE_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_fixture_reports_the_generation_its_rules_acted_on(before):
    conversion = convert(before.read_bytes(), "before.py", options(before.parent))
    if conversion.framework is None or conversion.framework not in REGISTRY:
        return
    _assert_agrees(conversion, conversion.framework)
