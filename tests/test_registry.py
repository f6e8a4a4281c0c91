"""The registry is the only place that ties a framework to the engine: a new framework is a folder
of rules plus one entry, and no engine change (the toy framework in ``toy_rules/``)."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Options
from dpmigrate.frameworks import REGISTRY, Framework, framework_of_package

TOY_SCRIPT = textwrap.dedent('''\
    import toyfw
    from toyfw import save as store

    net = toyfw.Net()
    for step in range(3):
        net.loss().learn()
        print("step", step)
    store(net.weights(), "net.toy")
''')

CONVERTED = textwrap.dedent('''\
    import toyfw
    import dpmigrate.runtime.toyfw as dp

    dp.init()
    net = toyfw.Net()
    for step in range(3):
        net.loss().learn()
        dp.print("step", step)
    dp.save(net.weights(), "net.toy")
''')


@pytest.fixture
def toy_framework(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setitem(REGISTRY, "toyfw", Framework("toyfw", ("toyfw",), "toy_rules"))
    yield
    sys.modules.pop("toy_rules", None)
    sys.modules.pop("toy_rules.toy_save", None)


def test_a_framework_added_through_the_registry_alone_is_converted_by_its_rules(toy_framework):
    result = convert(TOY_SCRIPT.encode(), "toy.py", Options())
    assert result.framework == "toyfw" and result.generation == "toy1"
    assert result.output.decode() == CONVERTED
    assert [(f.rule, f.severity) for f in result.findings] == [
        ("unused-import", "change"), ("init-runtime", "change"), ("main-process-print", "change"), ("toy-save", "change"),
    ]  # (`store`, the save's only use, replaced: its import goes)


def test_the_toy_frameworks_vocabulary_drives_detection_and_the_shared_checks(toy_framework):
    by_hand = convert(b"import toyfw.cluster\ntoyfw.cluster.sync()\n", "hand.py", Options())
    assert by_hand.output == b"import toyfw.cluster\ntoyfw.cluster.sync()\n"
    assert "written for data parallelism by hand" in by_hand.findings[0].message
    divergent = convert(textwrap.dedent('''\
        import toyfw
        import toyfw.cluster
        if toyfw.cluster.whoami() == 0:
            toyfw.cluster.sync()
    ''').encode(), "d.py", Options())
    assert [(f.rule, f.severity, f.line) for f in divergent.findings if f.severity == "error"] == [
        ("rank-divergent-code", "error", 4)]


def test_the_registry_knows_which_packages_mean_which_framework():
    assert framework_of_package("torchvision") == "torch"
    assert framework_of_package("keras") == "tensorflow"
    assert framework_of_package("paddle") == "paddle"
    assert framework_of_package("numpy") is None


def test_a_framework_without_rules_is_detected_and_left_alone(monkeypatch):
    """A registered framework whose folder has a vocabulary but no rules yet: files are detected, said to be
    unsupported, and returned byte for byte (how Paddle and TensorFlow started)."""
    from dpmigrate.codemod.vocabulary import Vocabulary

    rule_set = types.ModuleType("toy_vocabulary_only")
    rule_set.RULES = ()
    rule_set.VOCABULARY = Vocabulary(
        framework="toyold", display_name="ToyOld", runtime_module="dpmigrate.runtime.toyold",
        default_generation="v2", generations=(("toyold.session", "v1-graph"),),
    )
    monkeypatch.setitem(sys.modules, "toy_vocabulary_only", rule_set)
    monkeypatch.setitem(REGISTRY, "toyold", Framework("toyold", ("toyold",), "toy_vocabulary_only"))
    source = b"import toyold\nsess = toyold.session.Session()\n"
    result = convert(source, "p.py", Options())
    assert result.output == source
    assert result.generation == "v1-graph"
    assert "ToyOld (v1-graph) is not supported yet" in result.findings[0].message
