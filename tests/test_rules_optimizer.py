"""distributed-optimizer: torch.optim optimizers (by qualified name) wrapped; --scale-lr."""

import pytest
from rule_testing import assert_converts, assert_unchanged, convert_text, findings_of


@pytest.mark.parametrize(
    "imports, construction",
    [
        ("import torch", "torch.optim.SGD(params, lr=0.1)"),
        ("import torch.optim as optim", "optim.Adam(params, lr=0.1)"),
        ("from torch import optim as o", "o.SGD(params, lr=0.1)"),
        ("from torch.optim import AdamW as Fancy", "Fancy(params, lr=0.1)"),
    ],
)
def test_optimizers_are_wrapped_however_they_are_imported(imports, construction):
    assert_converts(
        f"{imports}\nopt = {construction}\n",
        f"{imports}\nimport dpmigrate.runtime.torch as dp\n\nopt = dp.distributed_optimizer({construction})\n",
    )


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n\nclass SGD:\n    pass\n\nopt = SGD(params, lr=0.1)\n",
        "import torch\nsched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)\n",
        "import torch\nopt = getattr(torch.optim, name)(params, lr=0.1)\n",
    ],
)
def test_other_classes_schedulers_and_dynamic_optimizers_are_left_alone(source):
    assert_unchanged(source)


def test_scale_lr_rewrites_a_keyword_learning_rate():
    assert_converts(
        "import torch\nopt = torch.optim.SGD(params, lr=args.lr)\n",
        "import torch\nimport dpmigrate.runtime.torch as dp\n\n"
        'opt = dp.distributed_optimizer(torch.optim.SGD(params, lr=dp.scale_lr(args.lr, "sqrt")))\n',
        scale_lr="sqrt",
    )


def test_scale_lr_rewrites_a_positional_learning_rate():
    assert_converts(
        "import torch\nopt = torch.optim.SGD(params, args.lr, momentum=0.9)\n",
        "import torch\nimport dpmigrate.runtime.torch as dp\n\n"
        'opt = dp.distributed_optimizer(torch.optim.SGD(params, dp.scale_lr(args.lr, "linear"), momentum=0.9))\n',
        scale_lr="linear",
    )


def test_scale_lr_declines_a_default_learning_rate():
    result = convert_text("import torch\nopt = torch.optim.Adam(params)\n", scale_lr="linear")
    [finding] = findings_of(result, "distributed-optimizer", "declined")
    assert "default learning rate" in finding.message


def test_scale_lr_reports_learning_rates_set_by_hand():
    result = convert_text(
        "import torch\nfor group in opt.param_groups:\n    group['lr'] = lr\n", scale_lr="linear"
    )
    [finding] = findings_of(result, "distributed-optimizer", "declined")
    assert (finding.line, finding.col) == (3, 5)


def test_without_scale_lr_the_learning_rate_is_untouched():
    result = convert_text("import torch\nopt = torch.optim.SGD(params, lr=args.lr)\n")
    assert "scale_lr" not in result.output.decode()
