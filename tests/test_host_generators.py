"""``dp.init()`` gives every rank rank 0's state of Python's ``random`` and NumPy's global generator (torch, Paddle).

Issue 19 audit, round F: awesome-DeepLearning's word2vec subsamples its corpus with unseeded ``random`` in a local
module, after ``dp.init()``; each rank kept a different number of samples, made a different number of steps, and
the job aborted in an all-reduce (gloo timeout, SIGABRT). With the states shared at ``init``, what a script draws
afterwards is drawn alike on every rank, rank 0 as the original would; draws before ``init`` stay each rank's.
Real 2-process jobs through ``dpmigrate launch``; unlaunched, ``init`` leaves both generators untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

JOB = """\
    import json, random, sys
    import numpy as np
    import dpmigrate.runtime.{framework} as dp

    before = [random.random(), float(np.random.rand())]
    states = [hash(random.getstate()), hash(np.random.get_state()[1].tobytes())]
    role = dp.init()
    kept = [hash(random.getstate()), hash(np.random.get_state()[1].tobytes())]
    after = [random.random(), float(np.random.rand()), random.sample(range(1000), 5)]
    with open("draws.%d.json" % role.rank, "w") as f:
        json.dump({{"before": before, "after": after, "unchanged": states == kept}}, f)
    """


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_",
                                                                     "TORCHELASTIC", "FLAGS_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(args, cwd):
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_draws_after_init_are_alike_on_every_rank_and_rank_0_keeps_its_own_state(framework, tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB.format(framework=framework)))
    _run(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "120", "job.py"],
         tmp_path)
    rank0, rank1 = (json.loads((tmp_path / f"draws.{r}.json").read_text()) for r in (0, 1))
    assert rank0["before"] != rank1["before"]  # unseeded: each rank's own, before init
    assert rank0["after"] == rank1["after"]  # after init: rank 0's draws on every rank
    assert rank0["unchanged"] and not rank1["unchanged"]  # rank 0's own state: the original's stream


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_unlaunched_init_leaves_both_generators_as_they_were(framework, tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB.format(framework=framework)))
    _run(["job.py"], tmp_path)
    assert json.loads((tmp_path / "draws.0.json").read_text())["unchanged"]
