"""``dpmigrate verify`` sees the ranks' files (issue 32, blind spot 5: "only parameters are compared").

A conversion whose weights match can still have every rank write one checkpoint, plot or log (they overwrite each
other), delete a folder outside its working folder (a Keras script's module-level ``tf.io.gfile.rmtree`` crashed 2
workers of 3 every time), or delete a file on the main process while the others list its folder with no barrier.
The harness records each process's file events and barriers (:mod:`dpmigrate.verify.harness.files`), the comparison
names the path and the script's line (:mod:`dpmigrate.verify.files`), and such a conversion "diverges" with cause
``files``; the right conversion of the same script stays "equivalent".

The fast tests check the comparison on hand-made records; the slow ones run real jobs (torch, Paddle, TensorFlow).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from dpmigrate.verify import files
from dpmigrate.verify.cli import main

CWD = "/w/converted-cwd/proj"
OUT = "/w/original-cwd/proj"


def _files(cwd: str, events: list[list], barriers: list[list[float]] | None = None, lands: str | None = None) -> dict:
    """A record's ``files``: events as the harness writes them, [kind, path, lands, step, time, line]."""
    return {"cwd": cwd, "cwd_lands": lands or cwd, "events": events, "barriers": barriers or [], "dropped": 0}


# --- the comparison on hand-made records ------------------------------------------------------------------------


def test_a_checkpoint_written_by_every_rank_is_a_clash_and_one_written_by_the_main_process_is_not():
    original = _files(OUT, [["write", f"{OUT}/ckpt/model.pt", f"{OUT}/ckpt/model.pt", 1, 10.0, "train.py:16"]])
    every = [_files(CWD, [["write", f"{CWD}/ckpt/model.pt", f"{CWD}/ckpt/model.pt", 1, 20.0 + r, "conv.py:18"]])
             for r in range(2)]
    assert files.check(original, every) == [
        "ckpt/model.pt is written by every rank (conv.py:18), where the original writes it from its one process: the "
        "ranks overwrite each other's file (a torn checkpoint, one rank's plot or log at random, in any order). Write "
        "it on the main process only (`if dp.is_main_process():`, or dp.save(...) for a checkpoint), or give each rank "
        "a name of its own"]
    main_only = [every[0], _files(CWD, [])]
    assert files.check(original, main_only) == []
    own_names = [_files(CWD, [["write", f"{CWD}/log-{r}.txt", f"{CWD}/log-{r}.txt", 0, 20.0, "conv.py:9"]])
                 for r in range(2)]
    assert files.check(original, own_names) == []


def test_a_write_through_a_link_of_the_scratch_folder_says_where_it_lands():
    ranks = [_files(CWD, [["write", f"{CWD}/data/plot.png", "/home/u/data/plot.png", 0, 5.0, "conv.py:30"]])
             for _ in range(3)]
    (message,) = files.check(_files(OUT, []), ranks)
    assert message.startswith("data/plot.png is written by every rank (conv.py:30) (through a link of the scratch "
                              "folder, into /home/u/data: your own folder), which the original never writes: ")


def test_deletes_by_several_ranks_count_outside_the_working_folder_only():
    outside = [_files(CWD, [["delete", "/tmp/t/cache", "/tmp/t/cache", 0, 3.0, "conv.py:7"]]) for _ in range(2)]
    inside = [_files(CWD, [["delete", f"{CWD}/tmp", f"{CWD}/tmp", 0, 3.0, "conv.py:7"]]) for _ in range(2)]
    original = _files(OUT, [["delete", "/tmp/t/cache", "/tmp/t/cache", 0, 1.0, "train.py:6"]])
    (message,) = files.check(original, outside)
    assert message.startswith("/tmp/t/cache, outside the run's working folder, is deleted by every rank (conv.py:7), "
                              "where the original deletes it from its one process: the ranks race to delete it")
    assert files.check(original, inside) == []


def test_a_delete_on_one_rank_and_a_listing_on_another_race_unless_a_barrier_both_passed_parts_them():
    deleting = [["delete", f"{CWD}/data/stale.txt", f"{CWD}/data/stale.txt", 0, 10.0, "conv.py:8"],
                ["list", f"{CWD}/data", f"{CWD}/data", 0, 10.5, "conv.py:10"]]
    listing = [["list", f"{CWD}/data", f"{CWD}/data", 0, 10.2, "conv.py:10"]]
    unordered = [_files(CWD, deleting, [[5.0, 5.1]]), _files(CWD, listing, [[5.0, 5.1]])]
    assert files.check(_files(OUT, []), unordered) == [
        "rank 0 deletes data/stale.txt (conv.py:8) while rank 1 lists its folder (conv.py:10) with no barrier between "
        "them: whether rank 1 finds it, whole or half-written, is down to timing (the original does one after the "
        "other). Call dp.barrier() on every rank between the two (after the delete, before the list)"]
    # rank 0 enters its 2nd barrier after deleting, rank 1 leaves its 2nd barrier before listing: ordered
    ordered = [_files(CWD, deleting, [[5.0, 5.1], [10.1, 10.3]]), _files(CWD, listing, [[5.0, 5.1], [10.05, 10.19]])]
    assert files.check(_files(OUT, []), ordered) == []
    # the listing came first, then both met: ordered the other way
    before = [_files(CWD, deleting, [[9.0, 9.5]]), _files(CWD, [["list", f"{CWD}/data", f"{CWD}/data", 0, 8.0,
                                                                  "conv.py:4"]], [[8.5, 9.5]])]
    assert files.check(_files(OUT, []), before) == []


