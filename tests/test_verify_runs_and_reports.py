"""``dpmigrate verify`` on real project layouts and its reports: its scratch folder (small folders made anew, large
ones linked, the folder above mirrored within a budget), no new file in the user's folders, a project imported
through the folder above, the conversion's own words quoted, and each rank's last error first when a job fails.

Each test is a shape a real Paddle script showed in issue 19's audits, written as our own script;
``tests/paddle_audit_rounds.md`` keeps the rounds' notes on where each came from.
"""

from __future__ import annotations

import textwrap

import pytest
from paddle_shapes import ONE_SAMPLE
from verify_cases import causes, explain, verify


@pytest.mark.slow
def test_verify_runs_a_script_that_imports_its_project_through_the_folder_above(tmp_path, monkeypatch):
    """Round F (FCCDN_paddle): ``tools/train.py`` puts the project root on ``sys.path`` and imports ``tools.helper``;
    verify placed the converted copy where that root had no ``tools/`` and blamed the conversion."""
    tools = tmp_path / "project" / "tools"
    tools.mkdir(parents=True)
    (tools / "helper.py").write_text(textwrap.dedent("""\
        import numpy as np
        import paddle

        class Rows(paddle.io.Dataset):
            def __init__(self):
                draw = np.random.RandomState(3)
                self.x = draw.rand(32, 4).astype("float32")
                self.y = self.x.sum(1, keepdims=True)

            def __getitem__(self, i):
                return self.x[i], self.y[i]

            def __len__(self):
                return 32
        """))
    (tools / "train.py").write_text(textwrap.dedent("""\
        import os
        import sys
        sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from tools.helper import Rows
        import paddle

        paddle.seed(0)
        loader = paddle.io.DataLoader(Rows(), batch_size=8, shuffle=False)
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        for x, y in loader:
            paddle.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.clear_grad()
        """))
    data = verify(tmp_path / "project", monkeypatch, tools / "train.py", steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    assert data["comparison"]["data"]["split"] == 3, explain(data)


HAND_CUT = """\
    import numpy as np
    import paddle

    rows = np.arange(64, dtype="float32").reshape(16, 4) / 64
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for start in range(0, 16, 4):
        x = paddle.to_tensor(rows[start:start + 4])
        loss = (net(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
    """


@pytest.mark.slow
@pytest.mark.parametrize(("source", "steps", "quoted"), [
    (ONE_SAMPLE, 1, "(in its summary: no training data was sharded)"),
    (HAND_CUT, 3, "(train.py:7, paddle-manual-batching)"),
], ids=["one-broadcast-sample", "hand-cut-batches"])
def test_verify_quotes_the_conversion_where_it_said_nothing_is_split(source, steps, quoted, tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    data = verify(tmp_path, monkeypatch, script, steps=steps)
    assert data["verdict"] == "diverges" and causes(data) == ["not-sharded"], explain(data)
    assert data["headline"].endswith("as the conversion says (no speed-up, not a fault)"), explain(data)
    [cause] = data["comparison"]["causes"]
    assert cause["message"].startswith(f"as the conversion says {quoted}, every rank reads all the data"), explain(data)


WRITES_INTO_ITS_FOLDERS = """\
    import os

    import numpy as np
    import paddle

    here = os.path.dirname(os.path.abspath(__file__))
    rows = np.arange(32, dtype="float32").reshape(8, 4) / 32
    loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.to_tensor(rows)]), batch_size=4)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for (x,) in loader:
        net(x).mean().backward()
        opt.step()
        opt.clear_grad()
    paddle.save(net.state_dict(), "outputs/by_cwd.pdparams")
    paddle.save(net.state_dict(), os.path.join(here, "outputs", "by_file.pdparams"))
    paddle.save(net.state_dict(), os.path.join(here, "beside.pdparams"))
    """


@pytest.mark.slow
def test_verify_leaves_no_new_file_in_the_users_folders(tmp_path, monkeypatch):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "kept.txt").write_text("the user's")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(WRITES_INTO_ITS_FOLDERS))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    data = verify(tmp_path, monkeypatch, script, steps=2)
    assert data["verdict"] == "equivalent", explain(data)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.name != "verify.json")
    assert after == before and (tmp_path / "outputs" / "kept.txt").read_text() == "the user's"


def test_verify_s_scratch_folder_makes_small_folders_anew_and_links_large_ones(tmp_path):
    from dpmigrate.verify import runs

    user = tmp_path / "project"
    (user / "outputs" / "runs").mkdir(parents=True)
    (user / "outputs" / "kept.txt").write_text("the user's")
    (user / "data").mkdir()
    for i in range(runs.MIRRORED_ENTRIES + 1):
        (user / "data" / f"{i}.txt").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    scratch = runs.scratch_folder(work, "cwd", user)
    assert not (scratch / "outputs").is_symlink() and (scratch / "outputs" / "runs").is_dir()
    assert (scratch / "outputs" / "kept.txt").is_symlink() and (scratch / "outputs" / "kept.txt").read_text() == "the user's"
    assert (scratch / "data").is_symlink()  # a data set: linked whole
    (scratch / "outputs" / "runs" / "new.pdparams").write_text("")
    assert not (user / "outputs" / "runs" / "new.pdparams").exists()


def test_the_folder_above_is_mirrored_within_a_smaller_budget_than_the_working_one(tmp_path):
    """A parent that holds many small folders (the user's other projects; pytest's folder of every test) had each
    mirrored anew, up to 5,000 entries per placement: 21,000 links, 20 of 32 s of a small script's verify."""
    from dpmigrate.verify import runs

    user = tmp_path / "projects" / "mine"
    (user / "outputs").mkdir(parents=True)
    for i in range(200):  # siblings: 200 small projects of 3 entries each
        sibling = tmp_path / "projects" / f"other{i:03d}"
        (sibling / "src").mkdir(parents=True)
        (sibling / "a.txt").write_text("")
        (sibling / "b.txt").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    scratch = runs.scratch_folder(work, "cwd", user)
    assert not (scratch / "outputs").is_symlink()  # the working folder: mirrored as before
    made = [p for p in scratch.parent.iterdir() if p.name.startswith("other") and not p.is_symlink()]
    assert 0 < len(made) * 3 <= runs.PARENT_BUDGET < 200 * 3  # the first few siblings anew, then linked whole
    assert all((scratch.parent / f"other{i:03d}" / "a.txt").exists() for i in range(200))  # all still reachable


def test_a_failed_job_shows_each_rank_s_last_error_first(tmp_path):
    """Round O's skip-gram notebook: the tail of the converted run showed rank 0's gloo timeout, not rank 1's error."""
    from dpmigrate.verify import runs

    log = tmp_path / "converted.log"
    log.write_text("[rank1] Traceback (most recent call last):\n[rank1]   File \"train.py\", line 9\n"
                   "[rank1] UnboundLocalError: cannot access local variable 'f'\n"
                   + "".join(f"[rank0] waiting {i}\n" for i in range(40))
                   + "[rank0] Error Message Summary:\n[rank0] RuntimeError: gloo timeout after 60 s\n")
    run = runs.Run(1, 1.0, log)
    assert run.rank_errors() == ["rank 0: RuntimeError: gloo timeout after 60 s",
                                 "rank 1: UnboundLocalError: cannot access local variable 'f'"]
    assert not any("UnboundLocalError" in line for line in run.tail())  # scrolled out of the tail
