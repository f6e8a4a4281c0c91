"""rank-divergent-code: collectives only some ranks reach, and early exits decided on one rank."""

import pytest
from rule_testing import convert_text, findings_of

CONVERTED = "import torch\nimport torch.distributed as dist\nimport dpmigrate.runtime.torch as dp\n"


def _errors(source):
    result = convert_text(source)
    assert result.output == source.encode()  # reported, never rewritten
    return findings_of(result, "rank-divergent-code", "error")


@pytest.mark.parametrize(
    "condition, call",
    [
        ("dp.is_main_process()", "dp.save(model.state_dict(), path)"),
        ("rank == 0", "dist.barrier()"),
        ("dist.get_rank() == 0", "dist.all_reduce(t)"),
        ("args.local_rank == 0", "dp.all_reduce(total, op='sum')"),
        ("int(os.environ['RANK']) == 0", "dp.barrier()"),
        ("not dp.is_main_process()", "dist.broadcast(t, 0)"),
    ],
)
def test_a_collective_under_a_rank_condition_is_an_error(condition, call):
    [error] = _errors(CONVERTED + f"if {condition}:\n    {call}\n")
    assert (error.line, error.col) == (5, 5)
    assert condition in error.message and error.fix


def test_a_collective_in_the_else_branch_of_a_rank_condition_is_an_error():
    assert len(_errors(CONVERTED + "if dp.rank() == 0:\n    pass\nelse:\n    dp.barrier()\n")) == 1


def test_a_variable_holding_the_rank_makes_its_condition_rank_dependent():
    assert len(_errors(CONVERTED + "me = dp.rank()\nif me == 0:\n    dp.barrier()\n")) == 1


def test_calling_a_function_that_reaches_a_collective_under_a_rank_condition_is_an_error():
    source = CONVERTED + (
        "def evaluate():\n    return dp.all_reduce(1, op='sum')\n\n"
        "if dp.is_main_process():\n    evaluate()\n"
    )
    [error] = _errors(source)
    assert "evaluate()" in error.message and "dp.all_reduce" in error.message


def test_a_break_on_one_rank_inside_the_training_loop_is_an_error():
    source = CONVERTED + (
        "for x in loader:\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    if dp.rank() == 0 and loss.item() < 0.1:\n"
        "        break\n"
    )
    [error] = _errors(source)
    assert (error.line, error.col) == (8, 9) and "break" in error.message


@pytest.mark.parametrize(
    "source",
    [
        CONVERTED + "if epoch % 10 == 0:\n    dp.save(state, path)\n",
        CONVERTED + "if dp.is_main_process():\n    torch.save(state, path)\n    print('saved')\n",
        CONVERTED + "for x in loader:\n    if dp.rank() == 0:\n        break\n",  # not a training loop
        CONVERTED + "dp.save(state, path)\ndp.barrier()\n",
    ],
)
def test_code_every_rank_runs_alike_is_not_an_error(source):
    assert _errors(source) == []


def test_divergence_is_reported_in_a_file_that_is_otherwise_converted():
    result = convert_text(
        "import torch\nif args.rank == 0:\n    torch.distributed.barrier()\nloss.backward()\n"
    )
    assert findings_of(result, "rank-divergent-code", "error")
