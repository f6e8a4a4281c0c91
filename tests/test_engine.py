"""The engine: bytes in, bytes out (encoding, line endings, formatting kept), detection, reports."""

import re

import pytest

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import ConversionError, Options
from dpmigrate.rules import all_rules

TRAINING = (
    "import torch\n"
    "def main():\n"
    "    model = torch.nn.Linear(2, 1)  # keep this comment\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    for x in data:\n"
    "        model(x).sum().backward()\n"
    "        opt.step()\n"
    "    print('caf\u00e9')\n"
    "\n"
    "if __name__ == '__main__':\n"
    "    main()\n"
)


def test_crlf_line_endings_are_kept_everywhere():
    source = TRAINING.replace("\n", "\r\n").encode()
    result = convert(source, "train.py")
    assert result.changed
    assert b"dp.distributed_optimizer(" in result.output
    assert result.output.count(b"\r\n") == result.output.count(b"\n")
    assert b"  # keep this comment\r\n" in result.output


def test_a_latin1_coding_cookie_is_honoured_and_kept():
    source = ("# -*- coding: latin-1 -*-\n" + TRAINING).encode("latin-1")
    result = convert(source, "train.py")
    assert result.output.startswith(b"# -*- coding: latin-1 -*-\n")
    assert "print('caf\u00e9')".encode("latin-1").replace(b"print", b"dp.print") in result.output
    result.output.decode("latin-1")
    with pytest.raises(UnicodeDecodeError):
        result.output.decode("utf-8")


def test_a_utf8_bom_is_kept():
    source = b"\xef\xbb\xbf" + TRAINING.encode()
    result = convert(source, "train.py")
    assert result.output.startswith(b"\xef\xbb\xbfimport torch\n")
    assert result.output.count(b"\xef\xbb\xbf") == 1


def test_a_file_without_a_trailing_newline_keeps_it_missing():
    result = convert(TRAINING.rstrip("\n").encode(), "train.py")
    assert result.changed and not result.output.endswith(b"\n")


def test_untouched_formatting_is_byte_identical():
    source = TRAINING.replace("print('caf\u00e9')", "x = ( 1 ,\n          2 )   # odd spacing").encode()
    result = convert(source, "train.py")
    assert b"x = ( 1 ,\n          2 )   # odd spacing\n" in result.output


def test_a_file_without_a_framework_word_is_never_parsed():
    source = b"this is not python (\n"
    result = convert(source, "notes.py")
    assert result.output == source and not result.findings and result.framework is None


def test_a_file_that_does_not_parse_raises_with_its_position():
    with pytest.raises(ConversionError) as raised:
        convert(b"import torch\ndef f(:\n", "bad.py")
    assert raised.value.path == "bad.py" and raised.value.line == 2
    assert "does not parse" in str(raised.value)


def test_a_file_that_is_not_text_in_its_encoding_raises():
    with pytest.raises(ConversionError, match="not text"):
        convert(b"import torch\nx = '\xff\xfe'\n", "binary.py")


def test_a_file_that_only_mentions_torch_in_a_comment_is_left_alone():
    source = b"# we could use torch here\nx = 1\n"
    result = convert(source, "notes.py")
    assert result.output == source and result.framework is None


def test_a_file_mixing_frameworks_is_declined_and_never_half_converted():
    source = b"import torch\nimport tensorflow as tf\nopt = torch.optim.SGD(p, lr=1)\nloss.backward()\n"
    result = convert(source, "mixed.py")
    assert result.output == source
    [finding] = result.findings
    assert finding.severity == "declined" and (finding.line, finding.col) == (2, 1) and finding.fix


def test_asking_for_another_framework_than_the_file_uses_is_declined():
    source = TRAINING.encode()
    result = convert(source, "train.py", Options(framework="paddle"))
    assert result.output == source
    assert [f.severity for f in result.findings if f.rule == "detect-framework"] == ["declined"]


@pytest.mark.parametrize(
    "source, reason",
    [
        ("import torch\nimport dpmigrate.runtime.torch as dp\ndp.init()\n", "converted before"),
        ("import torch\nfrom dpmigrate import runtime\n", "converted before"),
        ("import torch\nfrom torch import distributed as d\nd.init_process_group('gloo')\n", "by hand"),
        ("import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n", "by hand"),
        ("import torch\nimport torch.multiprocessing as mp\np = mp.Process(target=f)\n", "multiprocessing"),
    ],
)
def test_converted_distributed_and_multiprocess_files_go_through_unchanged_with_a_note(source, reason):
    result = convert(source.encode(), "train.py")
    assert result.output == source.encode()
    [note] = [f for f in result.findings if f.rule == "detect-framework"]
    assert note.severity == "note" and reason in note.message


def test_converting_twice_changes_nothing_more():
    once = convert(TRAINING.encode(), "train.py").output
    assert convert(once, "train.py").output == once


def test_the_runtime_gets_another_name_when_the_script_uses_dp():
    source = TRAINING.replace("model = torch", "dp = 0\n    model = torch").encode()
    result = convert(source, "train.py")
    assert b"import dpmigrate.runtime.torch as dpr\n" in result.output
    assert b"dpr.distributed_optimizer(" in result.output and b"dp.distributed" not in result.output


def test_findings_are_one_based_positions_in_the_input_in_order():
    result = convert(TRAINING.encode(), "train.py")
    optimizer = [f for f in result.findings if f.rule == "distributed-optimizer"]
    assert [(f.line, f.col) for f in optimizer] == [(4, 11)]
    assert [(f.line, f.col) for f in result.findings] == sorted((f.line, f.col) for f in result.findings)
    assert all(f.path == "train.py" for f in result.findings)


def test_every_rule_has_a_kebab_case_name_and_a_docstring_that_says_why():
    names = [rule.name for rule in all_rules()]
    assert len(set(names)) == len(names)
    for rule in all_rules():
        assert re.fullmatch(r"[a-z]+(-[a-z]+)+", rule.name), rule.name
        doc = rule.__doc__ or ""
        assert "Why:" in doc and "Example" in doc and "Leaves alone" in doc, rule.__name__


def test_rules_run_in_the_documented_order():
    names = [rule.name for rule in all_rules()]
    order = ["init-runtime", "rank-device", "distributed-model", "distributed-optimizer",
             "shard-training-loader", "distributed-save", "main-process-print", "rank-divergent-code"]
    assert [n for n in names if n in order] == order
