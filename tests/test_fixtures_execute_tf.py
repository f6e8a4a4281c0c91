"""Executed TensorFlow fixtures: converted scripts really train on 2 workers (``dpmigrate launch -n 2``).

- Equivalence, for every fixture with an ``execute.json``, read as the torch and Paddle tests read theirs
  (``tests/verify_cases.py``): ``dpmigrate verify before.py -- --batch-size 32``, the original on one process
  against the ``--batch global`` conversion on 2 workers (16 samples each per step), step by step: the same
  weights after every step (1e-5) and the split of every batch proven (each ``train_step`` batch or dataset
  element fingerprinted). A fixture that cannot meet this carries its exemption, and the reason, in its
  ``execute.json``; one whose original cannot run on TF 2.21 (``multi_gpu_model``) is checked against its own
  conversion run plainly.
- Saving (Must show 2): the checkpointing fixture on 2 workers leaves exactly one model at the real
  path, loadable in a fresh single process, the checkpoints and logs of the chief, and no temporary
  folder of the other worker; the converted scripts that write an output write it once.
- The checked-in (per-device) conversion still runs unlaunched as the original.

Every run sets ``TF_USE_LEGACY_KERAS=1`` before Python starts, as ``dpmigrate launch`` does for its
workers: Keras 3's ``fit`` cannot run under ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585), and
the single-process reference must use the same Keras to write comparable weight files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_cases import FIXTURES
from verify_cases import assert_as_expected, verify_fixture

TIMEOUT = 300
CASES = FIXTURES / "tensorflow"


def _env():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
           "TF_USE_LEGACY_KERAS": "1", "CUDA_VISIBLE_DEVICES": ""}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"):
        env.pop(name, None)  # no launcher around the single-process runs
    return env


def _python(args, cwd):
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-6000:]}"
    )
    return done


def _launch(tmp_path, script, *args):
    return _python(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "240",
                    script, *args], tmp_path)


def _weights(path: Path) -> dict:
    import h5py

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: found.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    # layers' and optimizer's variables; a metric's running totals (sums over evaluate's batches, added in
    # another order on 2 workers) are not parameters
    return {name: value for name, value in found.items() if not name.startswith("metrics/")}


def _assert_same_weights(expected_path: Path, actual_path: Path) -> None:
    import numpy as np

    expected, actual = _weights(expected_path), _weights(actual_path)
    assert expected and expected.keys() == actual.keys()
    for key in expected:
        difference = float(np.max(np.abs(np.asarray(expected[key], dtype="float64") - actual[key]))) if np.size(
            expected[key]) else 0.0
        assert difference <= 1e-5, f"{key}: largest difference {difference:.3g}"


EXECUTABLE = sorted(c.parent for c in CASES.glob("*/execute.json"))


def test_at_least_six_tensorflow_fixtures_are_executed():
    assert len(EXECUTABLE) >= 6, [c.name for c in EXECUTABLE]


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_tf_fixture_on_two_workers_trains_like_the_original(case, tmp_path, monkeypatch):
    data = verify_fixture(case, tmp_path, monkeypatch)
    assert_as_expected(case, data)


@pytest.mark.slow
def test_the_checked_in_conversion_still_runs_unlaunched_as_the_original(tmp_path):
    case = CASES / "keras_sequential_fit"
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after.py").write_bytes((case / "after.py").read_bytes())
    _python(["before.py", "--batch-size", "32", "--weights", "a.weights.h5"], tmp_path)
    _python(["after.py", "--batch-size", "32", "--weights", "c.weights.h5"], tmp_path)
    _assert_same_weights(tmp_path / "a.weights.h5", tmp_path / "c.weights.h5")


@pytest.mark.slow
def test_checkpoints_and_final_model_are_written_once_and_load_in_a_fresh_process(tmp_path):
    case = CASES / "keras_callbacks_checkpoint"
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir()
    multi.mkdir()
    (single / "before.py").write_bytes((case / "before.py").read_bytes())
    (multi / "after.py").write_bytes((case / "after.py").read_bytes())
    _python(["before.py", "--epochs", "2", "--out-dir", "run"], single)
    done = _launch(multi, "after.py", "--epochs", "2", "--out-dir", "run")

    def written(root):
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    # the 2-worker job leaves exactly what the original leaves: one model, the chief's checkpoints, no
    # temporary folder or file of the other worker (the oracle is the unconverted script)
    assert "final.keras" in written(single / "run")
    assert written(multi / "run") == written(single / "run")
    assert sorted(p.name for p in multi.iterdir()) == ["after.py", "logs", "run"]
    assert done.stdout.count("saved [") == 1, done.stdout  # printed by the chief only
    _python(["-c", "import sys, numpy as np, tensorflow as tf; m = tf.keras.models.load_model(sys.argv[1]); "
             "assert m.predict(np.ones((2, 10), 'float32'), verbose=0).shape == (2, 1)", "run/final.keras"], multi)


@pytest.mark.slow
@pytest.mark.parametrize("case, args, output", [
    ("seed_multi_gpu", ["--gpus", "2", "--epochs", "1"], "template.keras"),
    ("keras2_standalone_imports", ["--synthetic", "--epochs", "1"], "cifar_cnn.h5"),
    ("custom_loop_tf_function_metrics", ["--epochs", "1"], "convnet.weights.h5"),
])
def test_converted_script_on_two_workers_writes_its_output_once(case, args, output, tmp_path):
    """(That these conversions train on 2 workers as on one, with zero edits: the verify test above.)"""
    (tmp_path / "after.py").write_bytes((CASES / case / "after.py").read_bytes())
    done = _launch(tmp_path, "after.py", *args)
    assert (tmp_path / output).is_file(), done.stdout[-3000:]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("after.py", "logs", output)]
    assert leftovers == [], leftovers


@pytest.mark.slow
def test_what_every_worker_writes_is_written_once_and_a_plain_run_writes_what_the_original_does(tmp_path):
    """Issue 20 (4): a CheckpointManager's checkpoints, a PNG written from an array, a SavedModel export. The
    original on one process, its conversion run plainly, and the conversion on 2 workers leave the same files:
    the chief's, once; nothing of the other worker's (its copies went to private temporary folders it removed)."""
    case = CASES / "custom_loop_chief_writes"
    runs = {name: tmp_path / name for name in ("original", "plain", "launched")}
    for folder in runs.values():
        folder.mkdir()
    (runs["original"] / "train.py").write_bytes((case / "before.py").read_bytes())
    for name in ("plain", "launched"):
        (runs[name] / "train.py").write_bytes((case / "after.py").read_bytes())
    _python(["train.py"], runs["original"])
    _python(["train.py"], runs["plain"])
    _launch(runs["launched"], "train.py")

    def written(root):
        return sorted(str(p.relative_to(root / "run")) for p in (root / "run").rglob("*"))

    assert "preview-1.png" in written(runs["original"]) and "export/saved_model.pb" in written(runs["original"])
    assert written(runs["plain"]) == written(runs["original"]) == written(runs["launched"])
    assert sorted(p.name for p in runs["launched"].iterdir()) == ["logs", "run", "train.py"]
