"""Executed Paddle fixtures: converted dygraph and high-level-API scripts really train on 2 processes.

For every ``fixtures/paddle/<case>`` with an ``execute.json`` (CPU, synthetic data, fixed seeds), as
``test_fixtures_execute.py`` does for torch:

- ``dpmigrate verify before.py -- --batch-size 32``: the original on one process against its ``--batch global``
  conversion on two (Paddle's own launcher underneath), step by step: the same parameters after every step
  (1e-5), and the ranks read disjoint halves of every batch of 32;
- the converted script launched to the end writes its checkpoint once, loadable into the original model, and
  prints exact metrics once; the checked-in ``after.py`` still runs unlaunched and gives the original's
  parameters.

``execute.json`` may hold ``own_test`` (the case is executed by that test instead), ``args`` (extra arguments
for every run), ``steps`` and ``verify`` (see ``tests/verify_cases.py``), ``save_arg`` (what ``--save`` is given,
``{}`` standing for the run's name; default ``"{}.pdparams"``; ``"{}"`` for ``paddle.Model.save``, which adds
the suffix itself), ``same_lines`` (words of printed lines that must read the same in the 2-rank run as in
the original: exact metrics of a sharded evaluation, all-reduced) and
``model`` (a Layer class of ``before.py``: the 2-rank checkpoint must load into it with exactly its keys),
``unlaunched`` (``false``: no write-once run, the script saves no ``--save`` checkpoint), ``verified_by``
(the verify run is that test's: the tutorials need their MNIST files made first) and
``not_executed`` (the reason a case the converter changes cannot run here: fluid 1.x, a package dpmigrate does
not install, a module that is no script). Every case the converter changes has one or the other (issue 22).

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
from verify_cases import assert_as_expected, verify_fixture

JOBS = Path(__file__).parent / "jobs"


def _spec(case: Path) -> dict:
    path = case / "execute.json"
    return json.loads(path.read_text()) if path.exists() else {}


RUNNABLE = [c for c in cases("paddle") if (c / "execute.json").exists() and "not_executed" not in _spec(c)]
# an own_test case runs there, with its own checks; "unlaunched": false (as for torch) when the script saves no
# --save checkpoint for the write-once check (its verify, 2 ranks against 1 step by step, still runs)
EXECUTABLE = [c for c in RUNNABLE if "own_test" not in _spec(c) and _spec(c).get("unlaunched", True)]
VERIFIED = [c for c in RUNNABLE if "verified_by" not in _spec(c)]  # the static graph's own test too
TIMEOUT = 300


def test_at_least_three_paddle_fixtures_are_executed():
    assert len(EXECUTABLE) >= 3, [c.name for c in EXECUTABLE]


def test_every_paddle_fixture_the_converter_changes_is_executed_or_says_why_not():
    """Issue 22: run on 2 ranks against 1 through verify (here or in the test ``verified_by`` names), or exempt
    with the reason in ``execute.json``."""
    for case in cases("paddle"):
        if run(case).output == (case / "before.py").read_bytes():
            continue  # left byte-identical: nothing to execute
        spec = _spec(case)
        assert spec, f"{case.name}: converted, but it has no execute.json (run it, or say why it cannot run)"
        if "not_executed" in spec:
            assert len(spec["not_executed"]) > 40, f"{case.name}: not_executed says why, in words"
        elif "verified_by" in spec:
            test = Path(__file__).parent.parent / spec["verified_by"]
            assert test.exists() and case.name in test.read_text(), f"{case.name}: {spec['verified_by']} verifies it"
        if "own_test" in spec:  # the test that executes it names it (a renamed or regrouped test file must follow)
            test = Path(__file__).parent.parent / spec["own_test"]
            assert test.exists() and case.name in test.read_text(), f"{case.name}: {spec['own_test']} executes it"


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


def _lines_with(output, words):
    """The printed lines holding one of ``words``, without the launcher's ``[rank0] `` prefix."""
    lines = [line.split("] ", 1)[1] if line.startswith("[rank") else line for line in output.splitlines()]
    return [line for line in lines if any(w in line for w in words)]


SAVED = "{}.pdparams"  # the checkpoint a run named {} writes


