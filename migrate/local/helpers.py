"""Which files of one run are helper modules of a script that was left unchanged.

A script that starts its own processes (Hogwild), or was written for DDP by hand, is left as it
is. Its local modules (``from train import train`` next to it) must then stay as they are too:
converting ``train.py`` alone would shard a loader and average gradients that the untouched script
never set up for, so the project would train differently from both the original and a conversion.

Local imports are read with :mod:`ast` (cheap, no libcst) by :mod:`.local_modules`, which says what a
local module is (``data.py``, a package, a folder without ``__init__.py``) and which files of a run another
file of it imports (``LocalModules.imported``: only their writes wait). Helpers of helpers are followed.
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence

from ..findings import Conversion, Finding
from ..userfiles.selection import Source
from .modules import local_imports

RULE = "detect-framework"


@dataclasses.dataclass(frozen=True)
class Held:
    """``path`` stays unchanged because ``script`` (which imports it) was left alone for ``reason``."""

    path: str
    script: str
    reason: str


def held_helpers(conversions: Iterable[Conversion]) -> dict[str, Held]:
    """Every converted file (by real path) that a left-alone script of the run imports, directly or not."""
    by_path = {os.path.realpath(c.path): c for c in conversions}
    held: dict[str, Held] = {}
    for real, conversion in by_path.items():
        if conversion.left_alone is None:
            continue
        pending = list(local_imports(conversion.path, conversion.original))
        while pending:
            helper = pending.pop()
            if helper in held or helper == real or helper not in by_path:
                continue
            held[helper] = Held(by_path[helper].path, conversion.path, conversion.left_alone)
            pending.extend(local_imports(helper, by_path[helper].original))
    return held


def hold(conversion: Conversion, held: Held) -> Conversion:
    """``conversion`` undone: the original bytes, and one finding saying why."""
    reason = held.reason.removesuffix("; left unchanged")
    finding = Finding(
        conversion.path, 1, 1, RULE, "declined",
        f"a helper module of {held.script}, which is left unchanged ({reason}); converting this module alone "
        "would change how that script trains",
        f"convert {held.script} by hand (or restructure it for one process per rank), then its modules",
    )
    return dataclasses.replace(conversion, output=conversion.original, findings=(finding,))


@dataclasses.dataclass
class Hints:
    """What the scripts of a run do with what one local module returns: that module's conversion options."""

    path: str  # as shown to the user (beside the script that imports it)
    script: str
    roles: set[tuple[str, int, str]] = dataclasses.field(default_factory=set)

    def returned_roles(self) -> tuple[tuple[str, int, str], ...]:
        return tuple(sorted(self.roles))

    def source_beside(self, sources: Sequence[Source]) -> Source:
        """A Source for this module, its ``relative`` (for ``-o``) beside the script that imports it."""
        script = next(s for s in sources if s.path == self.script)
        relative = os.path.relpath(self.path, os.path.dirname(script.path) or ".")
        return Source(self.path, os.path.join(os.path.dirname(script.relative), relative))


def training_hints(conversions: Iterable[Conversion]) -> dict[str, Hints]:
    """Local modules (by real path) whose functions return loaders that a script of the run trains on.

    ``from data import get_loaders`` / ``import data`` resolve to ``data.py`` (or ``data/__init__.py``)
    beside the script; ``pkg.data.get_loaders`` to ``pkg/data.py``.
    """
    hints: dict[str, Hints] = {}
    for conversion in conversions:
        folder = os.path.dirname(conversion.path)
        for qualified, position in conversion.imported_training_returns:
            *module, function = qualified.split(".")
            if not module:
                continue
            for relative in (os.path.join(*module) + ".py", os.path.join(*module, "__init__.py")):
                shown = os.path.join(folder, relative)
                if os.path.isfile(shown):
                    real = os.path.realpath(shown)
                    entry = hints.setdefault(real, Hints(shown, conversion.path))
                    entry.roles.add((function, position, "train"))
                    break
    return hints


