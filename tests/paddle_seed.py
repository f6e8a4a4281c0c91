"""The scripts of seed 001 (Paddle Fleet's four-step conversion), read from the seed's own text.

The seed is a web page as scraped: every line is followed by an empty one, indentation is made of
non-breaking spaces, and string quotes became typographic ones. :func:`seed_script` undoes exactly
that (nothing else) so the scripts can be compared with, and run as, Python.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

SEEDS = Path("/work/shared/seeds")  # the user's source documents, on the machine this project was built on
COPY = Path(__file__).resolve().parent.parent / "fixtures" / "paddle" / "seed_fleet" / "seed_001.txt"  # its copy
SINGLE_CARD = ("# 下面是一个简单的单机单卡程序", "单机单卡改多机多卡操作流程")
WITH_FLEET = ("# -*- coding: utf-8 -*-", "运行多机多卡程序与单卡程序略有不同")


def seed_text() -> str:
    """The seed, from the shared folder where it exists, else from the fixture's byte-identical copy."""
    found = sorted(SEEDS.glob("001_*.txt"))
    return (found[0] if found else COPY).read_text(encoding="utf-8")


def seed_script(markers: tuple[str, str]) -> str:
    """The script between the two markers, as Python source."""
    text = seed_text()
    start = text.index(markers[0])
    body = text[start:text.index(markers[1], start)]
    lines = []
    for line in body.split("\n"):
        if line == "":
            continue  # the scrape's doubling
        line = line.replace("\xa0", " ").replace("\u2018", "'").replace("\u2019", "'").rstrip()
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def meaningful_lines(source: str) -> list[str]:
    """The script's logical lines, comments and blank lines left out, each as its tokens joined by one space
    and indented by its depth: ``exe.run(a,\n    b)`` and ``exe.run(a, b)`` are the same line."""
    lines, tokens, depth = [], [], 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.INDENT:
            depth += 1
        elif token.type == tokenize.DEDENT:
            depth -= 1
        elif token.type == tokenize.NEWLINE:
            lines.append("    " * depth + " ".join(tokens))
            tokens = []
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
            tokens.append(token.string)
    return lines
