"""The TensorFlow runtime on real 2-worker jobs started by ``dpmigrate launch -n 2`` (CPU, MultiWorkerMirroredStrategy).

One framework per process: the workers and the single-process runs import tensorflow; this test process
reads their .npz outputs with NumPy. Must show #1 at runtime level (tests/jobs/tf_train.py is written
by hand with dp.*): 1 process with global batch 32 versus 2 workers with 16 each, plain SGD, final
weights to 1e-5, for a GradientTape loop (as written, dp.distributed_optimizer), the tf.distribute way
(strategy.run, dp.loop) and Keras fit (model built and compiled under dp.scope()). The single process
runs on Keras 3, the workers on tf-keras (``dpmigrate launch`` sets TF_USE_LEGACY_KERAS=1): the same script.
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
LAUNCHER_PREFIXES = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "SLURM_", "OMPI_", "PADDLE_",
                     "TF_CONFIG", "GROUP_RANK", "DPMIGRATE_", "TF_USE_LEGACY_KERAS")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return {**env, **extra}


def run_single(*args, cwd, env=None):
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env or clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def launch(*args, cwd, expect=0, timeout=300, env=None):
    cmd = [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(Path(cwd) / "logs"), *args]
    started = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
    proc.ended = time.time()
    proc.wall = proc.ended - started
    if expect == 0:
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def weights(path):
    with np.load(path) as saved:
        return [saved[k] for k in saved.files]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The original: 1 process, global batch 32, Keras 3 (the three modes compute the same; tested once each
    by tests/tf_cases_single.py's bit-identity of dp.* and plain TF). Returns (final, initial) weights."""
    folder = tmp_path_factory.mktemp("single")
    run_single(str(JOBS / "tf_train.py"), "--mode", "tape", "--out", "single.npz", "--initial", "initial.npz",
               cwd=folder)
    return weights(folder / "single.npz"), weights(folder / "initial.npz")


def assert_two_workers_match_one_process(tmp_path, one_process, mode, *extra):
    proc = launch(str(JOBS / "tf_train.py"), "--mode", mode, "--out", "dist.npz", *extra, cwd=tmp_path)
    print(f"2-worker TF {mode} job: {proc.wall:.1f} s wall")
    assert proc.stdout.count("trained 12 steps on 2 worker(s)") == 1  # dp.print: the chief only
    assert "[rank0] trained 12 steps on 2 worker(s), model class from tf_keras" in proc.stdout
    (single, initial), dist = one_process, weights(tmp_path / "dist.npz")
    assert all(np.abs(s - i).max() > 1e-3 for s, i in zip(single, initial) if i.ndim == 2)  # training moved them
    worst = max(float(np.abs(s - d).max()) for s, d in zip(single, dist))
    assert worst < 1e-5, worst
    return proc


def test_gradient_tape_loop_as_written_on_two_workers_matches_one_process(tmp_path, one_process):
    assert_two_workers_match_one_process(tmp_path, one_process, "tape")


def test_strategy_run_loop_with_the_global_batch_loss_on_two_workers_matches_one_process(tmp_path, one_process):
    assert_two_workers_match_one_process(tmp_path, one_process, "loop")


