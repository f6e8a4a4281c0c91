"""The framework-free half of the contract (runtime/common.py), at world sizes a single process cannot reach.

Every backend delegates to these, so the policies and their errors are the same for torch, Paddle and TF.
"""

import threading

import pytest

from dpmigrate.runtime import common


@pytest.mark.parametrize("global_batch, world, per_rank", [(64, 1, 64), (64, 4, 16), (6, 3, 2)])
def test_per_rank_batch_size_splits_the_global_batch(global_batch, world, per_rank):
    assert common.per_rank_batch_size(global_batch, world) == per_rank


def test_an_uneven_global_batch_is_refused_with_a_multiple_to_use():
    with pytest.raises(ValueError, match=r"global batch size 30 does not split evenly over 4 processes; "
                                         r"pick a multiple of 4 \(e\.g\. 28\)"):
        common.per_rank_batch_size(30, 4)
    with pytest.raises(ValueError, match=r"pick a multiple of 8 \(e\.g\. 8\)"):
        common.per_rank_batch_size(3, 8)


def test_scale_lr_rules():
    assert common.scale_lr(0.1, 4) == pytest.approx(0.4)
    assert common.scale_lr(0.1, 4, "linear") == pytest.approx(0.4)
    assert common.scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    assert common.scale_lr(0.1, 4, "none") == 0.1
    with pytest.raises(ValueError, match="scale_lr\\(rule='cubic'\\): use 'linear', 'sqrt' or 'none'"):
        common.scale_lr(0.1, 4, "cubic")


def test_timeout_comes_from_the_argument_then_the_environment_then_the_default():
    assert common.timeout_seconds(30, {"DPMIGRATE_TIMEOUT": "5"}) == 30.0
    assert common.timeout_seconds(None, {"DPMIGRATE_TIMEOUT": "5"}) == 5.0
    assert common.timeout_seconds(None, {"DPMIGRATE_TIMEOUT": ""}) == 600.0
    assert common.timeout_seconds(None, {}) == 600.0


@pytest.mark.parametrize("text", ["soon", "0", "-3", "nan"])
def test_a_malformed_timeout_names_the_variable_and_the_fix(text):
    with pytest.raises(ValueError, match=f"DPMIGRATE_TIMEOUT={text!r}: give the collective timeout in seconds"):
        common.timeout_seconds(None, {"DPMIGRATE_TIMEOUT": text})


def test_timeout_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("DPMIGRATE_TIMEOUT", "42")
    assert common.timeout_seconds(None) == 42.0


def test_shard_indices_are_contiguous_disjoint_and_cover_everything():
    assert [common.shard_indices(10, r, 3) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [common.shard_indices(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_print_only_on_the_main_process(capsys):
    common.print_on_main_process(True, "a", 1, sep="-")
    common.print_on_main_process(False, "never")
    assert capsys.readouterr().out == "a-1\n"


def test_main_process_first_runs_rank_0s_block_before_the_others():
    """Three "ranks" as threads meeting at a real barrier: rank 0 finishes its block before any other starts."""
    meeting = threading.Barrier(3, timeout=30)
    events, lock = [], threading.Lock()

    def rank_body(rank):
        with common.main_process_first(lambda: rank, meeting.wait):
            with lock:
                events.append(("start", rank))
            if rank == 0:
                threading.Event().wait(0.2)  # the download: others must not start meanwhile
            with lock:
                events.append(("end", rank))

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in (2, 1, 0)]  # rank 0 started last
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert events[:2] == [("start", 0), ("end", 0)]
    assert sorted(events[2:]) == [("end", 1), ("end", 2), ("start", 1), ("start", 2)]
    assert meeting.n_waiting == 0 and not meeting.broken  # each rank passed exactly one barrier
