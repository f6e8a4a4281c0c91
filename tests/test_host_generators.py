"""``dp.init()`` gives every rank rank 0's state of Python's ``random`` and NumPy's global generator (torch, Paddle),
and the ranks' streams part again at a sharded training loader's first pass.

Issue 19 audit, round F: awesome-DeepLearning's word2vec subsamples its corpus with unseeded ``random`` in a local
module, after ``dp.init()``; each rank kept a different number of samples, made a different number of steps, and
the job aborted in an all-reduce (gloo timeout, SIGABRT). With the states shared at ``init``, what a script draws
afterwards is drawn alike on every rank, rank 0 as the original would; draws before ``init`` stay each rank's.
Real 2-process jobs through ``dpmigrate launch``; unlaunched, ``init`` leaves both generators untouched.

Issue 31, shape 1: with the states shared, a seeded GAN drew the same latent vectors on every rank during training,
and the step averaged one rank's noise N times over. Draws made before training stay alike (the data); from a
sharded training loader's first pass every rank but 0 draws its own, and rank 0 keeps the original's sequence. A
loop that splits no data (hand-cut batches every rank reads whole) keeps drawing alike: each rank's step must stay
the original's (a first version also parted at a wrapped model's forward and broke the dropout fix that seeds every
rank alike).
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


TRAINING_JOB = """\
    import json, random, sys
    import numpy as np
    import {framework} as fw
    import dpmigrate.runtime.{framework} as dp

    starts = sys.argv[1]  # what first shows that training began
    random.seed(1); np.random.seed(2); fw.{seed}(3)  # a seeded script: alike on every rank
    role = dp.init()
    data = {randn}(64, 4)  # drawn before training: the data, alike on every rank
    target = data.sum(1, keepdim=True)
    model = fw.nn.Linear(4, 1)
    model = dp.distributed_model(model)
    opt = dp.distributed_optimizer({optimizer})
    if starts == "loader":
        batches = dp.distributed_loader(fw.{io}.DataLoader(fw.{io}.TensorDataset({pair}), batch_size=8))
    else:  # cut by hand: every rank reads all of it
        batches = [(data[i:i + 8], target[i:i + 8]) for i in range(0, 64, 8)]


    def noise():  # per-step draws, from a helper: a latent vector, a label flip, a mixing weight
        return [{randn}(2).tolist(), float(np.random.rand()), random.random()]


    drawn = []
    for x, y in batches:
        drawn.append(noise())
        loss = fw.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        {clear}
    name = "%s.%s.json" % (starts, role.rank if role.world_size > 1 else "plain")
    with open(name, "w") as f:
        json.dump({{"data": data[:2].tolist(), "drawn": drawn}}, f)
    """

FRAMEWORK_PARTS = {
    "torch": dict(seed="manual_seed", randn="fw.randn", io="utils.data",  pair="data, target",
                  optimizer="fw.optim.SGD(model.parameters(), lr=0.1)", clear="opt.zero_grad()"),
    "paddle": dict(seed="seed", randn="(lambda *shape: fw.randn(list(shape)))", io="io", pair="[data, target]",
                   optimizer="fw.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())",
                   clear="opt.clear_grad()"),
}


@pytest.mark.parametrize("framework, starts", [("torch", "loader"), ("torch", "hand"), ("paddle", "loader"),
                                               ("paddle", "hand")])
def test_draws_part_at_a_sharded_loader_and_stay_alike_where_nothing_is_split(framework, starts, tmp_path):
    """The data drawn before training is alike everywhere; rank 0 draws what the unlaunched script draws. Read
    through a sharded loader, per-step draws (torch's or Paddle's generator, NumPy's, Python's, from a helper) differ
    between the ranks from the first batch; cut by hand, every rank reads every batch, through the same wrapped model
    and optimizer, and draws the original's numbers."""
    (tmp_path / "job.py").write_text(textwrap.dedent(TRAINING_JOB.format(framework=framework,
                                                                         **FRAMEWORK_PARTS[framework])))
    _run(["job.py", starts], tmp_path)
    _run(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "120", "job.py",
          starts], tmp_path)
    plain, rank0, rank1 = (json.loads((tmp_path / f"{starts}.{r}.json").read_text()) for r in ("plain", 0, 1))
    assert plain["data"] == rank0["data"] == rank1["data"]
    assert rank0["drawn"] == plain["drawn"][:len(rank0["drawn"])]
    if starts == "hand":
        assert rank1["drawn"] == rank0["drawn"] == plain["drawn"]
        return
    assert len(rank1["drawn"]) == len(rank0["drawn"]) == len(plain["drawn"]) // 2
    for step, (mine, theirs) in enumerate(zip(rank1["drawn"], rank0["drawn"])):
        assert all(a != b for a, b in zip(mine, theirs)), (step, mine, theirs)  # each generator: its own draws


def test_a_seeded_job_draws_the_same_numbers_from_one_launch_to_the_next(tmp_path):
    """Rank 1's new streams come from the script's seeds and its rank: a seeded job stays repeatable."""
    (tmp_path / "job.py").write_text(textwrap.dedent(TRAINING_JOB.format(framework="torch", **FRAMEWORK_PARTS["torch"])))
    runs = []
    for launch in ("a", "b"):
        _run(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / f"logs_{launch}"), "--timeout", "120",
              "job.py", "loader"], tmp_path)
        runs.append(json.loads((tmp_path / "loader.1.json").read_text())["drawn"])
    assert runs[0] == runs[1]
