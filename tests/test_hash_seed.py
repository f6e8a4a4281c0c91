"""Every rank of a job hashes strings alike (issue 19 audit round I: an NNLM tutorial numbered its words with
``list(set(words))``; each rank of a launched job had its own hash seed, so its own word ids, and the job stalled
at 500 times the original's loss while the report said every rank computed the same gradients).

``dpmigrate launch`` gives every rank one PYTHONHASHSEED per job (derived from the run id: the same on every node);
``dp.init()`` tells a rank that hashes unlike rank 0 (ranks started by another launcher) what that breaks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dpmigrate.launch.cli import hash_seed
from dpmigrate.runtime.common import HASH_SEED_WARNING

JOBS = Path(__file__).parent / "jobs"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED" and not k.startswith(
        ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "PADDLE_", "TF_CONFIG", "GROUP_RANK"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _orders(text: str) -> dict[int, dict]:
    found = {}
    for line in text.splitlines():
        if "ORDER " in line:
            record = json.loads(line.split("ORDER ", 1)[1])
            found[record["rank"]] = record
    return found


def test_the_jobs_seed_comes_from_its_run_id_alone():
    assert hash_seed("a" * 32) == hash_seed("a" * 32) != hash_seed("b" * 32)
    assert 0 <= hash_seed("a" * 32) < 2**32  # what Python accepts


@pytest.mark.slow
def test_dpmigrate_launch_gives_every_rank_one_hash_seed_and_keeps_the_users(tmp_path):
    runs = []
    for given in (None, "1234"):
        env = _env() if given is None else _env(PYTHONHASHSEED=given)
        proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"),
                               str(JOBS / "hash_order.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        orders = _orders(proc.stdout)
        assert sorted(orders) == [0, 1]
        assert orders[0]["order"] == orders[1]["order"] and orders[0]["seed"] == orders[1]["seed"]
        assert HASH_SEED_WARNING not in proc.stdout + proc.stderr
        runs.append(orders[0]["seed"])
    assert runs[0] is not None and runs[1] == "1234"


def _by_hand(tmp_path, seeds):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(JOBS / "hash_order.py")], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONHASHSEED=seed,
                                       DPMIGRATE_TIMEOUT="60"))
             for rank, seed in enumerate(seeds)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    return outputs


@pytest.mark.slow
def test_a_rank_started_with_another_hash_seed_than_rank_0s_says_what_that_breaks(tmp_path):
    (out0, err0), (out1, err1) = _by_hand(tmp_path, ["1", "2"])
    assert _orders(out0)[0]["order"] != _orders(out1)[1]["order"]  # the premise: another order of the same set
    assert HASH_SEED_WARNING in err1 and HASH_SEED_WARNING not in err0
    (out0, err0), (out1, err1) = _by_hand(tmp_path, ["7", "7"])
    assert _orders(out0)[0]["order"] == _orders(out1)[1]["order"]
    assert HASH_SEED_WARNING not in err0 + err1


VOCABULARY = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
words = "apple pear plum fig kiwi lime date quince".split() * 4
vocabulary = list(set(words))  # numbered in the order of a set: the process's string hashing
ids = torch.tensor([vocabulary.index(w) for w in words])
targets = torch.linspace(0, 1, len(words))
loader = DataLoader(TensorDataset(ids, targets), batch_size=8)
embedding = torch.nn.Embedding(len(vocabulary), 3)
optimizer = torch.optim.SGD(embedding.parameters(), lr=0.5)
for x, y in loader:
    optimizer.zero_grad()
    loss = ((embedding(x).sum(1) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.slow
def test_verify_runs_the_original_and_the_conversion_with_one_hash_seed(tmp_path):
    """Unset, the original and each rank numbered the words their own way: verify blamed the conversion."""
    (tmp_path / "train.py").write_text(VOCABULARY)
    proc = subprocess.run([sys.executable, "-m", "dpmigrate", "verify", "-n", "2", "--steps", "4", "--to-end", "0", "train.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "equivalent" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