def test_a_folder_each_rank_creates_itself_before_listing_it_is_no_race():
    ranks = [_files(CWD, [["mkdir", f"{CWD}/out", f"{CWD}/out", 0, 1.0 + r, "conv.py:3"],
                          ["list", f"{CWD}/out", f"{CWD}/out", 0, 1.5 + r, "conv.py:4"]]) for r in range(2)]
    assert files.check(_files(OUT, []), ranks) == []
    only_main = [ranks[0], _files(CWD, [["list", f"{CWD}/out", f"{CWD}/out", 0, 1.2, "conv.py:4"]])]
    (message,) = files.check(_files(OUT, []), only_main)
    assert message.startswith("rank 0 creates out (conv.py:3) while rank 1 lists it (conv.py:4) with no barrier")


def test_a_folder_deleted_while_another_rank_reads_a_file_inside_is_a_race():
    ranks = [_files(CWD, [["delete", "/data/cache", "/data/cache", 0, 2.0, "conv.py:5"]]),
             _files(CWD, [["read", "/data/cache/a.npy", "/data/cache/a.npy", 0, 2.1, "conv.py:12"]])]
    (message,) = files.check(_files(OUT, []), ranks)
    assert message.startswith("rank 0 deletes /data/cache (conv.py:5) while rank 1 reads a folder it is in (conv.py:12)")


def test_records_made_before_file_events_and_a_single_rank_say_nothing():
    assert files.check({}, [{}, {}]) == []
    assert files.check({}, [_files(CWD, [["write", f"{CWD}/a", f"{CWD}/a", 0, 1.0, "c.py:1"]])]) == []


def test_many_races_are_counted_after_the_first_three():
    changes = [["write", f"{CWD}/f{i}", f"{CWD}/f{i}", 0, 1.0, f"conv.py:{i}"] for i in range(5)]
    reads = [["read", f"{CWD}/f{i}", f"{CWD}/f{i}", 0, 1.5, "conv.py:20"] for i in range(5)]
    messages = files.check(_files(OUT, []), [_files(CWD, changes), _files(CWD, reads)])
    assert len(messages) == 3 and messages[-1].endswith("(after the write, before the read) (2 more such pairs)")


# --- real runs --------------------------------------------------------------------------------------------------


