"""``dpmigrate launch``: run a training script on N processes per node, one command for every framework.

The package: :mod:`.cli` (the command line, checks, framework detection), :mod:`.backend` (what a
framework backend provides, as plain data and one Protocol), one module per framework backend
(:mod:`.torch`; :mod:`.paddle`, with its relay :mod:`.paddle_launcher` and rank wrapper
:mod:`.paddle_rank`), the neutral supervisor (:mod:`.supervise`, :mod:`.streams`, :mod:`.processes`),
the per-rank exit recorder used under a framework's launcher (:mod:`.rank_status`) and the final report
(:mod:`.report`). Importing it loads no framework.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``dpmigrate launch ARGS``; returns the exit code."""
    # Imported on call: ``python -m dpmigrate.launch.rank_status`` (each rank's wrapper) imports this
    # package first, and must not find its own module already loaded through the command line's imports.
    from .cli import main as cli_main

    return cli_main(argv)
