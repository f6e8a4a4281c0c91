"""Framework names a script takes from ``from utils import *`` of a local module are written out and converted.

ACGAN-Paddle (issue 19 audit) gets ``paddle`` from ``from utils import *``: its optimizers and ``paddle.save``
had no qualified name, so the loader was sharded while each rank trained its own networks, with nothing said
(verify: 0.025 apart after one step). Written out, the script converts fully; verify then finds it equivalent.
"""

from __future__ import annotations

import textwrap

import pytest
from verify_cases import explain, verify

from dpmigrate.cli import main

HELPERS = """
    import os
    import numpy as np
    import paddle
    import paddle.nn.functional as F


    def helper():
        import paddle.distributed  # indented: not a name the star import brings
        return os.getcwd()
    """
TRAIN = """
    import paddle.nn as nn
    from paddle.io import DataLoader, TensorDataset
    from helpers import *

    x = paddle.to_tensor(np.random.RandomState(0).rand(64, 8).astype("float32"))
    y = paddle.to_tensor(np.random.RandomState(1).rand(64, 1).astype("float32"))
    loader = DataLoader(TensorDataset([x, y]), batch_size=16, shuffle=False)
    net = nn.Linear(8, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for xb, yb in loader:
        loss = F.mse_loss(net(xb), yb)
        loss.backward()
        opt.step()
        opt.clear_grad()
    paddle.save(net.state_dict(), "net.pdparams")
    """


def _project(folder):
    (folder / "helpers.py").write_text(textwrap.dedent(HELPERS).lstrip())
    (folder / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    return folder / "train.py"


def test_the_framework_names_a_star_import_brings_are_written_out_and_the_script_converted(tmp_path, capsys):
    script = _project(tmp_path)
    main([str(script)])
    err = capsys.readouterr().err
    out = script.read_text()
    assert "from helpers import *\nimport paddle\nimport paddle.nn.functional as F\n" in out, out
    assert "net = dp.distributed_model(net)" in out and "dp.distributed_optimizer(paddle.optimizer.SGD(" in out
    assert 'dp.save(net.state_dict(), "net.pdparams")' in out
    assert "import paddle.distributed" not in out and "import numpy" not in out  # (indented; no framework)
    assert "train.py:3:1: change star-import-framework: `from helpers import *`" in err, err
    assert "train.py:7:10: change paddle-shard-training-loader" in err, err  # the original's line
    assert (tmp_path / "helpers.py").read_text() == textwrap.dedent(HELPERS).lstrip()
    main([str(script)])  # a second run changes nothing
    assert script.read_text() == out
    assert "0 changed" in capsys.readouterr().err


def test_a_module_declaring_all_or_a_script_binding_the_name_itself_gets_nothing_written(tmp_path, capsys):
    script = _project(tmp_path)
    (tmp_path / "helpers.py").write_text(textwrap.dedent(HELPERS).lstrip() + '\n__all__ = ["helper", "paddle"]\n')
    main(["--check", str(script)])
    assert "star-import-framework" not in capsys.readouterr().err
    (tmp_path / "helpers.py").write_text(textwrap.dedent(HELPERS).lstrip())
    script.write_text(textwrap.dedent(TRAIN).lstrip().replace("from helpers import *\n",
                                                             "from helpers import *\nimport paddle\n"))
    main(["--check", str(script)])
    err = capsys.readouterr().err
    assert "written out after it (import paddle.nn.functional as F)" in err, err


@pytest.mark.slow
def test_the_star_importing_script_trains_on_two_ranks_like_the_original(tmp_path, monkeypatch):
    script = _project(tmp_path)
    data = verify(tmp_path, monkeypatch, script, steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == 3 and check["split"] == 3, explain(data)