def test_keras_fit_on_two_workers_matches_one_process_and_saves_one_loadable_model(tmp_path, one_process):
    """Must show #1 (fit) and #2 at runtime level: dp.save on every worker, one model at the real path."""
    assert_two_workers_match_one_process(tmp_path, one_process, "fit", "--save", "model.keras", "--report", "keras")
    reports = [json.loads((tmp_path / f"keras.rank{r}").read_text()) for r in (0, 1)]
    assert [r["legacy"] for r in reports] == ["1", "1"]  # set by dpmigrate launch, before TensorFlow was imported
    assert all(r["keras"].startswith("tf_keras") for r in reports)  # `from tensorflow import keras` is tf-keras
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist.npz", "keras.rank0", "keras.rank1", "logs",
                                                          "model.keras"]  # no temporaries
    load = ("import sys, json, numpy as np\nfrom tensorflow import keras\n"
            "m = keras.models.load_model('model.keras', compile=sys.argv[1] == 'compile')\n"
            "d = np.load('dist.npz')\n"
            "print(json.dumps(max(float(abs(a - d[k]).max()) for a, k in zip(m.get_weights(), d.files))))")
    # a fresh process with the workers' Keras, and one with the original script's Keras 3 (which cannot read
    # tf-keras's optimizer config: compile=False)
    loads = [subprocess.Popen([sys.executable, "-c", load, how], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for how, env in (("compile", clean_env(TF_USE_LEGACY_KERAS="1")), ("weights-only", clean_env()))]
    for proc in loads:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out.splitlines()[-1]) == 0.0


def test_every_collective_gives_every_worker_the_reduced_value(tmp_path):
    launch(str(JOBS / "tf_metrics.py"), str(tmp_path), cwd=tmp_path)
    expected = {"sum": 3, "mean": 1.5, "max": 2, "min": 1.5, "product": 6, "tensor_sum": [1.0, 20.0], "metric": 3.0,
                "gather": [0, 0, 1], "gather_objects": [{"rank": 0}, {"rank": 1}],
                "broadcast_object": "from rank 0", "broadcast_tensor": 6.0, "cache_seen": "filled by rank 0"}
    for r in (0, 1):
        assert json.loads((tmp_path / f"result.rank{r}").read_text()) == expected


def test_a_keras3_model_fit_on_two_workers_fails_naming_the_fix(tmp_path):
    """The user keeps Keras 3 (TF_USE_LEGACY_KERAS=0, which dpmigrate launch respects): fit would fail deep in
    Keras with a PerReplica error (keras-team/keras#20585); dp.distributed_model makes it say why and what to do."""
    proc = launch(str(JOBS / "tf_train.py"), "--mode", "fit", "--out", "dist.npz", cwd=tmp_path, expect=1,
                  env=clean_env(TF_USE_LEGACY_KERAS="0"))
    assert proc.returncode != 0
    assert "RuntimeError: Keras 3 model.fit() does not work under tf.distribute.MultiWorkerMirroredStrategy" in proc.stderr
    assert "export TF_USE_LEGACY_KERAS=1" in proc.stderr


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
def test_a_worker_killed_mid_run_ends_the_job_quickly_naming_it(tmp_path):
    proc = launch("--timeout", "20", str(JOBS / "tf_fault.py"), str(tmp_path), "kill", cwd=tmp_path, expect=1)
    killed_at = float((tmp_path / "killed.rank1").read_text())
    assert proc.returncode != 0
    print(f"killed worker: the job ended {proc.ended - killed_at:.1f} s after the kill")
    assert proc.ended - killed_at < 20 + 5, proc.ended - killed_at
    assert "dpmigrate launch: rank 1 failed (killed by SIGKILL); the other ranks were stopped" in proc.stderr


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
def test_a_worker_that_never_joins_ends_the_job_within_the_start_timeout_naming_it(tmp_path):
    proc = launch("--start-timeout", "10", str(JOBS / "tf_fault.py"), str(tmp_path), "never", cwd=tmp_path, expect=1)
    waited_from = float((tmp_path / "init.rank0").read_text())
    assert (tmp_path / "asleep.rank1").exists()
    assert proc.returncode != 0
    print(f"never-joining worker: the job ended {proc.ended - waited_from:.1f} s after worker 0 began to wait")
    assert proc.ended - waited_from < 10 + 5, proc.ended - waited_from
    assert "[rank0] dpmigrate: worker 0 waited 10 s for the other workers to join and gave up: worker 1 (127.0.0.1:" \
        in proc.stderr
    assert "never came up: nothing listens there" in proc.stderr
    assert "dpmigrate launch: rank 0 failed (killed by SIGKILL)" in proc.stderr


