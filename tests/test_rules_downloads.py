"""download-main-process-first beyond download=True: URL fetches, hub loaders, pretrained weights (issue 8)."""

import pytest
from rule_testing import assert_rule_converts, convert_text, findings_of


@pytest.mark.parametrize("fetch", [
    'r = requests.get("https://example.com/data.csv")',
    'state = torch.hub.load_state_dict_from_url("https://example.com/w.pth")',
    "net = models.resnet18(weights=models.ResNet18_Weights.DEFAULT)",
    "net = torchvision.models.resnet18(pretrained=True)",
    'tok = transformers.AutoModel.from_pretrained("bert-base-uncased")',
])
def test_each_kind_of_download_runs_on_the_main_process_first(fetch):
    header = "import requests\nimport urllib.request\nimport torch\nimport torchvision\nimport transformers\n" \
             "from torchvision import models\n"
    use = "print(" + fetch.split(" = ")[0] + ")\n" if " = " in fetch else ""  # what it returns is used after it
    assert_rule_converts(
        "download-main-process-first",
        header + fetch + "\n" + use,
        header + "import dpmigrate.runtime.torch as dp\n\nwith dp.main_process_first():\n    " + fetch + "\n" + use,
    )


@pytest.mark.parametrize("fetch", [
    'urllib.request.urlretrieve("https://example.com/x.zip", "x.zip")',
    'r = requests.get("https://example.com/data.csv")',
])
def test_a_fetch_that_only_leaves_files_runs_once_per_node_while_the_others_wait(fetch):
    header = "import requests\nimport urllib.request\nimport torch\n"
    assert_rule_converts(
        "download-main-process-first",
        header + fetch + "\n",
        header + "import dpmigrate.runtime.torch as dp\n\nif dp.local_rank() == 0:\n    " + fetch + "\ndp.barrier()\n",
    )


def test_the_whole_fetch_and_unpack_sequence_runs_once():
    header = "import tarfile\nimport urllib.request\nimport requests\nimport torch\n"
    body = ('urllib.request.urlretrieve("https://example.com/data.tar", "data.tar")\n'
            'tarfile.open("data.tar").extractall("data")\n'
            'r = requests.get("https://example.com/more.tar.gz", stream=True)\n'
            'with tarfile.open(fileobj=r.raw, mode="r|gz") as archive:\n'
            '    archive.extractall("more")\n')
    indented = "".join("    " + line + "\n" for line in body.splitlines())
    assert_rule_converts(
        "download-main-process-first",
        header + body + 'rows = torch.load("data/rows.pt")\n',
        header + "import dpmigrate.runtime.torch as dp\n\nif dp.local_rank() == 0:\n" + indented + "dp.barrier()\n"
        + 'rows = torch.load("data/rows.pt")\n',
    )


@pytest.mark.parametrize("not_a_download", [
    "net = models.resnet18(weights=None)",
    "net = torchvision.models.resnet18(pretrained=False)",
    "net = models.resnet18()",
    "trainer = transformers.Trainer(model=net)",
])
def test_models_without_pretrained_weights_are_left_alone(not_a_download):
    result = convert_text("import torchvision\nimport transformers\nfrom torchvision import models\n" + not_a_download + "\n",
                          select=("download-main-process-first",))
    assert findings_of(result, "download-main-process-first") == []


def test_a_download_already_under_a_main_process_first_block_is_not_wrapped_twice():
    source = (
        "import requests\nimport torch\n\nwith accelerator.main_process_first():\n"
        "    r = requests.get('https://example.com')\n"
    )
    result = convert_text(source, select=("download-main-process-first",))
    assert result.output.decode() == source


def test_a_download_in_one_branch_puts_the_whole_choice_under_main_process_first():
    # `if exists: ... else: download` decided per rank would make the ranks meet in different places
    result = convert_text(
        """
        import os
        import requests
        import torch

        def main():
            if os.path.isfile("cora.tgz"):
                print("have it")
            else:
                with requests.get("https://example.com/cora.tgz", stream=True) as reply:
                    open("cora.tgz", "wb").write(reply.content)

        if __name__ == "__main__":
            main()
        """,
        select=("download-main-process-first",),
    )
    # (only files are left behind: the first process of each node makes the choice and fetches, the others wait)
    assert '    if dp.local_rank() == 0:\n        if os.path.isfile("cora.tgz"):\n' in result.output.decode()
    assert '            open("cora.tgz", "wb").write(reply.content)\n    dp.barrier()\n' in result.output.decode()
