"""Which buffers the start-state broadcast covers (``_torch_start_state``), in one process.

The broadcast itself runs on 2 real ranks in test_torch_start_state.py; here, the choice of buffers:
those of the modules that directly hold one of the optimizer's parameters, in an order that does not
depend on the garbage collector's."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dpmigrate.runtime._torch_start_state import _buffers_of_owners  # noqa: E402


def names_of(found, model):
    by_id = {id(b): name for name, b in model.named_buffers()}
    return [by_id[id(b)] for b in found]


def test_the_buffers_of_modules_holding_the_parameters_in_parameter_order():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.BatchNorm1d(4))
    params = list(model.parameters())
    assert names_of(_buffers_of_owners(params), model) == [
        "1.num_batches_tracked", "1.running_mean", "1.running_var",
        "3.num_batches_tracked", "3.running_mean", "3.running_var",
    ]
    # the optimizer's order decides, not the model's
    reordered = params[6:] + params[:6]
    assert names_of(_buffers_of_owners(reordered), model)[:3] == [
        "3.num_batches_tracked", "3.running_mean", "3.running_var",
    ]


def test_a_module_holding_buffers_but_none_of_the_parameters_is_not_covered():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False))
    assert _buffers_of_owners(list(model.parameters())) == []
    frozen = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    assert _buffers_of_owners(list(frozen[0].parameters())) == []  # the BatchNorm's own params not optimized


def test_two_indistinguishable_modules_with_different_buffers_are_left_alone():
    first, second = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
    second.weight, second.bias = first.weight, first.bias  # same parameters, same names, same class
    assert _buffers_of_owners([first.weight, first.bias]) == []
    assert second.running_mean is not first.running_mean  # keep both alive to the end of the test
