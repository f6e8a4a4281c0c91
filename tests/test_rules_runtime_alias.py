"""Findings name the runtime by the alias the file binds it to, for every framework (issue 22).

A script that uses the name ``dp`` itself gets the runtime as ``dpr``; the rules write their messages with ``dp.``
and ``Rule.report`` (and the engine's coverage check) rewrite them, leaving quotes of the user's code as written.
"""

import pytest
from rule_testing import convert_text

from dpmigrate.codemod.rule import aliased

SOURCE = '''\
    import torch
    from torch.utils.data import DataLoader
    import settings as {name}


    class Trainer:
        def fit(self):
            optimizer = torch.optim.SGD(self.model.parameters(), lr={name}.lr)
            for x in {name}.batches(32):
                self.model(x).sum().backward()
                optimizer.step()


    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr={name}.lr)
    for x in DataLoader({name}.train_set, batch_size=32):
        model(x).sum().backward()
        optimizer.step()
    print("done")
    '''


def _report(result) -> list[tuple[int, str, str, str | None]]:
    return [(f.line, f.rule, f.message, f.fix) for f in result.findings]


def test_a_torch_script_using_the_name_dp_reads_the_runtime_as_dpr_in_every_finding():
    result = convert_text(SOURCE.format(name="dp"))
    assert "import dpmigrate.runtime.torch as dpr\n" in result.output.decode()
    assert _report(result) == [
        (6, "init-runtime", "dpr.init() at the entry point: joins the job the launcher started (nothing when run plainly)",
         None),
        (8, "distributed-model", "the model is held in an attribute (self....): cannot tell where it is built and placed",
         "where it is assigned and moved to its device, add `self.model = dpr.distributed_model(self.model)`"),
        (8, "distributed-optimizer", "SGD(...) -> dpr.distributed_optimizer(...)", None),
        (9, "coverage", "this training loop reads `dp.batches(32)` and nothing in the conversion shards it or says why: "
         "every rank would train on all of it (the engine's coverage check)",
         "pass the training data through dpr.distributed_loader(...) (a DataLoader or a tf.data.Dataset) or "
         "dpr.shard(...) (a sequence) where it is built, or tell dpmigrate about it by converting the module that "
         "builds it"),
        (14, "distributed-model", "model = dpr.distributed_model(model) after its set-up: DDP averages gradients "
         "across ranks", None),
        (15, "distributed-optimizer", "SGD(...) -> dpr.distributed_optimizer(...)", None),
        (16, "shard-training-loader", "training DataLoader sharded: dpr.distributed_loader gives each rank a disjoint "
         "part", None),
        (19, "main-process-print", "print -> dpr.print: printed once, by the main process", None),
    ]


def test_with_the_usual_alias_the_findings_are_the_same_texts_naming_dp():
    usual = _report(convert_text(SOURCE.format(name="cfg")))
    renamed = _report(convert_text(SOURCE.format(name="dp")))

    def back(text):
        return text and text.replace("dpr.", "dp.").replace("`dp.batches", "`cfg.batches")

    assert usual == [(line, rule, back(message), back(fix)) for line, rule, message, fix in renamed]


@pytest.mark.parametrize(("text", "expected"), [
    ("print -> dp.print: printed once", "print -> dpr.print: printed once"),
    ("add `model = dp.distributed_model(model)`", "add `model = dpr.distributed_model(model)`"),  # a suggestion
    ("this loop reads `dp.batches(32)`", "this loop reads `dp.batches(32)`"),  # the user's code, quoted
    ("this loop reads `dp.batches(...)`", "this loop reads `dp.batches(...)`"),  # quoted, elided
    ("dpr.init() and self.dp.x stay", "dpr.init() and self.dp.x stay"),
])
def test_dp_is_rewritten_outside_quotes_of_the_users_code(text, expected):
    source = "import settings as dp\nfor x in dp.batches(32):\n    pass\n"
    assert aliased(text, "dpr", source) == expected
