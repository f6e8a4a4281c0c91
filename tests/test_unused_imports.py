"""An import whose last use the conversion replaced is removed (issue 18); everything else stays as written."""

from rule_testing import convert_text, findings_of

DATA_PARALLEL = """
import torch
from torch.nn import DataParallel{more}
{comment}
model = DataParallel(torch.nn.Linear(3, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(range(8), batch_size=2):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""


def test_an_import_whose_last_use_was_replaced_is_removed():
    result = convert_text(DATA_PARALLEL.format(more="", comment=""))
    assert "DataParallel" not in result.output.decode()
    [removed] = findings_of(result, "unused-import")
    assert removed.line == 3 and "`DataParallel`" in removed.message


def test_other_names_of_the_same_import_stay():
    converted = convert_text(DATA_PARALLEL.format(more=", Linear", comment="")).output.decode()
    assert "from torch.nn import Linear\n" in converted


def test_an_import_the_script_never_used_stays():
    converted = convert_text(DATA_PARALLEL.format(more="\nimport os", comment="")).output.decode()
    assert "import os\n" in converted


def test_an_import_under_a_comment_is_kept_with_its_comment():
    source = DATA_PARALLEL.format(more="", comment="").replace(
        "from torch.nn import DataParallel", "# the multi-GPU wrapper\nfrom torch.nn import DataParallel")
    result = convert_text(source)
    assert "# the multi-GPU wrapper\nfrom torch.nn import DataParallel\n" in result.output.decode()
    assert not findings_of(result, "unused-import")