def _verify(tmp_path, monkeypatch, original: str, converted: str | None, *args: str, steps: str = "3") -> dict:
    """Verify the original against ``converted`` (None: dpmigrate's own conversion); its JSON report."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent(original))
    against = []
    if converted is not None:
        folder = tmp_path / "converted"
        folder.mkdir(exist_ok=True)
        (folder / "train.py").write_text(textwrap.dedent(converted))
        against = ["--against", str(folder / "train.py")]
    report = tmp_path / "verify.json"
    code = main(["train.py", *against, "-n", "2", "--steps", steps, "--timeout", "300", "--to-end", "0",
                 "--report", "json", "--report-file", str(report), "--", *args])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def _file_causes(data: dict) -> list[str]:
    return [c["message"] for c in (data["comparison"] or {}).get("causes", []) if c["kind"] == "files"]


def _explain(data: dict) -> str:
    causes = [f"{c['kind']}: {c['message']}" for c in (data["comparison"] or {}).get("causes", [])]
    return "\n".join([data["headline"], *causes, *data.get("details", [])])


def _line(text: str, needle: str) -> int:
    """The 1-based line of ``needle`` in the dedented script."""
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


TORCH_ORIGINAL = '''
    """A linear fit: a checkpoint and a CSV of the loss after every step (3 steps)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(96, 4)
    y = x.sum(1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        torch.save(model.state_dict(), "model.pt")
        with open("loss.csv", "a") as f:
            f.write(f"{step},{loss.item()}\\n")
'''

TORCH_START = '''
    """The conversion."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import dpmigrate.runtime.torch as dp

    dp.init()
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    y = x.sum(1, keepdim=True)
    loader = dp.distributed_loader(DataLoader(TensorDataset(x, y), batch_size=dp.per_rank_batch_size(32)))
    model = dp.distributed_model(torch.nn.Linear(4, 1))
    opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for step, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
'''

TORCH_EVERY_RANK = TORCH_START + '''\
        torch.save(model.module.state_dict(), "model.pt")
        with open("loss.csv", "a") as f:
            f.write(f"{step},{loss.item()}\\n")
'''

TORCH_MAIN_ONLY = TORCH_START + '''\
        dp.save(model.state_dict(), "model.pt")
        if dp.is_main_process():
            with open("loss.csv", "a") as f:
                f.write(f"{step},{loss.item()}\\n")
'''


@pytest.mark.slow
def test_a_checkpoint_and_a_csv_written_by_every_torch_rank_are_caught_and_the_right_conversion_is_equivalent(
        tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, TORCH_ORIGINAL, TORCH_EVERY_RANK)
    assert data["verdict"] == "diverges", _explain(data)
    assert data["comparison"]["max_difference"] < 1e-5 and data["comparison"]["first"] is None  # the weights match
    assert "clash over files" in data["headline"]
    saved, logged = _file_causes(data)
    # torch.save to a path writes in C++ (no audit event): the harness's wrapper saw it
    assert saved.startswith(f"model.pt is written by every rank (train.py:{_line(TORCH_EVERY_RANK, 'torch.save(')}), "
                            "where the original writes it from its one process"), saved
    assert logged.startswith(f"loss.csv is written by every rank (train.py:{_line(TORCH_EVERY_RANK, 'open(')})"), logged
    right = _verify(tmp_path, monkeypatch, TORCH_ORIGINAL, TORCH_MAIN_ONLY)
    assert right["verdict"] == "equivalent", _explain(right)


DELETE_ORIGINAL = '''
    """Clears a cache folder outside the project at start; lists its data folder after removing a stale file."""
    import os
    import shutil
    import sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    CACHE = sys.argv[1]
    shutil.rmtree(CACHE, ignore_errors=True)
    os.makedirs(CACHE, exist_ok=True)
    os.remove("data/stale.txt")
    names = sorted(os.listdir("data"))
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
'''

DELETE_CONVERTED = '''
    """The conversion: {what}."""
    import os
    import shutil
    import sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import dpmigrate.runtime.torch as dp

    dp.init()
    CACHE = sys.argv[1]
{clear}
    if dp.is_main_process():
        os.remove("data/stale.txt")
{barrier}
    names = sorted(os.listdir("data"))
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    loader = dp.distributed_loader(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=dp.per_rank_batch_size(32)))
    model = dp.distributed_model(torch.nn.Linear(4, 1))
    opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
'''

CLEAR_EVERYWHERE = "    shutil.rmtree(CACHE, ignore_errors=True)\n    os.makedirs(CACHE, exist_ok=True)"
CLEAR_ON_MAIN = ("    if dp.is_main_process():\n        shutil.rmtree(CACHE, ignore_errors=True)\n"
                 "        os.makedirs(CACHE, exist_ok=True)\n    dp.barrier()")


@pytest.mark.slow
def test_an_outside_folder_deleted_by_every_rank_and_a_listing_racing_a_delete_are_caught(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    for name in ("a.txt", "stale.txt"):
        (tmp_path / "data" / name).write_text(name)
    cache = tmp_path.parent / f"{tmp_path.name}-outside" / "cache"  # outside the folder verify starts in
    broken = DELETE_CONVERTED.format(what="every rank clears the cache, no barrier after the stale file's removal",
                                     clear=CLEAR_EVERYWHERE, barrier="")
    data = _verify(tmp_path, monkeypatch, DELETE_ORIGINAL, broken, str(cache))
    assert data["verdict"] == "diverges", _explain(data)
    cleared, raced = _file_causes(data)
    assert cleared.startswith(f"{cache}, outside the run's working folder, is deleted by every rank "
                              f"(train.py:{_line(broken, 'shutil.rmtree(')}), where the original deletes it"), cleared
    assert raced.startswith(f"rank 0 deletes data/stale.txt (train.py:{_line(broken, 'os.remove(')}) while rank 1 lists "
                            f"its folder (train.py:{_line(broken, 'os.listdir(')}) with no barrier between them"), raced
    assert (tmp_path / "data" / "stale.txt").exists()  # the runs removed their scratch folder's link, not the file
    right = DELETE_CONVERTED.format(what="the main process clears and removes, then every rank meets",
                                    clear=CLEAR_ON_MAIN, barrier="    dp.barrier()")
    data = _verify(tmp_path, monkeypatch, DELETE_ORIGINAL, right, str(cache))
    assert data["verdict"] == "equivalent", _explain(data)


PADDLE_ORIGINAL = '''
    """A linear fit in Paddle, saved after every step (2 steps)."""
    import numpy as np
    import paddle
    from paddle.io import DataLoader, TensorDataset

    paddle.seed(0)
    x = np.random.RandomState(0).uniform(-1, 1, (64, 4)).astype("float32")
    data = TensorDataset([paddle.to_tensor(x), paddle.to_tensor(x.sum(1, keepdims=True))])
    loader = DataLoader(data, batch_size=32, shuffle=False)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for xb, yb in loader:
        paddle.nn.functional.mse_loss(net(xb), yb).backward()
        opt.step()
        opt.clear_grad()
        paddle.save(net.state_dict(), "net.pdparams")
'''

PADDLE_CONVERTED = '''
    """The conversion."""
    import numpy as np
    import paddle
    from paddle.io import DataLoader, TensorDataset
    import dpmigrate.runtime.paddle as dp

    dp.init()
    paddle.seed(0)
    x = np.random.RandomState(0).uniform(-1, 1, (64, 4)).astype("float32")
    data = TensorDataset([paddle.to_tensor(x), paddle.to_tensor(x.sum(1, keepdims=True))])
    loader = dp.distributed_loader(DataLoader(data, batch_size=dp.per_rank_batch_size(32), shuffle=False))
    net = dp.distributed_model(paddle.nn.Linear(4, 1))
    opt = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()))
    for xb, yb in loader:
        paddle.nn.functional.mse_loss(net(xb), yb).backward()
        opt.step()
        opt.clear_grad()
        {save}(net.state_dict(), "net.pdparams")
'''


@pytest.mark.slow
def test_paddle_save_on_every_rank_is_caught_and_dp_save_is_equivalent(tmp_path, monkeypatch):
    broken = PADDLE_CONVERTED.replace("{save}", "paddle.save")
    data = _verify(tmp_path, monkeypatch, PADDLE_ORIGINAL, broken, steps="2")
    assert data["verdict"] == "diverges", _explain(data)
    (saved,) = _file_causes(data)
    assert saved.startswith(f"net.pdparams is written by every rank (train.py:{_line(broken, 'paddle.save(')})"), saved
    data = _verify(tmp_path, monkeypatch, PADDLE_ORIGINAL, PADDLE_CONVERTED.replace("{save}", "dp.save"), steps="2")
    assert data["verdict"] == "equivalent", _explain(data)


KERAS_ORIGINAL = '''
    """A Keras fit that clears its log folder (absolute, outside the project) at module level with tf.io.gfile."""
    import sys

    import numpy as np
    import tensorflow as tf

    LOGS = sys.argv[1]
    try:
        tf.io.gfile.rmtree(LOGS)
    except tf.errors.NotFoundError:
        pass
    tf.io.gfile.makedirs(LOGS)
    tf.keras.utils.set_random_seed(1)
    x = np.random.default_rng(4).uniform(-1, 1, (64, 3)).astype("float32")
    y = x @ np.array([[0.7], [-1.3], [2.1]], dtype="float32")
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False)
'''

# dpmigrate's own --batch global conversion leaves the clearing to every worker (the blind spot's Keras script);
# by hand: on the main process only, then every worker meets
KERAS_RIGHT = '''
    """The conversion, the clearing on the main process only."""
    import sys

    import numpy as np
    import tensorflow as tf
    import dpmigrate.runtime.tensorflow as dp

    dp.init()
    dp.enter_scope()
    LOGS = sys.argv[1]
    if dp.is_main_process():
        try:
            tf.io.gfile.rmtree(LOGS)
        except tf.errors.NotFoundError:
            pass
        tf.io.gfile.makedirs(LOGS)
    dp.barrier()
    tf.keras.utils.set_random_seed(1)
    x = np.random.default_rng(4).uniform(-1, 1, (64, 3)).astype("float32")
    y = x @ np.array([[0.7], [-1.3], [2.1]], dtype="float32")
    with dp.scope():
        model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    model = dp.distributed_model(model)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose="auto" if dp.is_main_process() else 0)
'''


@pytest.mark.slow
def test_a_module_level_tf_io_gfile_rmtree_left_to_every_worker_by_the_conversion_is_caught(tmp_path, monkeypatch):
    logs = tmp_path.parent / f"{tmp_path.name}-outside" / "logs"
    logs.mkdir(parents=True)
    data = _verify(tmp_path, monkeypatch, KERAS_ORIGINAL, None, str(logs), steps="2")
    assert data["verdict"] == "diverges", _explain(data)
    line = _line(KERAS_ORIGINAL, "tf.io.gfile.rmtree(") + 3  # the conversion adds 3 lines above it
    assert any(m.startswith(f"{logs}, outside the run's working folder, is deleted by every rank (train.py:{line})")
               for m in _file_causes(data)), _explain(data)
    data = _verify(tmp_path, monkeypatch, KERAS_ORIGINAL, KERAS_RIGHT, str(logs), steps="2")
    assert data["verdict"] == "equivalent", _explain(data)
