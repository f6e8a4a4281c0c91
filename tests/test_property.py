"""Properties of every conversion, on generated programs and on mutated fixtures.

For any input: no crash (a generated file may be refused with a ConversionError, never a traceback
from a rule; a fixture, its mutations, and a generated program that converted once with a comment on
every line, may not be refused), the output compiles when the input does, a second run changes nothing, every comment of
the input is still in the output, and a file the rules leave alone comes back byte for byte.

CI runs a bounded number of examples (``DPMIGRATE_PROPERTY_EXAMPLES``, default 60 per strategy);
``DPMIGRATE_PROPERTY_EXAMPLES=5000 pytest tests/test_property.py`` is the long run by hand.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from collections import Counter
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import ConversionError, Options

EXAMPLES = int(os.environ.get("DPMIGRATE_PROPERTY_EXAMPLES", "60"))
FIXTURES = sorted((Path(__file__).parent.parent / "fixtures").glob("*/*/before.py"))
TRAINING_TAIL = (
    "\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = torch.utils.data.DataLoader(range(4), batch_size=2)\nfor x in loader:\n"
    "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\nprint('done')\n"
    "torch.save(model.state_dict(), 'm.pt')\n"
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])


def comments(source: bytes) -> Counter:
    try:
        tokens = tokenize.tokenize(io.BytesIO(source).readline)
        return Counter(t.string for t in tokens if t.type == tokenize.COMMENT)
    except (tokenize.TokenError, SyntaxError):
        return Counter()


def check_properties(source: bytes, options: Options = Options(), refusal_allowed: bool = True) -> bool:
    """The properties; False when the file was refused (a ConversionError), which only ``refusal_allowed`` permits."""
    try:
        result = convert(source, "generated.py", options)
    except ConversionError as e:
        # refused with a reason (does not parse, cannot be reprinted exactly...): allowed for generated
        # programs, never for a program that converted before a harmless mutation, nor for a fixture
        assert refusal_allowed, f"refused: {e}"
        return False
    output = result.output
    try:
        compile(source, "in.py", "exec")
    except (SyntaxError, ValueError):
        pass
    else:
        compile(output, "out.py", "exec")
    if not any(f.severity == "change" for f in result.findings):
        assert output == source, "no change reported, yet the bytes changed"
    missing = comments(source) - comments(output)
    assert not missing, f"comments lost: {sorted(missing)}"
    again = convert(output, "generated.py", options)
    assert again.output == output, "a second run changed the file"
    assert not [f for f in again.findings if f.severity == "change"]
    return True


def _still_converts_with_comments(source: str) -> None:
    """A generated program that converted must still convert with a comment on every line."""
    try:
        mutated = comment_everywhere(source)
        compile(mutated, "mutated.py", "exec")
    except (SyntaxError, ValueError, tokenize.TokenError, IndentationError):
        return  # the mutation itself is not valid Python here (a line continuation inside a string...)
    check_properties(mutated.encode(), refusal_allowed=False)


@SETTINGS
@given(hypothesmith.from_grammar(auto_target=False))
def test_generated_programs_importing_torch(program):
    source = "import torch\n" + program
    if check_properties(source.encode()):
        _still_converts_with_comments(source)


@SETTINGS
@given(hypothesmith.from_grammar(auto_target=False))
def test_generated_programs_around_a_training_loop(program):
    source = "import torch\n" + program + TRAINING_TAIL
    if check_properties(source.encode()):
        _still_converts_with_comments(source)


# --- mutations of the fixtures ------------------------------------------------------------------


def _logical_lines(source: str) -> list[tuple[int, int, int]]:
    """(first line, last line, indent) of each logical line (1-based), from the tokenizer."""
    found, start, indent = [], None, 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        if start is None and token.type != tokenize.ENDMARKER:
            start, indent = token.start[0], token.start[1]
        if token.type == tokenize.NEWLINE and start is not None:
            found.append((start, token.start[0], indent))
            start = None
    return found


def comment_everywhere(source: str) -> str:
    """A comment line above every logical line and a comment at the end of each one."""
    lines = source.splitlines(keepends=True)
    for number, (first, last, indent) in enumerate(reversed(_logical_lines(source))):
        text = lines[last - 1]
        if "#" not in text and not text.rstrip("\r\n").endswith("\\"):
            lines[last - 1] = text.rstrip("\r\n") + f"  # end {number}" + text[len(text.rstrip("\r\n")):]
        lines.insert(first - 1, " " * indent + f"# above {number}\n")
    return "".join(lines)


def wrap_in_main_guard(source: str) -> str:
    body = "".join("    " + line if line.strip() else line for line in source.splitlines(keepends=True))
    return 'if __name__ == "__main__":\n' + body


def wrap_in_function(source: str) -> str:
    body = "".join("    " + line if line.strip() else line for line in source.splitlines(keepends=True))
    return "def run():\n" + body + "\n\nrun()\n"


def alias_torch(source: str) -> str:
    """``import torch`` as another name, every use renamed (whole words only)."""
    if not re.search(r"^import torch$", source, re.M):
        return source
    renamed = re.sub(r"(?<![\w.])torch(?=\.)", "T", source)
    return re.sub(r"^import torch$", "import torch as T", renamed, flags=re.M)


def decorate_functions(source: str) -> str:
    return re.sub(r"^(\s*)def ", r"\1@staticmethod.__func__ if False else (lambda f: f)\n\1def ", source, flags=re.M)


MUTATIONS = [comment_everywhere, wrap_in_main_guard, wrap_in_function, alias_torch, decorate_functions]


def _valid_pair(fixture: Path, mutation) -> bool:
    """Wrapping a file in a block is valid Python unless it holds ``from __future__`` imports; a mutation that leaves
    the fixture as it is (``alias_torch`` of a file with no ``import torch``, ``decorate_functions`` of one with no
    ``def``) is the fixture itself: its own test checks its exact output, second run and compilation, and its other
    mutations (a comment on every line at least) check both option sets on the same code."""
    source = fixture.read_text(encoding="utf-8")
    if mutation(source) == source:
        return False
    return mutation not in (wrap_in_main_guard, wrap_in_function) or "from __future__" not in source


PAIRS = [(f, m) for f in FIXTURES for m in MUTATIONS if _valid_pair(f, m)]


@pytest.mark.parametrize(("fixture", "mutation"), PAIRS,
                         ids=[f"{f.parent.parent.name}/{f.parent.name}-{m.__name__}" for f, m in PAIRS])
def test_mutated_fixtures_keep_the_properties(fixture, mutation):
    mutated = mutation(fixture.read_text(encoding="utf-8"))
    compile(mutated, "mutated.py", "exec")  # the mutation itself must give valid Python
    check_properties(mutated.encode(), refusal_allowed=False)  # every fixture converts: so must its mutations
    check_properties(mutated.encode(), Options(batch="global", scale_lr="linear"), refusal_allowed=False)


@SETTINGS
@given(st.sampled_from(FIXTURES), st.lists(st.sampled_from(MUTATIONS[:1] + MUTATIONS[3:]), max_size=3))
def test_fixtures_under_random_mutation_chains(fixture, chain):
    source = fixture.read_text(encoding="utf-8")
    for mutation in chain:
        source = mutation(source)
    check_properties(source.encode(), refusal_allowed=False)
