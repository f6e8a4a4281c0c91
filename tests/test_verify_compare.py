"""``dpmigrate verify``'s comparison on records written by hand: each cause is named from its evidence.

The records are what the harness writes (:mod:`dpmigrate.verify.dumps`): parameters after every step and
per-sample fingerprints per step. The trajectories below are made with NumPy: an "original" that takes
plain SGD steps, and conversions that are right, split nothing, scale the update, or let the ranks drift.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpmigrate.verify import compare, dumps

N = 2
SHAPES = {"o0.p0": (4, 3), "o0.p1": (4,)}
NAMES = {"o0.p0": "fc.weight", "o0.p1": "fc.bias"}


def _samples(step, count, start=0):
    return [f"s{step}-{i}" for i in range(start, start + count)]


def _write(folder, trajectory, inputs, rank=0, world=1, owner="Linear", batchnorm=()):
    folder.mkdir(parents=True, exist_ok=True)
    for k, params in enumerate(trajectory):
        np.savez(dumps.snapshot_file(folder, k), **params)
    dumps.Record(
        rank=rank, world_size=world, framework="torch",
        parameters=[dumps.Parameter(k, NAMES[k], list(s), owner) for k, s in SHAPES.items()],
        snapshots=list(range(len(trajectory))), steps=len(trajectory) - 1, optimizers=1,
        inputs=[None if i is None else dumps.Inputs("loader", {"0": i}) for i in inputs], stop="steps",
        batchnorm=list(batchnorm), changes=[]).write(folder)


def _trajectory(steps=3, scale=1.0, seed=0, start=None):
    rng = np.random.default_rng(seed)
    current = start or {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    out = [current]
    updates = np.random.default_rng(100)
    for _ in range(steps):
        current = {k: v - scale * 0.1 * updates.standard_normal(v.shape) for k, v in current.items()}
        out.append(current)
    return out


def _original_inputs(steps=3, batch=8):
    return [_samples(j, batch) for j in range(1, steps + 1)]


def _split_inputs(steps=3, batch=8):
    return [[_samples(j, batch // N, start=r * batch // N) for j in range(1, steps + 1)] for r in range(N)]


def _job(tmp_path, trajectories, inputs, **kw):
    for r in range(N):
        _write(dumps.rank_folder(tmp_path / "job", r), trajectories[r], inputs[r], rank=r, world=N, **kw)
    return tmp_path / "job"


def _single(tmp_path, trajectory=None, inputs=None, **kw):
    _write(dumps.rank_folder(tmp_path / "single", 0), trajectory or _trajectory(), inputs or _original_inputs(), **kw)
    return tmp_path / "single"


def _kinds(result):
    return [c.kind for c in result.causes]


def test_a_right_conversion_is_equivalent_with_the_split_proven(tmp_path):
    single = _single(tmp_path)
    job = _job(tmp_path, [_trajectory()] * N, _split_inputs())
    result = compare.compare(single, job, N, 1e-5)
    assert result.equivalent, result.causes
    assert (result.data.observed, result.data.split, result.data.sizes) == (3, 3, (8, [4, 4]))
    assert result.max_difference == 0.0 and result.steps == 3


def test_same_inputs_on_every_rank_is_caught_although_the_weights_match(tmp_path):
    single = _single(tmp_path)
    whole = [_original_inputs()] * N
    result = compare.compare(single, _job(tmp_path, [_trajectory()] * N, whole), N, 1e-5)
    assert not result.equivalent
    assert result.max_difference == 0.0
    assert _kinds(result) == ["not-sharded"]
    assert result.data.same == [1, 2, 3]


def test_half_the_update_is_named_a_summed_loss(tmp_path):
    single = _single(tmp_path)
    result = compare.compare(single, _job(tmp_path, [_trajectory(scale=0.5)] * N, _split_inputs()), N, 1e-5)
    assert not result.equivalent and result.first.step == 1
    assert _kinds(result) == ["scaled-update"]
    assert "1/N" in result.causes[0].message and "sum" in result.causes[0].message


def test_n_times_the_update_is_named_an_unscaled_loss(tmp_path):
    single = _single(tmp_path)
    result = compare.compare(single, _job(tmp_path, [_trajectory(scale=2.0)] * N, _split_inputs()), N, 1e-5)
    assert _kinds(result) == ["scaled-update"]
    assert "num_replicas_in_sync" in result.causes[0].message


def test_ranks_that_drift_apart_are_named_unsynchronised(tmp_path):
    single = _single(tmp_path)
    apart = [_trajectory(), _trajectory(scale=1.3)]
    result = compare.compare(single, _job(tmp_path, apart, _split_inputs()), N, 1e-5)
    assert "unsynchronised" in _kinds(result)
    assert result.ranks_disagree.step == 1
    assert result.first is None  # rank 0 itself matches the original


def test_ranks_that_start_apart_were_never_broadcast(tmp_path):
    single = _single(tmp_path)
    apart = [_trajectory(), _trajectory(seed=7)]
    result = compare.compare(single, _job(tmp_path, apart, _split_inputs()), N, 1e-5)
    assert result.ranks_disagree.step == 0
    assert "never broadcast" in result.causes[0].message


def test_other_initial_weights_are_named(tmp_path):
    single = _single(tmp_path)
    result = compare.compare(single, _job(tmp_path, [_trajectory(seed=3)] * N, _split_inputs()), N, 1e-5)
    assert result.first.step == 0
    assert _kinds(result) == ["initial-weights"]


def test_batchnorm_is_named_when_no_factor_explains_the_difference(tmp_path):
    single = _single(tmp_path, batchnorm=["bn1"])
    drifted = _trajectory()
    drifted[2] = {k: v + 0.01 * np.arange(v.size).reshape(v.shape) for k, v in drifted[2].items()}
    drifted[3] = {k: v + 0.02 for k, v in drifted[2].items()}
    result = compare.compare(single, _job(tmp_path, [drifted] * N, _split_inputs(), batchnorm=["bn1"]), N, 1e-5)
    assert result.first.step == 2
    assert _kinds(result) == ["batchnorm"]
    assert "bn1" in result.causes[0].message


def test_inputs_that_are_not_the_original_batch_are_named(tmp_path):
    single = _single(tmp_path)
    other = [[_samples(j, 4, start=100 + r * 100) for j in range(1, 4)] for r in range(N)]  # disjoint, but other samples
    drifted = _trajectory()
    drifted[1] = {k: v + 0.5 * np.arange(v.size).reshape(v.shape) for k, v in drifted[1].items()}
    result = compare.compare(single, _job(tmp_path, [drifted] * N, other), N, 1e-5)
    assert "inputs-differ" in _kinds(result)
    assert "0 of the ranks' 8 are in the original's batch" in result.data.detail


def test_a_different_number_of_steps_is_different_work(tmp_path):
    single = _single(tmp_path)
    short = _trajectory(steps=2)
    result = compare.compare(single, _job(tmp_path, [short] * N, [i[:2] for i in _split_inputs()]), N, 1e-5)
    assert not result.equivalent
    assert "different-work" in _kinds(result)
    assert result.steps == 2


def test_time_major_inputs_are_split_along_their_second_dimension(tmp_path):
    single = tmp_path / "single"
    _write(dumps.rank_folder(single, 0), _trajectory(), [None] * 3)
    record = dumps.Record.read(dumps.rank_folder(single, 0))
    record.inputs = [dumps.Inputs("model", {"0": [f"t{j}-{t}" for t in range(5)], "1": _samples(j, 8)})
                     for j in range(1, 4)]
    record.write(dumps.rank_folder(single, 0))
    job = _job(tmp_path, [_trajectory()] * N, [[None] * 3] * N)
    for r in range(N):
        folder = dumps.rank_folder(job, r)
        theirs = dumps.Record.read(folder)
        theirs.inputs = [dumps.Inputs("model", {"0": [f"t{j}-{t}-r{r}" for t in range(5)],
                                               "1": _samples(j, 4, start=4 * r)}) for j in range(1, 4)]
        theirs.write(folder)
    result = compare.compare(single, job, N, 1e-5)
    assert result.equivalent, result.causes
    assert result.data.split == 3


@pytest.mark.parametrize("tolerance, equivalent", [(1e-3, True), (1e-7, False)])
def test_the_tolerance_decides(tmp_path, tolerance, equivalent):
    single = _single(tmp_path)
    nudged = [{k: v + 1e-5 for k, v in params.items()} for params in _trajectory()]
    nudged[0] = _trajectory()[0]
    result = compare.compare(single, _job(tmp_path, [nudged] * N, _split_inputs()), N, tolerance)
    assert result.equivalent is equivalent


def test_records_are_read_without_pickles(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    np.save(folder / "x.npy", np.array([object()], dtype=object), allow_pickle=True)
    (folder / "x.npy").rename(dumps.snapshot_file(folder, 0))
    with pytest.raises(ValueError, match="pickle"):
        dumps.load_snapshot(folder, 0)


def test_a_global_batch_n_times_larger_is_named(tmp_path):
    single = _single(tmp_path)
    per_device = [[_samples(j, 8, start=r * 8) for j in range(1, 4)] for r in range(N)]  # 8 + 8 against 8
    drifted = _trajectory()
    drifted[1] = {k: v + 0.5 for k, v in drifted[1].items()}
    result = compare.compare(single, _job(tmp_path, [drifted] * N, per_device), N, 1e-5)
    assert _kinds(result) == ["global-batch"]
    assert "16 samples per step (8 + 8), the original 8" in result.causes[0].message


def test_unequal_shares_averaged_alike_are_named(tmp_path):
    single = _single(tmp_path, inputs=[*_original_inputs(steps=2), _samples(3, 6)])  # a last batch of 6
    uneven = [[_samples(1, 4), _samples(2, 4), _samples(3, 4)],
              [_samples(1, 4, start=4), _samples(2, 4, start=4), _samples(3, 2, start=4)]]
    drifted = _trajectory()
    drifted[3] = {k: v + 0.01 * np.arange(v.size).reshape(v.shape) for k, v in drifted[3].items()}
    result = compare.compare(single, _job(tmp_path, [drifted] * N, uneven), N, 1e-5)
    assert result.data.split == 3 and result.data.uneven == [(3, [4, 2])]
    assert result.first.step == 3
    assert _kinds(result) == ["uneven-shares"]
    assert "(4 + 2 samples)" in result.causes[0].message


def test_a_half_update_is_caught_even_when_the_weights_stay_within_the_tolerance(tmp_path):
    small = {k: 0.01 * np.random.default_rng(0).standard_normal(v) for k, v in SHAPES.items()}
    single = _single(tmp_path, trajectory=_trajectory(scale=5e-5, start=small))  # steps of about 5e-6 < tolerance
    halved = _trajectory(scale=2.5e-5, start=small)
    result = compare.compare(single, _job(tmp_path, [halved] * N, _split_inputs()), N, 1e-5)
    assert result.first is None and result.max_difference < 1e-5  # the weights alone would pass
    assert not result.equivalent
    assert result.update_differs.step == 1 and abs(result.update_differs.value - 0.5) < 1e-6
    assert _kinds(result) == ["scaled-update"]


def test_updates_too_small_to_compare_are_said(tmp_path):
    single = _single(tmp_path, trajectory=_trajectory(scale=1e-7))
    result = compare.compare(single, _job(tmp_path, [_trajectory(scale=1e-7)] * N, _split_inputs()), N, 1e-5)
    assert result.equivalent
    assert result.notes and "too little to compare the updates" in result.notes[0]


def test_a_second_optimizer_joining_later_is_compared_on_the_parameters_both_runs_hold(tmp_path):
    def with_second(trajectory, start_at=2, scale=1.0):
        out = []
        for k, params in enumerate(trajectory):
            params = dict(params)
            if k >= start_at:
                params["o1.p0"] = np.full((2,), 0.5 - 0.1 * scale * (k - start_at))
            out.append(params)
        return out

    names = {**NAMES, "o1.p0": "head.weight"}
    shapes = {**SHAPES, "o1.p0": (2,)}

    def write(folder, trajectory, inputs, rank=0, world=1):
        folder.mkdir(parents=True, exist_ok=True)
        for k, params in enumerate(trajectory):
            np.savez(dumps.snapshot_file(folder, k), **params)
        dumps.Record(rank=rank, world_size=world, framework="torch",
                     parameters=[dumps.Parameter(k, names[k], list(s), "Linear") for k, s in shapes.items()],
                     snapshots=list(range(len(trajectory))), steps=len(trajectory) - 1, optimizers=2,
                     inputs=[dumps.Inputs("loader", {"0": i}) for i in inputs], stop="steps", batchnorm=[],
                     changes=[]).write(folder)

    write(dumps.rank_folder(tmp_path / "single", 0), with_second(_trajectory()), _original_inputs())
    for r in range(N):  # the second optimizer's update is twice the original's on 2 ranks
        write(dumps.rank_folder(tmp_path / "job", r), with_second(_trajectory(), scale=2.0), _split_inputs()[r],
              rank=r, world=N)
    result = compare.compare(tmp_path / "single", tmp_path / "job", N, 1e-5)  # no KeyError
    assert not result.equivalent
    assert result.first.parameter == "head.weight" and result.first.step == 3


def test_generated_inputs_fingerprinted_otherwise_by_rounding_are_not_different_work(tmp_path):
    """A GAN's discriminator fed the generator's images (source "model"): the generator's weights differ from the
    original's by float rounding, so the images' fingerprints differ while the work is the same (round Q's DCGAN
    was "different work" at every generator step). Loader batches are still checked sample by sample."""
    def model_fed(folder, step_rows):
        record = dumps.Record.read(folder)
        record.inputs = [dumps.Inputs("loader" if j % 2 else "model", {"0": rows}) for j, rows in enumerate(step_rows, 1)]
        record.write(folder)

    single = _single(tmp_path)
    model_fed(dumps.rank_folder(single, 0), _original_inputs())
    job = _job(tmp_path, [_trajectory()] * N, _split_inputs())
    for r in range(N):
        rows = _split_inputs()[r]
        rows[1] = [f"generated-{r}-{i}" for i in range(4)]  # step 2: other fingerprints, as many as the original's
        model_fed(dumps.rank_folder(job, r), rows)
    result = compare.compare(single, job, N, 1e-5)
    assert result.equivalent, result.causes
    assert result.data.observed == result.data.split == 2
    for r in range(N):  # a loader step with other samples is still caught
        rows = _split_inputs()[r]
        rows[0] = [f"other-{r}-{i}" for i in range(4)]
        model_fed(dumps.rank_folder(job, r), rows)
    assert "inputs-differ" in _kinds(compare.compare(single, job, N, 1e-5))
