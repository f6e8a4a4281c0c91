"""``dp.unwrap`` and the wrapper-free saves of ``dp.save``, on real DDP objects in one process.

DDP needs a process group even on one rank: each test starts a 1-rank gloo group on a FileStore in
its own temporary folder (no socket) and ends it. ``dp`` itself is not launched (world size 1), so
``dp.save`` writes directly, exactly as rank 0 of a job does.
"""

import collections
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from test_torch_runtime_single import LAUNCHER_VARIABLES  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as TorchDDP  # noqa: E402

import dpmigrate.runtime.torch as dp  # noqa: E402

Pair = collections.namedtuple("Pair", "model epoch")


@pytest.fixture(autouse=True)
def one_rank_group(tmp_path, monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dp._reset_for_tests()
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
    dp._reset_for_tests()


def test_unwrap_returns_the_module_inside_ddp_dataparallel_and_the_runtimes_own_wrapper():
    plain = nn.Linear(3, 2)
    assert dp.unwrap(plain) is plain
    assert dp.unwrap(TorchDDP(plain)) is plain
    assert dp.unwrap(dp.DistributedDataParallel(plain)) is plain
    assert dp.unwrap(nn.DataParallel(plain)) is plain
    assert dp.unwrap(nn.DataParallel(nn.DataParallel(plain))) is plain  # every layer, not just one


def test_unwrap_leaves_a_model_that_merely_holds_a_wrapper_alone():
    outer = nn.Sequential(TorchDDP(nn.Linear(3, 2)))
    assert dp.unwrap(outer) is outer


def saved_types(path):
    return torch.load(path, weights_only=False)


def test_save_writes_the_module_inside_a_wrapper_given_alone_or_as_a_top_level_value(tmp_path):
    plain = nn.Linear(3, 2)
    wrapped = dp.DistributedDataParallel(plain)
    ordered = collections.OrderedDict(model=wrapped, epoch=4)
    cases = {
        "alone": (wrapped, lambda got: type(got) is nn.Linear),
        "dict": ({"model": wrapped, "epoch": 4}, lambda got: type(got["model"]) is nn.Linear and got["epoch"] == 4),
        "ordered": (ordered, lambda got: type(got) is collections.OrderedDict and list(got) == ["model", "epoch"]
                    and type(got["model"]) is nn.Linear),
        "list": ([wrapped, 4], lambda got: type(got) is list and type(got[0]) is nn.Linear and got[1] == 4),
        "tuple": ((4, wrapped), lambda got: type(got) is tuple and type(got[1]) is nn.Linear),
        "named": (Pair(wrapped, 4), lambda got: type(got) is Pair and type(got.model) is nn.Linear),
    }
    for name, (obj, check) in cases.items():
        dp.save(obj, tmp_path / f"{name}.pt")
        got = saved_types(tmp_path / f"{name}.pt")
        assert check(got), (name, got)
    assert ordered["model"] is wrapped  # the caller's object is not modified: a shallow copy was saved


def test_save_unwraps_one_level_only_as_documented(tmp_path):
    wrapped = dp.DistributedDataParallel(nn.Linear(3, 2))
    dp.save({"nested": {"model": wrapped}}, tmp_path / "nested.pt")
    assert isinstance(saved_types(tmp_path / "nested.pt")["nested"]["model"], TorchDDP)


def test_save_keeps_a_dataparallel_the_script_built_itself(tmp_path):
    dp.save(nn.DataParallel(nn.Linear(3, 2)), tmp_path / "dp.pt")
    assert type(saved_types(tmp_path / "dp.pt")) is nn.DataParallel


def test_a_saved_wrapped_model_loads_in_a_fresh_process_with_no_process_group(tmp_path):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(3, 2), nn.Tanh())
    dp.save(dp.DistributedDataParallel(plain), tmp_path / "whole.pt")
    torch.save(plain.state_dict(), tmp_path / "expected.pt")
    reader = textwrap.dedent("""
        import torch
        model = torch.load("whole.pt", weights_only=False)
        expected = torch.load("expected.pt")
        assert not torch.distributed.is_initialized()
        print(type(model).__qualname__, all(torch.equal(v, expected[k]) for k, v in model.state_dict().items()))
    """)
    done = subprocess.run([sys.executable, "-c", reader], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Sequential", "True"]
