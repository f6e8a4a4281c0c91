"""Executed fixtures: the converted scripts really train on 2 processes and match the original.

For every fixture with an ``execute.json`` (CPU-runnable, synthetic data, fixed seeds, no dropout,
no shuffling, plain SGD):

- the original ``python before.py --batch-size 32 --save a.pt`` runs on one process;
- ``before.py`` converted with ``--batch global`` runs as ``python -m dpmigrate.launch -n 2
  after_global.py --batch-size 32 --save b.pt``: each rank takes 16 samples of every batch of 32,
  so the final parameters must equal the original's (to 1e-5);
- the checked-in ``after.py`` still runs unlaunched (``python after.py``) and gives the original's
  parameters too.

``execute.json`` may hold ``{"args": [...]}``: extra arguments for every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixture_cases import cases, run

EXECUTABLE = [c for c in cases("torch") if (c / "execute.json").exists()]
TIMEOUT = 300


def test_at_least_four_fixtures_are_executed():
    assert len(EXECUTABLE) >= 4, [c.name for c in EXECUTABLE]


def _python(args, cwd, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # the unlaunched runs must see no launcher
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )
    return done


def _parameters(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_same_parameters(expected_path, actual_path):
    import torch

    expected, actual = _parameters(expected_path), _parameters(actual_path)
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.allclose(expected[key], actual[key], rtol=0, atol=1e-5), (
            f"{key}: largest difference {(expected[key] - actual[key]).abs().max().item():.3g}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_fixture_on_two_processes_matches_the_original(case, tmp_path):
    extra = json.loads((case / "execute.json").read_text()).get("args", [])
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after_global.py").write_bytes(run(case, batch="global").output)

    _python(["before.py", "--batch-size", "32", "--save", "a.pt", *extra], tmp_path)
    _python(
        ["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "120",
         "after_global.py", "--batch-size", "32", "--save", "b.pt", *extra],
        tmp_path,
    )
    _assert_same_parameters(tmp_path / "a.pt", tmp_path / "b.pt")


@pytest.mark.slow
@pytest.mark.parametrize("case", EXECUTABLE, ids=lambda c: c.name)
def test_converted_fixture_still_runs_unlaunched(case, tmp_path):
    extra = json.loads((case / "execute.json").read_text()).get("args", [])
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after.py").write_bytes((case / "after.py").read_bytes())
    _python(["before.py", "--batch-size", "32", "--save", "a.pt", *extra], tmp_path)
    _python(["after.py", "--batch-size", "32", "--save", "c.pt", *extra], tmp_path)
    _assert_same_parameters(tmp_path / "a.pt", tmp_path / "c.pt")
