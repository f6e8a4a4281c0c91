"""A function that makes both the training and the validation loader: sharded for training, and said.

The issue 19 audit's ResNet-18 course (BR-IDL/PaddleViT, ``get_dataloader(dataset, bs, mode)``): its one
``DataLoader(...)`` is sharded because the training loop reads it, so the validation loop reads a share too and
printed rank 0's half ("val samples 16" for 32) while the report spoke only of training. The same in torch.
"""

from __future__ import annotations

import pytest
from rule_testing import convert_text, findings_of

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
FRAMEWORKS = {
    "torch": dict(framework="torch", loader_module="torch.utils.data", linear="torch.nn.Linear(4, 1)",
                  optimizer="torch.optim.SGD(model.parameters(), lr=0.1)"),
    "paddle": dict(framework="paddle", loader_module="paddle.io", linear="paddle.nn.Linear(4, 1)",
                   optimizer="paddle.optimizer.SGD(parameters=model.parameters())"),
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_loader_helper_feeding_training_and_validation_is_sharded_and_the_validation_share_said(framework):
    result = convert_text(SCRIPT.format(**FRAMEWORKS[framework]))
    assert "return dp.distributed_loader(DataLoader(" in result.output.decode()
    rule = "shard-training-loader" if framework == "torch" else "paddle-shard-training-loader"
    [note] = findings_of(result, rule, "note")
    assert "does not train (line 18)" in note.message and "this rank's figure" in note.message
    assert "build the evaluation loader apart" in note.fix
