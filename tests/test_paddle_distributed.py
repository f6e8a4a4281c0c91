"""The Paddle runtime on real 2-process gloo jobs started by `dpmigrate launch` (Paddle's launcher underneath, CPU).

One framework per process: the ranks import paddle; this test process reads their .npz outputs with
NumPy and checks the checkpoint with a separate plain-Paddle process (tests/jobs/paddle_load.py).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

JOBS = Path(__file__).parent / "jobs"
pytestmark = pytest.mark.slow


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "SLURM_",
                                "OMPI_", "PADDLE_", "TF_CONFIG", "GROUP_RANK", "FLAGS_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_single(script, *args, cwd):
    proc = subprocess.run([sys.executable, str(JOBS / script), *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def launch(script, *args, cwd, n=2, env=None):
    cmd = [sys.executable, "-m", "dpmigrate.launch", "-n", str(n), "--log-dir", str(Path(cwd) / "logs"),
           str(JOBS / script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def parameters(path):
    with np.load(path) as saved:
        return {k: saved[k] for k in saved.files}


def test_two_ranks_with_half_batches_match_one_process(tmp_path):
    """Must show 1: an MLP with plain SGD, 20 steps, batch 32 on 1 process == 2 ranks x 16: to 1e-5."""
    run_single("paddle_train.py", "--batch-size", "32", "--out", "single.npz", cwd=tmp_path)
    run_single("paddle_train.py", "--steps", "0", "--out", "initial.npz", cwd=tmp_path)
    started = time.perf_counter()
    proc = launch("paddle_train.py", "--batch-size", "32", "--out", "dist.npz", cwd=tmp_path)
    print(f"2-rank Paddle equivalence job: {time.perf_counter() - started:.1f} s wall")
    assert proc.stdout.count("trained 20 steps on 2 process(es)") == 1  # dp.print: main process only
    assert "[rank0] trained 20 steps" in proc.stdout  # streamed, rank-prefixed
    single, dist, initial = (parameters(tmp_path / f) for f in ("single.npz", "dist.npz", "initial.npz"))
    assert sorted(single) == sorted(dist) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(np.abs(single[k] - initial[k]).max() > 1e-3 for k in single)  # training moved every tensor
    worst = max(float(np.abs(single[k] - dist[k]).max()) for k in single)
    assert worst < 1e-5, worst


def test_checkpoint_is_written_once_atomically_with_unwrapped_keys_even_with_empty_cuda_visible_devices(tmp_path):
    """Must show 2 (2 ranks): rank 0 alone writes it; it loads strictly into the plain single-card model;
    no temporary is left. The job runs with CUDA_VISIBLE_DEVICES="" in the user's environment, on which
    Paddle's own launcher dies (IndexError): dpmigrate launch removes the empty value."""
    proc = launch("paddle_train.py", "--steps", "2", "--checkpoint", "ckpt.pdparams",
                  "--count-saves", str(tmp_path / "saves"), cwd=tmp_path, env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert "all 2 ranks finished" in proc.stderr
    assert [(tmp_path / f"saves.rank{r}").read_text() for r in (0, 1)] == ["1", "0"]
    loaded = run_single("paddle_load.py", str(tmp_path / "ckpt.pdparams"), cwd=tmp_path)
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert result == {"keys": ["0.bias", "0.weight", "2.bias", "2.weight"], "missing": [], "unexpected": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pdparams", "logs", "saves.rank0", "saves.rank1"]


def test_static_graph_two_ranks_match_one_process(tmp_path):
    """Must show 3: a static-graph program (enable_static, Executor, minimize) on 2 ranks x 16 == 1 process
    x 32. On this CPU build dp.distributed_optimizer's minimize appends one all_reduce op per gradient
    (Fleet's own minimize fails on CPU in Paddle 3.3.1). dp.all_reduce and dp.save run when called, also
    in static mode (paddle.distributed would append them to the program instead)."""
    run_single("paddle_static_train.py", "--out", "single.npz", cwd=tmp_path)
    run_single("paddle_static_train.py", "--steps", "0", "--out", "initial.npz", cwd=tmp_path)
    proc = launch("paddle_static_train.py", "--out", "dist.npz", "--checkpoint", "static.pdparams", cwd=tmp_path)
    assert proc.stdout.count("trained 20 static-graph steps on 2 process(es)") == 1
    assert "[rank0] sum of rank + 1 over the ranks: 3\n" in proc.stdout  # dp's collectives run in static mode too
    single, dist, initial = (parameters(tmp_path / f) for f in ("single.npz", "dist.npz", "initial.npz"))
    assert sorted(single) == sorted(dist) == ["fc_0.b_0", "fc_0.w_0", "fc_1.b_0", "fc_1.w_0"]
    assert all(np.abs(single[k] - initial[k]).max() > 1e-3 for k in single)  # training moved every tensor
    worst = max(float(np.abs(single[k] - dist[k]).max()) for k in single)
    assert worst < 1e-5, worst
    loaded = run_single("paddle_load.py", str(tmp_path / "static.pdparams"), "--values", cwd=tmp_path)
    checkpoint = json.loads(loaded.stdout.strip().splitlines()[-1])  # written once by rank 0 through dp.save
    assert all(np.array_equal(np.array(checkpoint[k], dtype=np.float32), dist[k]) for k in dist)


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
def test_ranks_wait_for_rank_0_longer_than_gloos_30_s_in_main_process_first(tmp_path):
    """Paddle's gloo barrier fails after a fixed 30 s; dp's barriers wait on the job's store for the runtime's
    timeout instead, so a 35 s rank-0-only download inside main_process_first does not crash the job."""
    started = time.monotonic()
    proc = launch("paddle_slow_rank0.py", "35", "slow.pdparams", cwd=tmp_path)
    assert time.monotonic() - started > 35
    assert "[rank0] rank 0 waited for, job done" in proc.stdout
    assert (tmp_path / "slow.pdparams").is_file()
