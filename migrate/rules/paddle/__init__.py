"""PaddlePaddle: the vocabulary only, so far (no rules yet: files are detected and left alone).

Detection uses it to say which API generation a file is written in.
"""

from __future__ import annotations

from ...codemod.vocabulary import Vocabulary

VOCABULARY = Vocabulary(
    framework="paddle",
    display_name="PaddlePaddle",
    runtime_module="dpmigrate.runtime.paddle",
    default_generation="dygraph",
    generations=(
        ("paddle.fluid", "fluid"),
        ("paddle.static", "static"),
        ("paddle.enable_static", "static"),
    ),
)

RULES = ()
