"""rank-device: hard-coded CUDA devices become dp.device(); CPU stays CPU."""

import pytest
from rule_testing import IMPORT, assert_converts, assert_rule_converts, assert_unchanged, convert_text, findings_of

HEAD = "import torch\n"


@pytest.mark.parametrize(
    "before, after",
    [
        ('device = torch.device("cuda")', "device = dp.device()"),
        ('device = torch.device("cuda:0")', "device = dp.device()"),
        ('device = torch.device("cuda", 0)', "device = dp.device()"),
        ('device = torch.device("cuda" if torch.cuda.is_available() else "cpu")', "device = dp.device()"),
        ('device = "cuda" if torch.cuda.is_available() else "cpu"', "device = dp.device().type"),
        ('device = torch.device("cuda:{}".format(args.gpu))', "device = dp.device()"),
        ('device = torch.device(f"cuda:{args.gpu}")', "device = dp.device()"),
        ('device = torch.device("cuda:%d" % args.gpu)', "device = dp.device()"),
        (
            'device = torch.device("cuda" if use_cuda else "cpu")',
            'device = dp.device() if use_cuda else torch.device("cpu")',
        ),
        (
            'device = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"',
            'device = dp.device().type if torch.cuda.is_available() else "mps" if mps else "cpu"',
        ),
        ("model.cuda()", "model.to(dp.device())"),
        ("x = x.cuda(args.gpu, non_blocking=True)", "x = x.to(dp.device(), non_blocking=True)"),
        ("loss_fn = torch.nn.MSELoss().cuda()", "loss_fn = torch.nn.MSELoss().to(dp.device())"),
        ("x = x.to(0)", "x = x.to(dp.device())"),
        ('x = x.to("cuda:1", non_blocking=True)', "x = x.to(dp.device(), non_blocking=True)"),
        ('z = torch.zeros(3, device="cuda")', "z = torch.zeros(3, device=dp.device())"),
        ('c = torch.load(p, map_location="cuda:0")', "c = torch.load(p, map_location=dp.device())"),
        ("device = torch.accelerator.current_accelerator()", "device = dp.device()"),
    ],
)
def test_cuda_devices_become_the_rank_device(before, after):
    assert_converts(HEAD + "\n" + before + "\n", HEAD + IMPORT + "\n" + after + "\n")


def test_set_device_is_removed_and_reported():
    result = assert_converts(
        """
        import torch
        if gpu is not None:
            torch.cuda.set_device(gpu)
        """,
        """
        import torch
        if gpu is not None:
            pass
        """,
    )
    assert findings_of(result, "rank-device", "change")


@pytest.mark.parametrize(
    "source",
    [
        'device = torch.device("cpu")\nx = x.to(device)\n',
        'device = torch.device("mps")\n',
        "ok = torch.cuda.is_available()\nn = torch.cuda.device_count()\n",
        "x = x.to(torch.float16)\n",
        "kind = torch.accelerator.current_accelerator().type\n",
    ],
)
def test_cpu_and_non_device_code_is_left_alone(source):
    assert_unchanged(HEAD + source)


def test_a_device_taken_from_a_flag_keeps_the_flags_kind_and_takes_this_ranks_card():
    result = assert_converts(
        HEAD + "device = torch.device(args.device)\n",
        HEAD + IMPORT + '\ndevice = dp.device() if torch.device(args.device).type == "cuda" else torch.device(args.device)\n',
    )
    [finding] = findings_of(result, "rank-device", "change")
    assert (finding.line, finding.col) == (2, 10) and "still picks the kind of device" in finding.message


def test_a_device_computed_by_a_call_is_declined():
    result = assert_unchanged(HEAD + "device = torch.device(pick(args))\n")
    [finding] = findings_of(result, "rank-device", "declined")
    assert (finding.line, finding.col) == (2, 10) and "dp.device()" in finding.fix


def test_setting_cuda_visible_devices_is_declined():
    result = convert_text('import os, torch\nos.environ["CUDA_VISIBLE_DEVICES"] = "0"\n')
    assert findings_of(result, "rank-device", "declined")


def test_a_string_device_stays_a_string_so_its_comparisons_keep_their_meaning():
    # issue 8, defect 7: `device == 'cuda'` silently turned false once device became a torch.device
    result = assert_rule_converts(
        "rank-device",
        """
        import torch
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
        if device == 'cuda':
            torch.backends.cudnn.benchmark = True
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        device = dp.device().type
        if device == 'cuda':
            torch.backends.cudnn.benchmark = True
        """,
    )
    assert "still a string" in findings_of(result, "rank-device")[0].message


def test_a_device_built_from_an_unknown_expression_is_declined():
    result = convert_text(
        """
        import torch
        device = torch.device(pick_device(args))
        """
    )
    assert findings_of(result, "rank-device", "declined")


def test_removing_set_device_keeps_the_blank_line_that_opened_its_paragraph():
    assert_rule_converts(
        "rank-device",
        """
        import torch
        x = 1

        torch.cuda.set_device(0)
        y = 2
        """,
        """
        import torch
        x = 1

        y = 2
        """,
    )
