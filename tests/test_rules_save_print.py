"""distributed-save, main-process-print, main-process-logging, download-main-process-first."""

import pytest
from rule_testing import assert_converts, assert_unchanged, convert_text, findings_of

TRAINS = "loss.backward()\n"


def test_torch_save_becomes_dp_save():
    assert_converts(
        "import torch\ntorch.save(model.state_dict(), 'm.pt')\n",
        "import torch\nimport dpmigrate.runtime.torch as dp\n\ndp.save(model.state_dict(), 'm.pt')\n",
    )


def test_saving_through_a_file_every_rank_opens_becomes_a_save_by_path():
    assert_converts(
        """
        import torch
        if best:
            with open(args.save, 'wb') as f:
                torch.save(state, f)
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        if best:
            dp.save(state, args.save)
        """,
    )


def test_pickling_a_whole_wrapped_model_becomes_dp_save_of_the_unwrapped_module():
    result = convert_text(
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=1)\n"
        + TRAINS + "torch.save(model, 'm.pt')\n"
    )
    assert result.output.decode().endswith("\ndp.save(model, 'm.pt')\n")
    [finding] = findings_of(result, "distributed-save", "change")
    assert "`model` is saved unwrapped" in finding.message and "once, by rank 0" in finding.message


def test_a_save_already_under_a_rank_condition_is_declined():
    result = assert_unchanged("import torch\nif args.local_rank == 0:\n    torch.save(state, 'm.pt')\n")
    [finding] = findings_of(result, "distributed-save", "declined")
    assert "args.local_rank == 0" in finding.message


def test_prints_in_a_training_script_print_once():
    assert_converts(
        "import torch\n" + TRAINS + "print('loss', loss.item())\n",
        "import torch\nimport dpmigrate.runtime.torch as dp\n\ndp.init()\n" + TRAINS + "dp.print('loss', loss.item())\n",
    )


@pytest.mark.parametrize(
    "source",
    [
        "import sys, torch\n" + TRAINS + "print('bad', file=sys.stderr)\n",
        "import sys, torch\n" + TRAINS + "if bad:\n    print('usage: ...')\n    sys.exit(2)\n",
        "import torch\n" + TRAINS + "if bad:\n    print('no data')\n    raise SystemExit(1)\n",
        "import torch\n" + TRAINS + "def print(*a):\n    pass\nprint('mine')\n",
    ],
)
def test_error_prints_and_the_scripts_own_print_are_left_alone(source):
    result = convert_text(source)
    assert not findings_of(result, "main-process-print")


def test_prints_in_a_module_that_trains_nothing_are_left_alone():
    assert_unchanged("import torch\n\ndef show(x):\n    print(torch.as_tensor(x).shape)\n")


def test_logging_is_kept_to_the_main_process_after_init():
    result = assert_converts(
        """
        import logging
        import torch

        logging.basicConfig(level=logging.INFO)
        loss.backward()
        logging.info("step done")
        """,
        """
        import logging
        import torch
        import dpmigrate.runtime.torch as dp

        dp.init()
        if not dp.is_main_process():
            logging.disable(logging.WARNING)
        logging.basicConfig(level=logging.INFO)
        loss.backward()
        logging.info("step done")
        """,
    )
    assert findings_of(result, "main-process-logging", "change")


def test_logging_imported_under_another_name_is_declined():
    result = convert_text("import torch\nfrom logging import getLogger\nlog = getLogger('x')\n" + TRAINS)
    [finding] = findings_of(result, "main-process-logging", "declined")
    assert "logging.disable" in finding.fix


def test_consecutive_downloads_share_one_main_process_first_block():
    assert_converts(
        """
        from torchvision import datasets

        def main():
            # the data
            train_set = datasets.MNIST('../data', train=True, download=True)
            test_set = datasets.MNIST('../data', train=False, download=True)
            print(len(train_set))
        """,
        """
        from torchvision import datasets
        import dpmigrate.runtime.torch as dp

        def main():
            # the data
            with dp.main_process_first():
                train_set = datasets.MNIST('../data', train=True, download=True)
                test_set = datasets.MNIST('../data', train=False, download=True)
            print(len(train_set))
        """,
    )


def test_datasets_read_without_download_are_left_alone():
    assert_unchanged("from torchvision import datasets\nds = datasets.MNIST('../data', train=False)\n")


def test_progress_bars_show_on_the_main_process_only():
    result = convert_text("import torch\nfrom tqdm import tqdm\nfor x in tqdm(loader):\n    loss.backward()\n")
    assert "for x in tqdm(loader, disable=not dp.is_main_process()):" in result.output.decode()
    assert findings_of(result, "main-process-output", "change")


def test_a_progress_bar_with_its_own_disable_is_left_alone():
    result = convert_text("import torch, tqdm\nfor x in tqdm.tqdm(loader, disable=quiet):\n    loss.backward()\n")
    assert "disable=quiet)" in result.output.decode() and not findings_of(result, "main-process-output")


def test_sample_images_are_written_by_the_main_process_only():
    result = convert_text(
        "import torch\nimport torchvision.utils as vutils\nloss.backward()\n"
        "if i % 100 == 0:\n    vutils.save_image(fake, 'fake.png', normalize=True)\n"
    )
    assert (
        "if i % 100 == 0:\n    if dp.is_main_process():\n        vutils.save_image(fake, 'fake.png', normalize=True)\n"
    ) in result.output.decode()
