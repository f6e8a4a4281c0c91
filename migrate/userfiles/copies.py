"""``-o DIR``: where each copy goes, which copies are refused, and the local modules copied with a script.

The copies mirror the tree of what was named (``Source.relative``). A run is refused, with nothing written,
when two inputs would be written to one copy or a copy would replace its own source. A converted script
imports its local modules (``data.py``, ``src/data.py``): the run converts those that need it, and the
others are copied beside the script's copy byte for byte (:func:`copy_local_modules`), so that the copy
runs as it is, launched or not. Every copy is written by :func:`~dpmigrate.userfiles.writing.write_copy`: never
through a link inside ``DIR``, atomically.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from ..reporting.report import Failure, FileResult
from ..run.converting import read_regular
from .selection import Source
from .writing import WriteError, same_file, write_copy


def clashing_copies(sources: Sequence[Source]) -> str | None:
    """Two inputs that -o would write to the same copy (``a/train.py`` and ``b/train.py`` given as files)."""
    seen: dict[str, str] = {}
    for source in sources:
        other = seen.setdefault(os.path.normcase(source.relative), source.path)
        if other != source.path:
            return f"{other} and {source.path} would both be written to {source.relative}"
    return None


def copies_onto_sources(sources: Sequence[Source], output_dir: str) -> str | None:
    """A source that -o would replace by its own copy (``-o .`` in the sources' folder), named."""
    for source in sources:
        if same_file(source.path, os.path.join(output_dir, source.relative)):
            return f"the copy of {source.path} would replace the source itself"
    return None


def local_module_copies(written: Sequence[Source], needed: Mapping[str, Sequence[str]],
                        run: Sequence[Source]) -> list[tuple[Source, str]]:
    """(module, script) for each local module a script of ``written`` imports that the run itself did not write,
    the module's ``relative`` putting it beside its script's copy (``src/data.py`` beside ``main.py``).

    ``needed``: script path -> its local modules, relative to its folder (``LocalModules.needed``). A module
    that is a file of the ``run`` (converted, or failed and reported) is never copied over its own result."""
    taken = {os.path.normcase(os.path.normpath(s.relative)) for s in run}
    copies: list[tuple[Source, str]] = []
    for script in written:
        folder = os.path.dirname(os.path.realpath(script.path))
        for relative in needed.get(script.path, ()):
            beside = os.path.normpath(os.path.join(os.path.dirname(script.relative), relative))
            if os.path.normcase(beside) in taken:
                continue
            taken.add(os.path.normcase(beside))
            shown, real = os.path.join(os.path.dirname(script.path), relative), os.path.join(folder, relative)
            copies.append((Source(shown if os.path.realpath(shown) == os.path.realpath(real) else real, beside),
                           script.path))
    return copies


def copy_local_modules(sources: Sequence[Source], needed: Mapping[str, Sequence[str]],
                       results: Sequence[FileResult], output_dir: str, say: Callable[[str], None]) -> list[FileResult]:
    """Copy, unchanged, the local modules of the scripts whose copies were written; the failures, as results
    (a module that cannot be copied fails like a file that cannot be written: exit 2, its path and reason)."""
    written = {r.path for r in results if not r.failure}
    failures = []
    for module, script in local_module_copies([s for s in sources if s.path in written], needed, sources):
        try:
            data, _ = read_regular(module.path)
            if same_file(module.path, os.path.join(output_dir, module.relative)):
                continue  # already there: the module itself
            destination = write_copy(output_dir, module.relative, data, like=module.path)
        except WriteError as exc:
            failures.append(FileResult(module.path, failure=Failure(exc.reason)))
            continue
        except OSError as exc:
            failures.append(FileResult(module.path, failure=Failure(f"cannot be copied: {exc.strerror or exc}")))
            continue
        say(f"Copying {module.path} -> {destination} (unchanged: a local module of {script})")
    return failures
