"""Not launched, the torch runtime starts nothing and behaves exactly like the single-process code."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler  # noqa: E402

import dpmigrate.runtime.torch as dp  # noqa: E402

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
                      "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "SLURM_PROCID", "SLURM_NTASKS",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def not_launched(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dp._reset_for_tests()
    yield
    dp._reset_for_tests()


def test_init_without_launcher_is_rank_0_of_1_and_starts_nothing():
    role = dp.init()
    assert (role.rank, role.world_size, role.launcher) == (0, 1, "none")
    assert dp.init() is role  # idempotent
    assert not torch.distributed.is_initialized()
    assert (dp.rank(), dp.local_rank(), dp.world_size(), dp.is_main_process()) == (0, 0, 1, True)
    assert dp.device() == torch.device("cpu")


def test_init_twice_with_a_different_strategy_is_an_error():
    dp.init(dp.Strategy(bucket_size_mb=10))
    with pytest.raises(ValueError, match="already called"):
        dp.init(dp.Strategy(bucket_size_mb=20))


def test_hierarchical_allreduce_is_refused_not_ignored():
    with pytest.raises(dp.UnsupportedStrategy, match="hierarchical"):
        dp.init(dp.Strategy(hierarchical_allreduce=True))


def test_sync_batchnorm_unlaunched_leaves_the_model_as_it_is():
    dp.init(dp.Strategy(sync_batchnorm=True))
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert dp.distributed_model(model) is model and type(model[1]) is nn.BatchNorm1d


def test_sync_batchnorm_on_the_cpu_is_refused_naming_the_layers_and_a_model_without_them_is_kept():
    from dpmigrate.runtime._torch_model import synchronised_batchnorm

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(3, 4), nn.BatchNorm1d(4)

    with pytest.raises(dp.UnsupportedStrategy, match=r"CUDA devices only .* on cpu, .*layers \(norm\)"):
        synchronised_batchnorm(Net(), torch.device("cpu"))
    plain = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    assert synchronised_batchnorm(plain, torch.device("cpu")) is plain


def test_model_optimizer_and_loader_come_back_unchanged():
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4, shuffle=True)
    assert dp.distributed_model(model) is model
    assert dp.distributed_optimizer(optimizer) is optimizer and type(optimizer) is torch.optim.SGD
    assert dp.distributed_loader(loader) is loader
    assert dp.distributed_loader(loader, evaluation=True) is loader


def test_data_parallel_is_unwrapped_not_nested():
    inner = nn.Linear(3, 1)
    assert dp.distributed_model(nn.DataParallel(inner)) is inner


def test_collectives_are_identities_of_the_same_kind():
    t = torch.tensor([1.0, 2.0])
    assert dp.all_reduce(3) == 3 and dp.all_reduce(2.5, op="sum") == 2.5
    reduced = dp.all_reduce(t)
    assert torch.equal(reduced, t) and reduced is not t
    assert torch.equal(dp.all_gather(t), t)
    assert dp.all_gather({"a": 1}) == [{"a": 1}]
    assert dp.broadcast("x") == "x"
    dp.barrier()
    with pytest.raises(ValueError, match="op="):
        dp.all_reduce(1, op="avg")


def test_batch_and_learning_rate_policies():
    assert dp.per_rank_batch_size(64) == 64
    assert dp.scale_lr(0.1, "linear") == 0.1 and dp.scale_lr(0.1, "sqrt") == 0.1
    with pytest.raises(ValueError, match="rule="):
        dp.scale_lr(0.1, "cubic")
    assert dp.shard([1, 2, 3]) == [1, 2, 3]


def test_save_writes_atomically_and_loads_into_a_plain_module(tmp_path, capsys):
    path = tmp_path / "ckpt.pt"
    model = nn.Linear(3, 1)
    dp.save(model.state_dict(), path)
    fresh = nn.Linear(3, 1)
    fresh.load_state_dict(torch.load(path))
    assert torch.equal(fresh.weight, model.weight)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    dp.print("only once")
    assert capsys.readouterr().out == "only once\n"


def test_a_failing_save_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    dp.save({"version": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full, say")

    with pytest.raises(RuntimeError, match="disk full"):
        dp.save({"version": 2, "big": torch.zeros(100_000), "bad": Unpicklable()}, path)
    assert torch.load(path) == {"version": 1}
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    """A real crash: the process SIGKILLs itself while torch.save is writing the new checkpoint."""
    path = tmp_path / "ckpt.pt"
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, torch
        import dpmigrate.runtime.torch as dp
        class KillMidWrite:
            def __reduce__(self):
                os.kill(os.getpid(), signal.SIGKILL)
        dp.save({{"version": 1}}, {str(path)!r})
        dp.save({{"version": 2, "big": torch.ones(1_000_000), "bomb": KillMidWrite()}}, {str(path)!r})
    """))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert torch.load(path) == {"version": 1}
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".dpmigrate-tmp")]
    assert len(leftovers) == 1  # the dead writer's temporary; the target was never touched
    dp.save({"version": 3}, path)  # the next save removes the dead process's temporary
    assert torch.load(path) == {"version": 3}
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "crash.py"]


