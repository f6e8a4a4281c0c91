"""A file dpmigrate converted before is checked without libcst when nothing in it can be rank-divergent (issue 18:
a pre-commit run on an already-converted file under 300 ms); the answer is exactly the engine's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from fixture_cases import FIXTURES

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Options
from dpmigrate.run.fast_path import quiet_conversion

CONVERTED = sorted([*FIXTURES.glob("torch/*/after.py"), *FIXTURES.glob("tensorflow/*/after.py"),
                    *FIXTURES.glob("paddle/*/after.py")])


@pytest.mark.parametrize("after", CONVERTED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_the_fast_answer_is_the_engines(after):
    source = after.read_bytes()
    fast = quiet_conversion(source, "after.py")
    if fast is None:
        return  # the engine answers (a rank test around something that may meet the others, Paddle, ...)
    slow = convert(source, "after.py", Options())
    assert (fast.output, fast.findings, fast.framework) == (slow.output, slow.findings, slow.framework)


def test_most_converted_fixtures_take_the_fast_way():
    fast = [p for p in CONVERTED if quiet_conversion(p.read_bytes(), "after.py") is not None]
    assert len(fast) >= len([p for p in CONVERTED if "/paddle/" not in str(p)]) // 2, [p.parent.name for p in fast]


@pytest.mark.parametrize("guarded", [
    "if dp.is_main_process():\n    dp.save(model, 'm.pt')\n",
    "is_main = dp.rank() == 0\nif is_main:\n    dp.barrier()\n",
    "for step in range(3):\n    if dp.local_rank() == 0:\n        break\n",
    "if dp.is_main_process():\n    helper()\n",
])
def test_a_rank_test_around_what_may_meet_the_other_ranks_goes_to_the_engine(guarded):
    source = "import torch\nimport dpmigrate.runtime.torch as dp\n\ndef helper():\n    pass\n" + guarded
    assert quiet_conversion(source.encode(), "t.py") is None


def test_a_precommit_check_of_a_converted_file_loads_no_libcst(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes((FIXTURES / "torch" / "synthetic_mnist" / "after.py").read_bytes())
    code = textwrap.dedent(f"""
        import sys
        from dpmigrate.cli import main
        code = main(["--check", {str(script)!r}])
        print(code, "libcst" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "False"]
