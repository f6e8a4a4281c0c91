"""Executed fixtures: the converted scripts really train on 2 processes like the original, checked by
``dpmigrate verify``.

For every fixture with an ``execute.json`` (CPU-runnable, synthetic data, fixed seeds):

- ``dpmigrate verify before.py -- --batch-size 32``: the original on one process against its ``--batch global``
  conversion on two launched processes (16 samples per rank per step), step by step: the parameters agree
  (1e-5) after every step, and at every step the ranks read disjoint halves of the original's batch (equal
  weights alone prove nothing: a job whose every rank reads the whole batch has them too). A fixture that
  cannot meet this says so in its ``execute.json`` (``verify``: the verdict and causes, and why), and the
  test holds it to exactly that (``tests/verify_cases.py``);
- the checked-in ``after.py`` still runs unlaunched (``python after.py``) and gives the original's
  parameters.

``execute.json`` may hold ``{"args": [...]}`` (extra arguments for every run; see ``tests/verify_cases.py`` for the
rest) and ``"unlaunched": false`` for a script that cannot run here or takes no ``--batch-size``/``--save`` (its
verify exemption says why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixture_cases import cases
from verify_cases import assert_as_expected, verify_fixture

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
def test_converted_fixture_on_two_processes_trains_like_the_original(case, tmp_path, monkeypatch):
    assert_as_expected(case, verify_fixture(case, tmp_path, monkeypatch))


UNLAUNCHED = [c for c in EXECUTABLE if json.loads((c / "execute.json").read_text()).get("unlaunched", True)]


@pytest.mark.slow
@pytest.mark.parametrize("case", UNLAUNCHED, ids=lambda c: c.name)
def test_converted_fixture_still_runs_unlaunched(case, tmp_path):
    extra = json.loads((case / "execute.json").read_text()).get("args", [])
    (tmp_path / "before.py").write_bytes((case / "before.py").read_bytes())
    (tmp_path / "after.py").write_bytes((case / "after.py").read_bytes())
    _python(["before.py", "--batch-size", "32", "--save", "a.pt", *extra], tmp_path)
    _python(["after.py", "--batch-size", "32", "--save", "c.pt", *extra], tmp_path)
    _assert_same_parameters(tmp_path / "a.pt", tmp_path / "c.pt")
