"""shared-folders: a folder every rank creates must not kill the rank that comes second (found on a CIFAR trainer)."""

from rule_testing import assert_rule_converts, convert_text, findings_of

TRAINS = "opt.zero_grad(); model(x).sum().backward(); opt.step()\n"


def test_mkdir_and_makedirs_tolerate_a_folder_another_rank_made():
    assert_rule_converts(
        "shared-folders",
        "import os\nimport torch\n" + TRAINS + "if not os.path.isdir('checkpoint'):\n    os.mkdir('checkpoint')\n"
        "os.makedirs(args.out)\n",
        "import os\nimport torch\n" + TRAINS + "if not os.path.isdir('checkpoint'):\n"
        "    os.makedirs('checkpoint', exist_ok=True)\nos.makedirs(args.out, exist_ok=True)\n",
    )


def test_calls_with_exist_ok_are_left_and_a_mode_is_declined_with_the_fix():
    result = convert_text("import os\nimport torch\n" + TRAINS + "os.makedirs(d, exist_ok=True)\nos.mkdir(d, 0o700)\n",
                          select=("shared-folders",))
    assert "os.makedirs(d, exist_ok=True)\nos.mkdir(d, 0o700)\n" in result.output.decode()
    [declined] = findings_of(result, "shared-folders", "declined")
    assert "exist_ok=True" in declined.fix
