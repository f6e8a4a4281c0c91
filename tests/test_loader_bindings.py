"""A loader's loops are the ones that read its binding of the name, not every loop over that name.

The Paddle autoencoder tutorial (issue 19 audit): ``data_reader`` is the training loader inside ``train()``; after
training, a module-level ``data_reader = DataLoader(ds, batch_size=1)`` scores every sample. Its name matched the
training loop's, so it was taken for a training loader: sharded, its batch size 1 split over the ranks (the
2-rank run failed under ``--batch global``) and its figure this rank's. The same with one name rebound in one
scope, in torch too.
"""

from __future__ import annotations

import pytest
from rule_testing import LOADER_FRAMEWORKS, convert_text, findings_of, loader_framework

SHADOWED = '''\
    import {framework}
    from {loader_module} import DataLoader

    def train(ds):
        model = {linear}
        opt = {optimizer}
        data_reader = DataLoader(ds, batch_size=16, shuffle=True)
        for x, y in data_reader:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
        return model

    model = train(DS)
    total_loss = []
    data_reader = DataLoader(DS, batch_size=1, shuffle=False)
    for x, y in data_reader:
        total_loss.append(float(((model(x) - y) ** 2).mean()))
    print(max(total_loss))
    '''
REBOUND = '''\
    import {framework}
    from {loader_module} import DataLoader

    model = {linear}
    opt = {optimizer}
    loader = DataLoader(DS, batch_size=16, shuffle=True)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    scores = []
    loader = DataLoader(DS, batch_size=1)
    for x, y in loader:
        scores.append(float(((model(x) - y) ** 2).mean()))
    '''
FRAMEWORKS = {name: loader_framework(name, 4) for name in LOADER_FRAMEWORKS}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("script", [SHADOWED, REBOUND], ids=["shadowed-in-a-function", "rebound"])
def test_the_scoring_loader_after_training_is_left_whole_and_only_the_training_one_is_split(framework, script):
    result = convert_text(script.format(**FRAMEWORKS[framework]), batch="global")
    out = result.output.decode()
    assert out.count("dp.distributed_loader(") == 1, out
    assert "dp.distributed_loader(DataLoader(ds, batch_size=dp.per_rank_batch_size(16)" in out.replace("DS", "ds"), out
    assert "batch_size=1" in out and "per_rank_batch_size(1)" not in out, out
    prefix = "" if framework == "torch" else "paddle-"
    [note] = findings_of(result, f"{prefix}evaluation-loader", "note")
    assert "left whole" in note.message


TRAINER = '''\
    import {framework}
    from {loader_module} import DataLoader


    class Runner:
        def __init__(self, model, opt):
            self.model, self.opt = model, opt

        def train_epoch(self, loader):
            for x, y in loader:
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward()
                self.opt.step()

        def train(self, train_loader, epochs):
            for _ in range(epochs):
                self.train_epoch(train_loader)


    def main():
        model = {linear}
        loader = DataLoader(DS, batch_size=16, shuffle=True)
        runner = Runner(model, {optimizer})
        runner.train(loader, 2)
    '''


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loader_handed_to_a_trainer_objects_methods_is_followed_into_them(framework):
    """image_classification_paddle (issue 19 audit): ``runner.train(train_loader)`` handing it on to
    ``self.train_epoch(train_loader)``; the loader was declined as one whose use could not be told."""
    result = convert_text(TRAINER.format(**FRAMEWORKS[framework]))
    assert "loader = dp.distributed_loader(DataLoader(DS, batch_size=16, shuffle=True))" in result.output.decode()
    prefix = "" if framework == "torch" else "paddle-"
    assert not findings_of(result, f"{prefix}shard-training-loader", "declined")
