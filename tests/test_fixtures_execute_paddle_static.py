"""Must show 3 for a converted script: the static-graph fixture, converted, trains on 2 processes.

``fixtures/paddle/static_mlp/before.py`` (``paddle.enable_static``, ``Executor``, ``minimize``, a batch
generator fed through ``exe.run(feed=...)``, ``paddle.static.save``): that its ``--batch global`` conversion
on 2 processes trains step by step like the original on one, each rank feeding 16 rows of every batch of 32,
is checked by ``dpmigrate verify`` (``test_fixtures_execute_paddle.py``, which runs every Paddle fixture with an
``execute.json``). Here: the converted job launched to the end (Paddle's launcher underneath, gloo on CPU;
on this CPU build the converted optimizer appends an ``all_reduce`` op per gradient, as Fleet's ``minimize``
fails on CPU in Paddle 3.3.1, and the startup program broadcasts rank 0's initial parameters) prints once and
writes one checkpoint, the checked-in conversion still runs unlaunched as the original, and unseeded ranks
end identical. The checkpoints are read here with ``pickle`` (they are this test's own files in
``tmp_path``: ``paddle.static.save`` writes a pickled dict of NumPy arrays); this process never imports paddle.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest
from fixture_cases import FIXTURES, run

CASE = FIXTURES / "paddle" / "static_mlp"
TIMEOUT = 300
pytestmark = pytest.mark.slow


def _python(args, cwd):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "PADDLE_", "FLAGS_", "TF_CONFIG", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _launch(script, args, cwd):
    return _python(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(cwd / "logs"), "--timeout", "120",
                    script, *args], cwd)


def _parameters(path):
    with open(path, "rb") as f:
        return pickle.load(f)  # noqa: S301 - written by this test's own run, in its tmp_path


def _largest_difference(expected, actual):
    assert sorted(expected) == sorted(actual)
    return max(float(np.abs(expected[k] - actual[k]).max()) for k in expected)


def test_converted_static_graph_fixture_writes_once_on_two_processes_and_still_runs_unlaunched(tmp_path):
    (tmp_path / "before.py").write_bytes((CASE / "before.py").read_bytes())
    (tmp_path / "after_global.py").write_bytes(run(CASE, batch="global").output)
    (tmp_path / "after.py").write_bytes((CASE / "after.py").read_bytes())
    _python(["before.py", "--batch-size", "32", "--save", "single/mlp"], tmp_path)
    _python(["before.py", "--epochs", "0", "--save", "initial/mlp"], tmp_path)
    started = time.perf_counter()
    job = _launch("after_global.py", ["--batch-size", "32", "--save", "two/mlp"], tmp_path)
    print(f"2-rank static-graph fixture job: {time.perf_counter() - started:.1f} s wall")
    assert job.stdout.count("epoch 1 step 4 loss") == 1  # dp.print: the main process only
    single, two, initial = (_parameters(tmp_path / d / "mlp.pdparams") for d in ("single", "two", "initial"))
    assert min(_largest_difference({k: single[k]}, {k: initial[k]}) for k in single) > 1e-3  # every tensor trained
    assert sorted(two) == sorted(single)  # (the same training, step by step: dpmigrate verify's test)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["mlp.json", "mlp.pdopt", "mlp.pdparams"]
    # the checked-in conversion (--batch per-device) still runs unlaunched, as the original
    _python(["after.py", "--batch-size", "32", "--save", "plain/mlp"], tmp_path)
    assert _largest_difference(single, _parameters(tmp_path / "plain" / "mlp.pdparams")) < 1e-6


def test_unseeded_static_graph_ranks_start_and_end_with_the_same_parameters(tmp_path):
    """Without paddle.seed two processes initialise different parameters (measured); the converted
    script's startup program broadcasts rank 0's, so both ranks end identical (each saves its own here)."""
    source = run(CASE, batch="global").output.decode()
    assert "paddle.seed(2024)\n" in source
    source = source.replace("paddle.seed(2024)\n", "")
    source += "paddle.static.save(main_program, f\"rank{dp.rank()}/mlp\")\n"  # every rank, its own files
    (tmp_path / "unseeded.py").write_text(source)
    _launch("unseeded.py", ["--batch-size", "32", "--save", "two/mlp"], tmp_path)
    rank0, rank1 = (_parameters(tmp_path / f"rank{r}" / "mlp.pdparams") for r in (0, 1))
    assert _largest_difference(rank0, rank1) == 0.0