def test_keras_around_fit_on_two_workers_shuffles_alike_predicts_alone_and_saves_tf_checkpoints(tmp_path):
    """Issue 20 at runtime level (tests/jobs/tf_keras_after.py, dp.* by hand, tf-keras on 2 workers):
    - variables built outside any `with dp.scope():` (a sub-model, an optimizer) are the strategy's after
      dp.enter_scope(): dp.distributed_model accepts the wrapper that holds them and it trains;
    - Keras' own shuffle of NumPy inputs to fit and an unseeded Dataset.shuffle order the samples alike on every
      worker: each epoch the workers' shares are disjoint and cover the data (measured before: 118 of 256 samples
      read by both workers), and the order still changes between epochs; an unseeded ImageDataGenerator iterator
      gets the job's seed, the same on every worker;
    - 300 one-sample predictions of a Conv + BatchNormalization model (and 100 of a model never compiled, built
      after dp.enter_scope()) leave the thread count where it was (before: 4-10 more threads per call) and give
      the shapes Keras gives (1, a batch of 7 in batches of 4, a dataset);
    - save_weights without a suffix (TensorFlow's checkpoint format) through dp.save writes the checkpoint's files
      once and loads back exactly into a model rebuilt under the scope, as does a ModelCheckpoint's .weights.h5;
    - dp.chief_path: the real path on the chief, a private temporary one on the other worker."""
    launch(str(JOBS / "tf_keras_after.py"), str(tmp_path), cwd=tmp_path)
    first, second = (json.loads((tmp_path / f"result.rank{r}").read_text()) for r in (0, 1))
    assert first["made_before_the_model"] == second["made_before_the_model"] == "trained"
    for epoch in (0, 1):
        mine, theirs = set(first["numpy_epochs"][epoch]), set(second["numpy_epochs"][epoch])
        assert not mine & theirs and mine | theirs == set(range(256)), epoch
    assert first["numpy_epochs"][0] != first["numpy_epochs"][1]  # still reshuffled every epoch
    assert not set(first["dataset_epoch"]) & set(second["dataset_epoch"])
    assert set(first["dataset_epoch"]) | set(second["dataset_epoch"]) == set(range(256))
    assert first["image_iterator_seed"] == second["image_iterator_seed"] is not None  # ImageDataGenerator's shuffle
    for result in (first, second):
        assert result["threads_after"] <= result["threads_before"] + 2, result
        assert (result["one_shape"], result["seven_shape"], result["dataset_shape"]) == ([1, 3], [7, 3], [16, 3])
        assert result["tf_format_reloaded"] == 0.0 and result["checkpoint_reloaded"] == 0.0
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["checkpoint", "conv.data-00000-of-00001",
                                                                        "conv.index"]
    assert first["chief_path"] == str(tmp_path / "export")
    assert second["chief_path"] != first["chief_path"] and second["chief_path"].endswith("/export")
    assert not Path(second["chief_path"]).parent.exists()  # removed when the worker ended


def test_a_script_seeded_globally_shuffles_alike_on_every_worker_and_from_job_to_job(tmp_path):
    """The runtime seeds the script's unseeded shuffles alike on every worker; a script that set a global seed
    (keras.utils.set_random_seed) keeps the job-to-job repeatability it had on one process (before: a new first
    batch on every job, from worker 0's random seed)."""
    orders = []
    for job in ("first", "second"):
        out = tmp_path / job
        out.mkdir()
        launch(str(JOBS / "tf_seeded_shuffle.py"), str(out), cwd=tmp_path)
        orders.append([json.loads((out / f"order.rank{r}").read_text()) for r in (0, 1)])
    assert orders[0] == orders[1]
    zero, one = orders[0]
    assert len(set(zero + one)) == 12 and set(zero + one) <= set(range(64))  # one shuffled stream, split
    assert zero + one != list(range(12))  # shuffled at all
