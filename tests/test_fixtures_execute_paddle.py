"""Executed Paddle fixtures: converted dygraph and high-level-API scripts really train on 2 processes.

For every ``fixtures/paddle/<case>`` with an ``execute.json`` (CPU, synthetic data, fixed seeds, no
shuffling, plain SGD), as ``test_fixtures_execute.py`` does for torch:

- the original ``python before.py --batch-size 32 --save a.pdparams`` runs on one process;
- ``before.py`` converted with ``--batch global`` runs as ``python -m dpmigrate.launch -n 2 ...`` (Paddle's
  own launcher underneath): each rank takes 16 of every 32 samples, so the final parameters must equal
  the original's to 1e-5;
- the checked-in ``after.py`` still runs unlaunched and gives the original's parameters.

``execute.json`` may hold ``args`` (extra arguments for every run), ``save_arg`` (what ``--save`` is given,
``{}`` standing for the run's name; default ``"{}.pdparams"``; ``"{}"`` for ``paddle.Model.save``, which adds
the suffix itself) and
``model`` (a Layer class of ``before.py``: the 2-rank checkpoint must load into it with exactly its keys).

One framework per process: the scripts run in subprocesses; checkpoints are read by
``tests/jobs/paddle_checkpoint.py``, and this module compares NumPy arrays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fixture_cases import cases, run

JOBS = Path(__file__).parent / "jobs"
EXECUTABLE = [c for c in cases("paddle") if (c / "execute.json").exists()]
TIMEOUT = 300


def test_at_least_three_paddle_fixtures_are_executed():
    assert len(EXECUTABLE) >= 3, [c.name for c in EXECUTABLE]


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "SLURM_", "OMPI_",
                                "PADDLE_", "TF_CONFIG", "GROUP_RANK", "FLAGS_"))}  # unlaunched: no launcher at all
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _python(args, cwd):
    done = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )
    return done


def _launch(script, args, cwd):
    return _python(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", cwd / "logs", "--timeout", "120", script, *args],
                   cwd)


def _arrays(tmp_path, *checkpoints):
    (tmp_path / "arrays").mkdir(exist_ok=True)
    outs = [tmp_path / "arrays" / f"{Path(c).name}.npz" for c in checkpoints]
    _python([JOBS / "paddle_checkpoint.py", "npz", *[x for pair in zip(checkpoints, outs) for x in pair]], tmp_path)
    result = []
    for out in outs:
        with np.load(out) as saved:
            result.append({k: saved[k] for k in saved.files})
    return result


def _assert_same_parameters(expected, actual):
    assert sorted(expected) == sorted(actual)
    for key in expected:
        worst = float(np.abs(expected[key] - actual[key]).max())
        assert worst < 1e-5, f"{key}: largest difference {worst:.3g}"


def _settings(case):
    settings = json.loads((case / "execute.json").read_text())
    return settings.get("args", []), settings.get("save_arg", "{}.pdparams"), settings.get("model")


SAVED = "{}.pdparams"  # the checkpoint a run named {} writes


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_paddle_fixture_on_two_processes_matches_the_original(case, tmp_path):
    extra, save_arg, model = _settings(case)
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after_global.py").write_bytes(run(case, batch="global").output)

    _python(["before.py", "--batch-size", "32", "--save", save_arg.format("single"), *extra], tmp_path)
    started = time.perf_counter()
    job = _launch("after_global.py", ["--batch-size", "32", "--save", save_arg.format("launched"), *extra], tmp_path)
    print(f"{case.name}: 2-rank converted job {time.perf_counter() - started:.1f} s wall")
    assert "all 2 ranks finished" in job.stderr
    single, launched = _arrays(tmp_path, SAVED.format("single"), SAVED.format("launched"))
    _assert_same_parameters(single, launched)
    # one checkpoint, written whole: no temporary file is left beside it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("launched")) == [SAVED.format("launched")]
    if model:
        loaded = json.loads(_python([JOBS / "paddle_checkpoint.py", "load-into", "before.py", model,
                                     SAVED.format("launched")],
                                    tmp_path).stdout.strip().splitlines()[-1])
        assert loaded["saved"] == loaded["model"] and not loaded["missing"] and not loaded["unexpected"], loaded


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_paddle_fixture_still_runs_unlaunched(case, tmp_path):
    extra, save_arg, _ = _settings(case)
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after.py").write_bytes((case / "after.py").read_bytes())
    _python(["before.py", "--batch-size", "32", "--save", save_arg.format("single"), *extra], tmp_path)
    _python(["after.py", "--batch-size", "32", "--save", save_arg.format("plain"), *extra], tmp_path)
    _assert_same_parameters(*_arrays(tmp_path, SAVED.format("single"), SAVED.format("plain")))
