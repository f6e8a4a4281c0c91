"""A function that makes both the training and the validation loader: sharded for training, and said.

The issue 19 audit's ResNet-18 course (BR-IDL/PaddleViT, ``get_dataloader(dataset, bs, mode)``): its one
``DataLoader(...)`` is sharded because the training loop reads it, so the validation loop reads a share too and
printed rank 0's half ("val samples 16" for 32) while the report spoke only of training. The same in torch.
"""

from __future__ import annotations

import pytest
from rule_testing import LOADER_FRAMEWORKS, convert_text, findings_of, loader_framework

from dpmigrate.cli import main

SCRIPT = '''\
    import {framework}
    from {loader_module} import DataLoader

    def get_dataloader(dataset, batch_size, mode):
        return DataLoader(dataset, batch_size=batch_size, shuffle=(mode == "train"))

    def main(train_set, val_set):
        train_loader = get_dataloader(train_set, 8, "train")
        val_loader = get_dataloader(val_set, 8, "val")
        model = {linear}
        opt = {optimizer}
        for epoch in range(2):
            for x, y in train_loader:
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                opt.step()
            total = 0.0
            for x, y in val_loader:
                total += float((model(x) - y).pow(2).sum())
            print(total)
    '''
FRAMEWORKS = {name: loader_framework(name, 1) for name in LOADER_FRAMEWORKS}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loader_helper_feeding_training_and_validation_is_sharded_and_the_validation_share_said(framework):
    result = convert_text(SCRIPT.format(**FRAMEWORKS[framework]))
    assert "return dp.distributed_loader(DataLoader(" in result.output.decode()
    rule = "shard-training-loader" if framework == "torch" else "paddle-shard-training-loader"
    [note] = findings_of(result, rule, "note")
    assert "does not train (line 18)" in note.message and "this rank's figure" in note.message
    assert "build the evaluation loader apart" in note.fix


DATASET_MODULE = '''\
from {loader_module} import DataLoader


def get_dataloader(dataset, batch_size, mode="train"):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=(mode == "train"))
    return loader
'''
TRAIN_SCRIPT = '''\
import {framework}
from dataset import get_dataloader


def validate(model, loader):
    total = 0.0
    for x, y in loader:
        total += float((model(x) - y).pow(2).sum())
    print(total)


def main(train_set, val_set):
    train_loader = get_dataloader(train_set, 8, mode="train")
    val_loader = get_dataloader(val_set, 8, mode="test")
    model = {linear}
    opt = {optimizer}
    for x, y in train_loader:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
    validate(model, val_loader)
'''


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_validation_share_is_said_where_the_loader_function_lives_in_a_local_module(framework, tmp_path, capsys):
    """PaddleViT's ResNet-18 class as it is laid out: ``get_dataloader`` in ``dataset.py``, the loops in
    ``train.py``. The module's DataLoader is sharded for training; the validation call in the script is said."""
    (tmp_path / "dataset.py").write_text(DATASET_MODULE.format(**FRAMEWORKS[framework]))
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT.format(**FRAMEWORKS[framework]))
    assert main(["--check", str(tmp_path / "train.py")]) == 1
    out = capsys.readouterr().err
    rule = "shard-training-loader" if framework == "torch" else "paddle-shard-training-loader"
    assert f"dataset.py:5:14: change {rule}: training DataLoader `loader`" in out
    [note] = [line for line in out.splitlines() if f"train.py:14:18: note {rule}" in line]
    assert "the loop reading it (line 7) does not train" in note and "this rank's figure" in note
    assert "train.py:13" not in out  # the training call says nothing of the kind
