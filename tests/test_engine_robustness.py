"""Valid Python that crashed a rule, and rank-divergent shapes the check missed (found by generated
programs and by hand): each converts correctly now, or is reported, never a crash."""

from __future__ import annotations

import textwrap

import pytest
from rule_testing import IMPORT, assert_converts, convert_text, findings_of

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import ConversionError, Options


def test_an_annotated_model_assignment_is_wrapped():
    assert_converts('''\
        import torch
        from torch import nn, optim
        model: nn.Module = nn.Linear(2, 2)
        opt = optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
        ''', f'''\
        import torch
        from torch import nn, optim
        {IMPORT}
        dp.init()
        model: nn.Module = nn.Linear(2, 2)
        model = dp.distributed_model(model)
        opt = dp.distributed_optimizer(optim.SGD(model.parameters(), lr=0.1))
        opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
        ''', select=("init-runtime", "distributed-model", "distributed-optimizer"))


def test_torch_save_with_keyword_arguments_keeps_them_and_the_file_becomes_a_path():
    assert_converts('''\
        import torch
        torch.save(obj={"a": 1}, f="x.pt")
        with open("y.pt", "wb") as handle:
            torch.save(obj={"b": 2}, f=handle, pickle_protocol=4)
        ''', f'''\
        import torch
        {IMPORT}
        dp.save(obj={{"a": 1}}, path="x.pt")
        dp.save(obj={{"b": 2}}, path="y.pt", pickle_protocol=4)
        ''', select=("distributed-save",))


def test_a_form_feed_in_an_indentation_is_kept_and_new_code_is_indented_plainly():
    source = b"import torch\nclass A:\n\f    pass\nx = torch.ones(1)\nx.backward()\nprint(x)\n"
    result = convert_text(source.decode())
    assert b"class A:\n\f    pass\n" in result.output and b"dp.print(x)\n" in result.output
    compile(result.output, "f.py", "exec")


def test_a_file_libcst_cannot_reprint_exactly_is_refused_not_silently_changed():
    # libcst keeps one indent per block: the form feed of the first line would spread to the others
    source = "import torch\ndef f():\n\f    x = torch.ones(1)\n    x.backward()\n    print(x)\n"
    with pytest.raises(ConversionError, match="cannot reprint this file byte for byte"):
        convert_text(source)


def test_the_runtime_alias_is_a_name_the_file_does_not_use_even_when_the_usual_ones_are_taken():
    result = convert_text('''\
        import torch
        dp, dpr, dp_runtime = 1, 2, 3
        x = torch.ones(1, requires_grad=True)
        x.sum().backward()
        print(dp, dpr, dp_runtime)
        ''')
    text = result.output.decode()
    assert "import dpmigrate.runtime.torch as dp_runtime2\n" in text
    assert "dp_runtime2.print(dp, dpr, dp_runtime)" in text and "dp_runtime2.init()" in text


def divergence_errors(source: str) -> list[tuple[int, str]]:
    result = convert_text(source)
    return [(f.line, f.message.split(":")[0]) for f in findings_of(result, "rank-divergent-code", "error")]


def test_a_collective_on_the_right_of_a_rank_test_in_and_or_or_is_divergent():
    errors = divergence_errors('''\
        import torch
        import dpmigrate.runtime.torch as dp
        dp.rank() == 0 and dp.barrier()
        dp.rank() != 0 or dp.all_reduce(1.0)
        dp.barrier() and dp.rank() == 0
        ''')
    assert [line for line, _ in errors] == [3, 4]


def test_a_collective_in_a_conditional_expression_on_the_rank_is_divergent():
    errors = divergence_errors('''\
        import torch.distributed as dist
        value = dist.barrier() if dist.get_rank() == 0 else None
        ''')
    assert [line for line, _ in errors] == [2]


def test_a_break_on_one_rank_in_a_loop_that_calls_a_collective_is_divergent_without_any_backward():
    errors = divergence_errors(textwrap.dedent('''\
        import torch
        import dpmigrate.runtime.torch as dp
        total = 0.0
        for batch in range(10):
            total = dp.all_reduce(total + batch)
            if dp.rank() == 0 and batch > 3:
                break
        for batch in range(10):
            if dp.rank() == 0 and batch > 3:
                break
        '''))
    assert [line for line, _ in errors] == [7]


def test_comments_of_a_removed_statement_move_to_the_next_one():
    assert_converts('''\
        import torch
        # pin the card
        torch.cuda.set_device(0)  # one GPU per process
        x = torch.ones(1)
        ''', '''\
        import torch
        # pin the card
        # one GPU per process
        x = torch.ones(1)
        ''', select=("rank-device",))


def test_comments_of_a_removed_last_statement_stay_in_its_block():
    assert_converts('''\
        import torch
        def setup():
            x = 1
            # the card
            torch.cuda.set_device(0)  # pinned
        ''', '''\
        import torch
        def setup():
            x = 1
            # the card
            # pinned
        ''', select=("rank-device",))


def test_an_unchanged_file_comes_back_as_its_own_bytes():
    source = b"import torch\nx = torch.ones(1)   \n\n\n    \n"
    assert convert(source, "a.py", Options(select=("rank-device",))).output == source
    assert convert(source, "a.py", Options()).output == source


def test_a_model_reading_its_own_parameters_with_next_is_not_taken_for_an_attribute_held_model():
    result = convert_text('''\
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)
            def zeros(self):
                return next(self.parameters()).new_zeros(2)
            def forward(self, x):
                return self.fc(x) + self.zeros()
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        opt.zero_grad(); net(torch.ones(2)).sum().backward(); opt.step()
        ''')
    assert not findings_of(result, "distributed-model", "declined")
    assert "net = dp.distributed_model(net)\n" in result.output.decode()
