"""A runtime that stops sharding must fail the executed-fixture checks (issue 22, Must show 1).

The mutation: in the ranks of the launched job only, ``dp.distributed_loader`` returns its argument and
``dp.per_rank_batch_size`` the whole batch, so every rank trains on every sample with the full batch. The
averaged gradient is then the single process's and the final weights match exactly: the blind spot of a
weights-only oracle. ``dpmigrate verify``, which the executed-fixture tests use, must fail it: the same
samples on every rank. The same fixture without the mutation is equivalent (its own test,
``test_fixtures_execute*.py``).

The mutation is a ``sitecustomize`` on ``PYTHONPATH`` after verify's own (which runs the one it shadows).
"""

from __future__ import annotations

import os
import textwrap

import pytest
from fixture_cases import FIXTURES
from verify_cases import causes, explain, verify

MUTATION = textwrap.dedent('''
    """Test mutation: the runtime stops sharding in the launched ranks."""
    import os

    FRAMEWORK = {framework!r}
    LAUNCHED = ("RANK", "PADDLE_TRAINER_ID", "TF_CONFIG")
    if os.environ.get("DPMIGRATE_VERIFY_OUT") and any(os.environ.get(v) for v in LAUNCHED):
        import importlib

        runtime = importlib.import_module("dpmigrate.runtime." + FRAMEWORK)
        runtime.distributed_loader = lambda data, **kwargs: data
        runtime.per_rank_batch_size = lambda batch: batch
''')

CASES = {
    "torch": (FIXTURES / "torch" / "synthetic_mnist", ["--batch-size", "32"]),
    "paddle": (FIXTURES / "paddle" / "mlp_sgd", ["--batch-size", "32"]),
    "tensorflow": (FIXTURES / "tensorflow" / "custom_loop_tape", ["--batch-size", "32"]),  # a custom loop: the runtime
    # shards its dataset (fit's data is the strategy's to shard, not the runtime's)
}


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(CASES))
def test_a_runtime_that_stops_sharding_fails_the_check(framework, tmp_path, monkeypatch):
    case, args = CASES[framework]
    mutation = tmp_path / "mutation"
    mutation.mkdir()
    (mutation / "sitecustomize.py").write_text(MUTATION.format(framework=framework))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(mutation), os.environ.get("PYTHONPATH")])))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_bytes((case / "before.py").read_bytes())
    data = verify(work, monkeypatch, work / "train.py", *args, steps=3)
    assert data["verdict"] == "diverges", explain(data)
    assert causes(data) == ["not-sharded"], explain(data)
    assert data["comparison"]["max_difference"] < 1e-5  # the weights alone would have passed