@pytest.mark.slow
@pytest.mark.parametrize("case", VERIFIED, ids=lambda c: c.name)
def test_converted_paddle_fixture_on_two_processes_trains_like_the_original(case, tmp_path, monkeypatch):
    assert_as_expected(case, verify_fixture(case, tmp_path, monkeypatch))


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_paddle_fixture_writes_once_on_two_processes_and_still_runs_unlaunched(case, tmp_path):
    extra, save_arg, model = _settings(case)
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after.py").write_bytes((case / "after.py").read_bytes())
    (tmp_path / "after_global.py").write_bytes(run(case, batch="global").output)

    original = _python(["before.py", "--batch-size", "32", "--save", save_arg.format("single"), *extra], tmp_path)
    _python(["after.py", "--batch-size", "32", "--save", save_arg.format("plain"), *extra], tmp_path)
    started = time.perf_counter()
    job = _launch("after_global.py", ["--batch-size", "32", "--save", save_arg.format("launched"), *extra], tmp_path)
    print(f"{case.name}: 2-rank converted job {time.perf_counter() - started:.1f} s wall")
    assert "all 2 ranks finished" in job.stderr
    same = json.loads((case / "execute.json").read_text()).get("same_lines", [])
    if same:  # printed once (the main process), with the original's values
        assert _lines_with(original.stdout, same) and _lines_with(job.stdout, same) == _lines_with(original.stdout, same)
    single, plain, launched = _arrays(tmp_path, *(SAVED.format(n) for n in ("single", "plain", "launched")))
    _assert_same_parameters(single, plain)  # the checked-in conversion, not launched: the original's run
    assert sorted(launched) == sorted(single)  # (1 process against 2, step by step: the verify test above)
    # one checkpoint, written whole: no temporary file is left beside it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("launched")) == [SAVED.format("launched")]
    if model:  # it loads into the original single-card model, with exactly that model's keys
        loaded = json.loads(_python([JOBS / "paddle_checkpoint.py", "load-into", "before.py", model,
                                     SAVED.format("launched")], tmp_path).stdout.strip().splitlines()[-1])
        assert loaded["saved"] == loaded["model"] and not loaded["missing"] and not loaded["unexpected"], loaded


# --- Must show 6: scripts written the way Paddle's own getting-started notebooks are ----------------------------

# the stand-in MNIST files (Paddle's reader takes whole hundreds): 800 / 64 = 13 batches per epoch on one
# process, 400 / 64 = 7 on each of 2 ranks
TRAIN_IMAGES, TEST_IMAGES = 800, 200


def _write_idx(path, magic, array):
    """An MNIST file as yann.lecun.com serves it: gzip of a big-endian header and the uint8 data."""
    import gzip
    import struct

    header = struct.pack(">II", magic, array.shape[0]) + b"".join(struct.pack(">I", d) for d in array.shape[1:])
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _local_mnist(source: str, folder: Path) -> str:
    """``source`` with its ``paddle.vision.datasets.MNIST(mode=...)`` reading small local files in MNIST's own
    format (the real files cannot be downloaded here): the same API, the same shapes, fewer images."""
    rng = np.random.RandomState(0)
    for mode, count in (("train", TRAIN_IMAGES), ("test", TEST_IMAGES)):
        labels = rng.randint(0, 10, size=count)
        images = rng.randint(0, 40, size=(count, 28, 28))
        for i, label in enumerate(labels):  # each digit lights its own band of rows
            images[i, 2 * label:2 * label + 6, 4:24] += 200
        _write_idx(folder / f"{mode}-images.gz", 2051, images)
        _write_idx(folder / f"{mode}-labels.gz", 2049, labels)
        old = f'MNIST(mode="{mode}"'
        assert source.count(old) == 1, old
        source = source.replace(old, f'MNIST(image_path="{folder / f"{mode}-images.gz"}", '
                                     f'label_path="{folder / f"{mode}-labels.gz"}", mode="{mode}"')
    return source


TUTORIALS = {
    # case: (the checkpoint it writes, what the 2-rank run prints that only a sharded run can)
    "tutorial_mnist": ("garments.pdparams", "epoch 1, batch 6,"),
    "tutorial_hapi": ("output/fashion.pdparams", "step 7/7"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TUTORIALS))
def test_tutorial_style_script_converts_with_no_manual_edit_and_trains_on_two_processes(name, tmp_path):
    """Must show 6: converted as is (no declined site, no error), launched on 2 ranks it trains on half of
    the data each (13 batches of 64 per epoch become 7 per rank) and writes its checkpoint once."""
    case = next(c for c in cases("paddle") if c.name == name)
    conversion = run(case)
    assert conversion.output == (case / "after.py").read_bytes()
    assert not [f for f in conversion.findings if f.severity in ("declined", "error")], conversion.findings
    (tmp_path / "data").mkdir()
    (tmp_path / "train.py").write_text(_local_mnist(conversion.output.decode(), tmp_path / "data"))

    started = time.perf_counter()
    job = _launch("train.py", [], tmp_path)
    print(f"{name}: 2-rank job {time.perf_counter() - started:.1f} s wall")
    checkpoint, sharded = TUTORIALS[name]
    assert "all 2 ranks finished" in job.stderr
    assert sharded in job.stdout, job.stdout[-3000:]
    if name == "tutorial_mnist":  # 7 batches per rank and epoch: batch 8 is never reached; printed once
        assert "batch 8," not in job.stdout and job.stdout.count("epoch 1, batch 6,") == 1
    else:  # one process would show 13 steps of 64 per epoch; the summary table is printed once
        assert "step 13/13" not in job.stdout and job.stdout.count("Total params") == 1
    [trained] = _arrays(tmp_path, checkpoint)
    assert trained and all(np.isfinite(v).all() for v in trained.values())
    leftovers = sorted(p.name for p in (tmp_path / checkpoint).parent.iterdir() if p.name.startswith("."))
    assert not leftovers, leftovers
