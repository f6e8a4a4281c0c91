"""The Paddle runtime's model wrapper, ``dp.shard`` of Paddle tensors and a side-effect-free import (issue 19).

Each case runs in a Paddle-only subprocess (one framework per process); the 2-rank behaviour of the same code
is checked end to end by ``tests/test_verify_paddle_real.py`` and the ``two_models_one_layer`` fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _paddle(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RANK", "WORLD_SIZE", "FLAGS_"))}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_wrapper_reads_the_layers_attributes_and_methods_and_keeps_its_keys():
    out = _paddle("""
        import paddle
        from dpmigrate.runtime import _paddle_model

        class Net(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.fc = paddle.nn.Linear(3, 1)
                self.tag = "probe"
            def forward(self, x):
                return self.fc(x)
            def describe(self):
                return f"{self.tag} {self.fc.weight.shape[0]}"

        net = Net()
        wrapped = _paddle_model.forwarding(paddle.DataParallel(net))
        assert isinstance(wrapped, paddle.DataParallel) and wrapped._layers is net
        assert wrapped.fc is net.fc and wrapped.tag == "probe" and wrapped.describe() == "probe 3"
        assert sorted(wrapped.state_dict()) == sorted(net.state_dict()) == ["fc.bias", "fc.weight"]
        try:
            wrapped.missing
        except AttributeError as error:
            assert "missing" in str(error)
        else:
            raise AssertionError("an attribute neither has must still raise")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_to_static_on_the_wrapper_converts_the_layer_inside_so_it_can_be_exported(tmp_path):
    out = _paddle(f"""
        import os
        import paddle
        from dpmigrate.runtime import _paddle_model

        net = paddle.nn.Linear(3, 1)
        wrapped = _paddle_model.forwarding(paddle.DataParallel(net))
        spec = [paddle.static.InputSpec([None, 3], "float32", "x")]
        result = paddle.jit.to_static(wrapped, input_spec=spec, full_graph=True)
        assert result is wrapped and "forward" not in wrapped.__dict__  # the wrapper's own forward is kept
        assert type(net.forward).__name__.endswith("StaticFunction") and net.forward._input_spec == spec
        assert list(wrapped(paddle.ones([2, 3])).shape) == [2, 1]
        paddle.jit.save(net, {str(tmp_path / "exported")!r})  # what dp.unwrap(model) exports
        print(sorted(os.listdir({str(tmp_path)!r})))
    """)
    assert "exported.pdiparams" in out


def test_shard_takes_the_dense_tensors_a_static_graph_loader_yields():
    out = _paddle("""
        import numpy as np
        import paddle
        import dpmigrate.runtime.paddle as dp
        from dpmigrate.runtime._paddle_data import shardable

        paddle.enable_static()

        class Rows(paddle.io.Dataset):
            def __getitem__(self, i):
                return np.full([2], i, "float32"), np.zeros([1], "float32")
            def __len__(self):
                return 8

        x, _ = next(iter(paddle.io.DataLoader(Rows(), batch_size=4)()))
        assert not hasattr(x, "__len__")  # a DenseTensor: len() would raise TypeError
        part = dp.shard(x)  # one process: the whole batch, as an array Executor.run feeds
        assert isinstance(part, np.ndarray) and part.shape == (4, 2) and part[:, 0].tolist() == [0, 1, 2, 3]
        assert shardable([1, 2]) == [1, 2]
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_importing_the_runtime_changes_nothing_about_a_program_that_does_not_call_it():
    """Issue 19 item 3: no environment variable, no patched Paddle class, no collector setting, no Paddle module
    loaded beyond what ``import paddle`` loads; ``dp.init()`` launched is what keeps reducers alive."""
    out = _paddle("""
        import gc, os, sys
        import paddle

        environ, modules = dict(os.environ), set(sys.modules)
        init, collector = paddle.DataParallel.__init__, (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count())
        import dpmigrate.runtime.paddle as dp

        assert dict(os.environ) == environ
        assert paddle.DataParallel.__init__ is init
        assert (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()) == collector
        new = sorted(m for m in set(sys.modules) - modules if not m.startswith("dpmigrate"))
        assert not [m for m in new if m.split(".")[0] == "paddle"], new
        dp.init()  # not launched: starts nothing, patches nothing
        assert paddle.DataParallel.__init__ is init
        print("ok")
    """)
    assert out.strip().endswith("ok")


@pytest.mark.parametrize("times", [1, 2])
def test_keeping_reducers_alive_wraps_dataparallel_once(times):
    out = _paddle(f"""
        import paddle
        from dpmigrate.runtime import _paddle_model

        for _ in range({times}):
            _paddle_model.keep_reducers_alive()
        patched = paddle.DataParallel.__init__
        assert patched._dpmigrate_keeps_reducers and patched.__wrapped__.__name__ == "__init__"
        assert not getattr(patched.__wrapped__, "_dpmigrate_keeps_reducers", False)  # not wrapped twice
        paddle.DataParallel(paddle.nn.Linear(2, 1))  # one process: no reducer is built, nothing is kept
        assert _paddle_model._REDUCERS == []
        print("ok")
    """)
    assert out.strip().endswith("ok")