def read_as_local_module(conversion: Conversion, hints: Hints) -> Conversion:
    """``conversion`` of a module the run was not asked to convert, with a finding saying why it was read and what
    came of it: "converted so that they are sharded" only when something was (issue 19: a hand-batching generator
    module came back unchanged under that note)."""
    functions = ", ".join(sorted({f"{f}()" for f, _, _ in hints.roles}))
    read = f"read as a local module of {hints.script}, which trains on what {functions} returns"
    if conversion.output != conversion.original:
        finding = Finding(conversion.path, 1, 1, RULE, "note", f"{read}: converted with it so that it is sharded")
    elif any(f.severity in ("declined", "error") for f in conversion.findings):
        finding = Finding(conversion.path, 1, 1, RULE, "note", f"{read}: left unchanged, for the reasons below")
    else:
        why = "it imports no framework" if conversion.framework is None else "it builds no DataLoader there"
        finding = Finding(
            conversion.path, 1, 1, RULE, "declined",
            f"{read}, but nothing here could be sharded ({why}): every rank would read all of it",
            "return a DataLoader over a Dataset from it (dpmigrate then shards it), or give each rank its part of "
            "every batch it makes (dp.shard(x))",
        )
    return dataclasses.replace(conversion, findings=(finding, *conversion.findings))



def imported_helpers(scripts: Iterable[str], needed: Mapping[str, Sequence[str]], taken: set[str]) -> dict[str, Hints]:
    """Local modules (by real path) that the converted ``scripts`` import and the run neither names nor reads for
    its loaders (``taken``): ``pytorchtools.py`` whose ``EarlyStopping`` saves a checkpoint. Converted with the
    script, their saves and prints become rank-aware as the script's own are; otherwise every rank writes the
    same checkpoint at once while the others read it (the torch audit's early-stopping script). Their downloads
    stay: the script runs the calls that download under ``dp.main_process_first()`` (local_downloads.py)."""
    found: dict[str, Hints] = {}
    for script in scripts:
        folder = os.path.dirname(script)
        for relative in needed.get(script, ()):
            shown = os.path.normpath(os.path.join(folder, relative))
            real = os.path.realpath(shown)
            if real not in taken and real not in found and os.path.isfile(shown):
                found[real] = Hints(shown, script)
    return found


def read_as_imported_helper(conversion: Conversion, hints: Hints) -> Conversion | None:
    """``conversion`` of a helper module a converted script imports, with a note saying why it was converted;
    None when the conversion changes nothing there and says nothing worth reading (a module of models)."""
    if conversion.output == conversion.original and not any(
            f.severity in ("declined", "error") for f in conversion.findings):
        return None
    done = "converted with it, as the changes below say" if conversion.output != conversion.original \
        else "left unchanged, for the reasons below"
    finding = Finding(conversion.path, 1, 1, RULE, "note",
                      f"read as a local module of {hints.script}, which imports it: {done}")
    return dataclasses.replace(conversion, findings=(finding, *conversion.findings))


_SEED_CALLS = {"manual_seed": ("framework",), "set_seed": ("python", "numpy", "framework"),  # transformers, accelerate
               "seed_everything": ("python", "numpy", "framework"), "set_random_seed": ("python", "numpy", "framework")}


def seeded_families(path: str) -> tuple[str, ...]:
    """The random generators a script seeds anywhere (``torch.manual_seed``, ``np.random.seed``, ``random.seed``,
    ``paddle.seed``, ``tf.random.set_seed``, ``seed_everything``...), read with :mod:`ast`: what its local
    modules' data sets draw after that is the same on every rank."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name == "set_seed" and owner.endswith("random"):
            found.add("framework")  # tf.random.set_seed: TensorFlow's generator alone
        elif name in _SEED_CALLS:
            found.update(_SEED_CALLS[name])
        elif name == "seed" and owner.split(".")[-1] == "random":
            found.add("numpy" if owner.split(".")[0] in ("np", "numpy") else "python")
        elif name == "seed":
            found.add("framework")  # paddle.seed(...)
    return tuple(sorted(found))