def test_main_process_first_runs_the_block():
    ran = []
    with dp.main_process_first():
        ran.append(1)
    assert ran == [1]
    with dp.scope():
        ran.append(2)
    assert ran == [1, 2]


def test_a_custom_sampler_or_iterable_dataset_is_refused_with_the_fix():
    ds = TensorDataset(torch.arange(6.0))
    weighted = DataLoader(ds, batch_size=2, sampler=WeightedRandomSampler([1.0] * 6, 6))
    from dpmigrate.runtime._torch_data import distributed_loader_for

    with pytest.raises(ValueError, match="DistributedSampler"):
        distributed_loader_for(weighted, 0, 2)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="IterableDataset"):
        distributed_loader_for(DataLoader(Stream()), 0, 2)


def test_loader_rebuilt_for_two_ranks_keeps_its_settings():
    from dpmigrate.runtime._torch_data import EpochAdvancingDistributedSampler, distributed_loader_for

    def collate(batch):
        return batch

    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=3, shuffle=True, drop_last=True,
                        collate_fn=collate, pin_memory=False)
    sharded = distributed_loader_for(loader, 1, 2)
    assert isinstance(sharded.sampler, EpochAdvancingDistributedSampler)
    assert (sharded.batch_size, sharded.drop_last, sharded.collate_fn) == (3, True, collate)
    assert sharded.sampler.shuffle and sharded.sampler.rank == 1
    assert distributed_loader_for(sharded, 1, 2) is sharded  # idempotent
    assert len(sharded) == 1  # 5 samples on this rank, batches of 3, the last dropped


def test_distributed_optimizer_accumulates_at_world_size_one():
    """Strategy(gradient_accumulation=2) steps every second call, with the mean of both gradients."""
    dp.init(dp.Strategy(gradient_accumulation=2))
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    twin = nn.Linear(3, 1)
    twin.load_state_dict(model.state_dict())
    opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(8, 3)
    for half in (x[:4], x[4:]):
        opt.zero_grad()
        model(half).pow(2).mean().backward()
        opt.step()
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    twin(x).pow(2).mean().backward()
    twin_opt.step()
    assert torch.allclose(model.weight, twin.weight, atol=1e-6)
    scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


RESET_PROBE = """
import json, sys
import torch, torch.distributed as dist
import dpmigrate.runtime.torch as dp
from dpmigrate.runtime import _torch_faults, _torch_model, _torch_teardown

def observe():
    model.require_backward_grad_sync = True
    model(torch.ones(1, 2))  # the first of 2 micro-batches: no gradient sync while an optimizer accumulates
    return {
        "role": dp._state.role is not None, "strategy": dp._state.strategy != dp.Strategy(),
        "broken": _torch_faults.job_is_broken(), "our excepthook": sys.excepthook is not original_hook,
        "wrapped models": len(_torch_model._wrapped_models),
        "distributed optimizers": len(_torch_model._distributed_optimizers),
        "syncs gradients": model.require_backward_grad_sync,
    }

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
original_hook = sys.excepthook  # torch's own, installed by init_process_group
dp.init(dp.Strategy(gradient_accumulation=2))
model = _torch_model.wrap_model(torch.nn.Linear(2, 1), dp.Strategy(), torch.device("cpu"))  # a real DDP of 1 rank
optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
_torch_faults.PeerMonitor.start(dp.role(), 5.0)  # heartbeat and excepthook on the group's store
sys.excepthook(RuntimeError, RuntimeError("Connection closed by peer"), None)  # what a lost peer raises
before = observe()
dp._reset_for_tests()
after = observe()
_torch_teardown.wait_for_idle_gloo_workers()
dist.destroy_process_group()
print(json.dumps({"before": before, "after": after}))
"""


def test_reset_for_tests_forgets_every_piece_of_the_backends_state(tmp_path):
    """In its own process (a real 1-rank gloo group): state set by real calls, then gone after the reset."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    proc = subprocess.run([sys.executable, "-c", RESET_PROBE], env=env, capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeError: Connection closed by peer" in proc.stderr  # the hook ran, then the diagnosis
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["before"] == {"role": True, "strategy": True, "broken": True, "our excepthook": True,
                                "wrapped models": 1, "distributed optimizers": 1, "syncs gradients": False}
    assert result["after"] == {"role": False, "strategy": False, "broken": False, "our excepthook": False,
                               "wrapped models": 0, "distributed optimizers": 0, "syncs gradients": True}


def test_save_takes_what_the_converted_torch_save_passes(tmp_path):
    """``torch.save(obj=..., f=..., pickle_protocol=2)`` is converted to ``dp.save(obj=..., path=..., ...)``."""
    target = tmp_path / "keywords.pt"
    dp.save(obj={"w": torch.ones(2)}, path=str(target), pickle_protocol=2)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(2))
