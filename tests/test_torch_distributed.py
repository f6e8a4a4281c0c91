"""The torch runtime on real 2-process gloo jobs started by `dpmigrate launch` (CPU).

Each test runs a job script from tests/jobs/ and checks what the ranks wrote. One framework per
process: the ranks import torch only; this test process imports torch to read their checkpoints.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.slow


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "SLURM_",
                                "OMPI_", "PADDLE_", "TF_CONFIG", "GROUP_RANK"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_single(script, *args, cwd):
    proc = subprocess.run([sys.executable, str(JOBS / script), *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def launch(script, *args, cwd, n=2, timeout=300, check=True, env=None):
    cmd = [sys.executable, "-m", "dpmigrate.launch", "-n", str(n), "--log-dir", str(Path(cwd) / "logs"),
           str(JOBS / script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def flat(path):
    return torch.cat([t.flatten() for t in torch.load(path).values()])


def test_two_ranks_with_half_batches_match_one_process(tmp_path):
    """Must show 1: plain SGD, 20 steps, batch 32 on 1 process == 2 ranks x 16: parameters to 1e-5."""
    run_single("torch_train.py", "--batch-size", "32", "--out", "single.pt", cwd=tmp_path)
    started = time.perf_counter()
    proc = launch("torch_train.py", "--batch-size", "32", "--out", "dist.pt", cwd=tmp_path)
    print(f"2-rank equivalence job: {time.perf_counter() - started:.1f} s wall")
    assert "on 2 process(es)" in proc.stdout
    assert proc.stdout.count("trained 20 steps") == 1  # dp.print: main process only
    single, dist = flat(tmp_path / "single.pt"), flat(tmp_path / "dist.pt")
    assert not torch.equal(single, flat_initial())  # training moved the weights
    assert torch.allclose(single, dist, atol=1e-5), (single - dist).abs().max()


def flat_initial():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    return torch.cat([t.flatten() for t in model.state_dict().values()])


def test_checkpoint_is_written_once_with_unwrapped_keys(tmp_path):
    """Must show 3 (2 ranks): the checkpoint loads strictly into the plain model: no `module.` keys."""
    launch("torch_train.py", "--steps", "2", "--count-saves", str(tmp_path / "saves"), "--out", "ckpt.pt",
           cwd=tmp_path)
    assert [(tmp_path / f"saves.rank{r}").read_text() for r in (0, 1)] == ["1", "0"]
    state = torch.load(tmp_path / "ckpt.pt")
    assert not any(k.startswith("module.") for k in state)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    plain.load_state_dict(state)  # strict
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "logs", "saves.rank0", "saves.rank1"]


def test_no_double_averaging_with_or_without_a_wrapped_model(tmp_path):
    """The optimizer all-reduces only what no DDP model owns: wrapped or not, the same trajectory."""
    launch("torch_train.py", "--steps", "6", "--out", "wrapped.pt", cwd=tmp_path)
    launch("torch_train.py", "--steps", "6", "--wrap-model", "no", "--out", "bare.pt", cwd=tmp_path)
    run_single("torch_train.py", "--steps", "6", "--out", "single.pt", cwd=tmp_path)
    single = flat(tmp_path / "single.pt")
    assert torch.allclose(flat(tmp_path / "wrapped.pt"), single, atol=1e-5)
    assert torch.allclose(flat(tmp_path / "bare.pt"), single, atol=1e-5)


def test_shards_are_disjoint_cover_the_data_and_reshuffle_every_epoch(tmp_path):
    """Must show 2: over 3 epochs the ranks' samples are disjoint per epoch and cover the dataset."""
    launch("torch_sharding.py", "--samples", "20", "--out", str(tmp_path / "seen"), cwd=tmp_path)
    ranks = [json.loads((tmp_path / f"seen.rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["batches"] == 4 for r in ranks)  # 10 samples a rank, batch 3
    orders = []
    for epoch in range(3):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert len(a) == len(b) == 10
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(20))
        orders.append(a + b)
    assert len({tuple(o) for o in orders}) == 3  # a new shuffle every epoch, without set_epoch


def test_uneven_dataset_pads_training_shards_to_equal_steps(tmp_path):
    launch("torch_sharding.py", "--samples", "21", "--out", str(tmp_path / "seen"), cwd=tmp_path)
    ranks = [json.loads((tmp_path / f"seen.rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in range(3):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert len(a) == len(b) == 11  # DDP needs every rank to take the same number of steps
        assert set(a) | set(b) == set(range(21)) and len(set(a) & set(b)) <= 1


@pytest.mark.parametrize("samples", [10, 11])
def test_distributed_evaluation_gives_exactly_the_single_process_metrics(tmp_path, samples):
    """Must show 4: 10 (and 11) samples, 2 ranks, batch 4: accuracy and loss exactly as on 1 process."""
    run_single("torch_metrics.py", "--samples", str(samples), "--out", "single.json", cwd=tmp_path)
    launch("torch_metrics.py", "--samples", str(samples), "--out", "dist.json", cwd=tmp_path)
    single = json.loads((tmp_path / "single.json").read_text())
    dist = json.loads((tmp_path / "dist.json").read_text())
    assert dist["seen"] == single["seen"] == samples  # no padded sample counted
    assert dist["correct"] == single["correct"]
    assert dist["accuracy"] == single["accuracy"]
    assert dist["loss"] == pytest.approx(single["loss"], abs=1e-6)
    assert dist["gathered"] == single["gathered"]


def test_gradient_accumulation_of_two_micro_batches_equals_one_double_batch(tmp_path):
    """Must show 6b: 2 micro-batches of 8 per rank == 1 batch of 16 per rank (no_sync + averaging)."""
    launch("torch_train.py", "--batch", "per-device", "--batch-size", "8", "--accumulation", "2",
           "--steps", "12", "--out", "accumulated.pt", cwd=tmp_path)
    launch("torch_train.py", "--batch", "per-device", "--batch-size", "16", "--steps", "6",
           "--out", "double.pt", cwd=tmp_path)
    assert torch.allclose(flat(tmp_path / "accumulated.pt"), flat(tmp_path / "double.pt"), atol=1e-5)


def test_localsgd_ranks_diverge_between_syncs_and_agree_right_after(tmp_path):
    """Must show 6a: LocalSGD k=4: parameters equal after steps 1, 5, 9 (averaged), different otherwise."""
    launch("torch_train.py", "--batch", "per-device", "--batch-size", "16", "--localsgd", "4",
           "--steps", "10", "--trace", str(tmp_path / "trace"), "--out", "local.pt", cwd=tmp_path)
    a, b = (json.loads((tmp_path / f"trace.rank{r}.json").read_text()) for r in (0, 1))
    averaged_after = [step for step in range(1, 11) if torch.allclose(torch.tensor(a[step - 1]),
                                                                      torch.tensor(b[step - 1]), atol=1e-7)]
    assert averaged_after == [1, 5, 9]


def test_fp16_gradient_compression_and_bucket_size_still_train_equivalently(tmp_path):
    run_single("torch_train.py", "--steps", "6", "--out", "single.pt", cwd=tmp_path)
    launch("torch_train.py", "--steps", "6", "--compression", "fp16", "--bucket-mb", "1", "--out", "fp16.pt",
           cwd=tmp_path)
    diff = (flat(tmp_path / "fp16.pt") - flat(tmp_path / "single.pt")).abs().max()
    assert 0 < diff < 1e-2  # half-precision all-reduce: close, not bit-equal


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
def test_a_killed_rank_ends_the_launched_job_with_a_message_naming_it(tmp_path):
    """Must show 5: rank 1 SIGKILLed mid-training: the job exits non-zero fast, naming rank 1."""
    started = time.perf_counter()
    proc = launch("torch_fault.py", "--victim", "1", cwd=tmp_path, check=False, timeout=120,
                  env=clean_env(DPMIGRATE_TIMEOUT="20"))
    elapsed = time.perf_counter() - started
    assert proc.returncode != 0
    assert elapsed < 40, f"took {elapsed:.0f} s"
    assert "dpmigrate launch: rank 1 failed (killed by SIGKILL)" in proc.stdout + proc.stderr
    assert "finished without noticing" not in proc.stdout


def start_ranks_by_hand(tmp_path, *args, timeout="20"):
    """Two ranks started the way Slurm or mpirun would: no torchrun agent, env:// rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = clean_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DPMIGRATE_TIMEOUT=timeout)
        procs.append(subprocess.Popen([sys.executable, str(JOBS / "torch_fault.py"), *args], cwd=tmp_path,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_surviving_rank_names_the_lost_rank_without_a_launcher(tmp_path, how):
    """Killed (socket closed) or frozen (only the 20 s timeout can tell): rank 0 says rank 1 was lost."""
    started = time.perf_counter()
    rank0, rank1 = start_ranks_by_hand(tmp_path, "--victim", "1", "--how", how)
    try:
        out, err = rank0.communicate(timeout=90)
    finally:
        if rank1.poll() is None:
            os.kill(rank1.pid, signal.SIGKILL)
        rank1.communicate()
    elapsed = time.perf_counter() - started
    assert rank0.returncode != 0, out + err
    assert "dpmigrate: rank 0 lost rank 1" in err, err[-3000:]
    assert elapsed < 60, f"took {elapsed:.0f} s"
