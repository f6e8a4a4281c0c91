"""Issue 19: the shapes of real Paddle scripts, as fixtures of our own, run to the end on 2 ranks.

``dpmigrate verify`` of every executed fixture (1 process against 2, step by step) is
``test_fixtures_execute_paddle.py``'s; it covers ``names_and_bindings`` (a name holding a ``paddle.Model``,
then a plain Layer trained in a helper, then a rebuilt model; a conditional ``enable_static``; a best-so-far
save), ``two_models_one_layer`` (both fits: 2 steps each, the first wrapper collected in between),
``static_loader_feed``, and the two whose point is the verdict their findings predict, run by verify only:
``random_samples_seeded`` (``inputs-differ``: each rank draws its own samples), ``hapi_summed_loss_early_stop``
(``scaled-update``) and
``manual_batches_shuffled`` (``not-sharded``: its shuffle made alike, the weights match). Here:

- the converted scripts launched to the end, past where verify stops: the export after ``paddle.jit.to_static``
  of the wrapped model (``jit.save(dp.unwrap(model))``), attribute and method reads through the wrapper, the
  static graph's checkpoint written once, ``trainer_factory``'s export;
- the notebook-style tutorials, which read MNIST, verified on small files in MNIST's own format.

The runs are subprocesses (verify's, the launcher's); this process imports no framework.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_cases import FIXTURES, run
from test_fixtures_execute_paddle import _local_mnist
from verify_cases import explain, verify

pytestmark = pytest.mark.slow

PADDLE = FIXTURES / "paddle"
TIMEOUT = 300


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "RANK", "WORLD_SIZE", "FLAGS_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _python(args, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, f"{args} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _launch(script, args, cwd) -> subprocess.CompletedProcess:
    done = _python(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", cwd / "logs", "--timeout", "120", script, *args], cwd)
    assert "all 2 ranks finished" in done.stderr
    return done


def _lines(output: str, word: str) -> list[str]:
    return [line.split("] ", 1)[-1] for line in output.splitlines() if word in line]


def test_names_and_bindings_runs_to_the_end_and_exports_the_layer_it_trained(tmp_path):
    """Past verify's 7 steps: the model read through its wrapper (``model.spread()``, ``model.out.bias``) prints
    the original's figures once, and the export of ``paddle.jit.to_static(model)`` is written once, by rank 0."""
    case = PADDLE / "names_and_bindings"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "train.py").write_bytes((case / "before.py").read_bytes())
    (two / "train.py").write_bytes(run(case, batch="global").output)
    original = _python(["train.py", "--export", "out/probe"], one)
    job = _launch("train.py", ["--export", "out/probe"], two)
    assert _lines(job.stdout, "spread") == _lines(original.stdout, "spread") and len(_lines(job.stdout, "spread")) == 1
    assert sorted(p.name for p in (two / "out").iterdir()) == ["probe.json", "probe.pdiparams"]
    assert sorted(p.name for p in two.iterdir() if p.name.startswith(("best", "."))) == ["best_probe.pdparams"]


def test_static_loader_feed_runs_to_the_end_and_saves_once(tmp_path):
    """A static program fed from a DataLoader (``DenseTensor`` batches), its fixed batch dimension made per rank,
    its early stop decided on the mean over the ranks: the job ends on both ranks and rank 0 saves."""
    case = PADDLE / "static_loader_feed"
    (tmp_path / "converted.py").write_bytes(run(case, batch="global").output)
    job = _launch("converted.py", ["--save", "out/sensor"], tmp_path)
    assert len(_lines(job.stdout, "epoch 2 loss")) == 1  # printed once: the main process
    # written once, whole (PIR writes the program as .json): no rank's temporary file or second copy beside it
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sensor.json", "sensor.pdopt", "sensor.pdparams"]


def test_trainer_factory_runs_to_the_end_and_exports_once(tmp_path):
    """Its verify is the fixtures' (3 steps); launched to the end, the trainer class's model is exported once."""
    (tmp_path / "converted.py").write_bytes(run(PADDLE / "trainer_factory", batch="global").output)
    _launch("converted.py", ["--batch-size", "32", "--out", "export"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["bow.json", "bow.pdiparams"]


@pytest.mark.parametrize("case", ["tutorial_mnist", "tutorial_hapi"])
def test_tutorial_is_equivalent_on_two_processes_with_its_batches_split(case, tmp_path, monkeypatch):
    """Issue 22: the tutorials (dygraph loop; ``paddle.Model.fit``) are verified too, on MNIST-format files made here."""
    (tmp_path / "data").mkdir()
    source = _local_mnist((PADDLE / case / "before.py").read_text(), tmp_path / "data")
    (tmp_path / "train.py").write_text(source)
    data = verify(tmp_path, monkeypatch, tmp_path / "train.py", steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 3 and check["sizes"] == [64, [32, 32]], explain(data)


def test_the_fixtures_this_module_verifies_say_so():
    for case in ("tutorial_mnist", "tutorial_hapi"):
        assert Path(__file__).name in (PADDLE / case / "execute.json").read_text()
