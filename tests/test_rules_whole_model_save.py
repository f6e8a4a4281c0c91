"""distributed-save on whole models (issue 8 item 4): converted where ``dp.save`` unwraps the DDP
wrapper (the saved object, or a value of the dict, list or tuple written in the call), declined where
it does not look (deeper, or in a set), so no conversion ever pickles the wrapper silently."""

import pytest
from rule_testing import convert_text, findings_of

SETUP = "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=1)\nloss.backward()\n"


def converted(save_line: str):
    result = convert_text(SETUP + save_line + "\n")
    [finding] = findings_of(result, "distributed-save")
    return result.output.decode().rstrip("\n").rsplit("\n", 1)[-1], finding


@pytest.mark.parametrize("save, expected", [
    ("torch.save(model, 'm.pt')", "dp.save(model, 'm.pt')"),
    ("torch.save(obj=model, f=path)", "dp.save(obj=model, path=path)"),
    ("torch.save({'model': model, 'epoch': 3}, 'c.pt')", "dp.save({'model': model, 'epoch': 3}, 'c.pt')"),
    ("torch.save([model, opt], 'c.pt')", "dp.save([model, opt], 'c.pt')"),
    ("torch.save((model, 3), 'c.pt')", "dp.save((model, 3), 'c.pt')"),
])
def test_a_whole_model_where_dp_save_unwraps_it_is_converted_and_reported(save, expected):
    line, finding = converted(save)
    assert line == expected
    assert finding.severity == "change"
    assert "the whole model `model` is saved unwrapped" in finding.message
    assert "once, by rank 0" in finding.message


def test_a_whole_model_written_through_an_opened_file_is_saved_by_path_unwrapped():
    result = convert_text(SETUP + "with open(path, 'wb') as f:\n    torch.save(model, f)\n")
    assert result.output.decode().endswith("\ndp.save(model, path)\n")
    [finding] = findings_of(result, "distributed-save", "change")
    assert "`model` is saved unwrapped" in finding.message


@pytest.mark.parametrize("save", [
    "torch.save({'models': [model]}, 'c.pt')",
    "torch.save({'a': {'model': model}}, 'c.pt')",
    "torch.save(({'model': model}, 1), 'c.pt')",
    "torch.save({model}, 'c.pt')",
])
def test_a_model_deeper_than_dp_save_looks_is_declined_with_the_fix(save):
    line, finding = converted(save)
    assert line == save
    assert finding.severity == "declined"
    assert "`model` nested inside" in finding.message
    assert "model.state_dict()" in finding.fix and "dp.unwrap(model)" in finding.fix


def test_a_state_dict_save_says_nothing_about_unwrapping():
    line, finding = converted("torch.save({'model': model.state_dict(), 'opt': opt.state_dict()}, 'c.pt')")
    assert line == "dp.save({'model': model.state_dict(), 'opt': opt.state_dict()}, 'c.pt')"
    assert finding.severity == "change" and "unwrapped" not in finding.message


def test_every_comment_of_the_with_statement_survives_the_save_by_path():
    result = convert_text(SETUP + "if best:\n    # above with\n    with open(path, 'wb') as f:  # end with\n"
                          "        # above save\n        torch.save(model, f)  # end save\n        # under save\nx = 1\n")
    assert result.output.decode().endswith(
        "if best:\n    # above with\n    # end with\n    # above save\n    # under save\n"
        "    dp.save(model, path)  # end save\nx = 1\n"
    )
