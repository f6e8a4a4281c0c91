"""The vocabulary shared by the engine, the rules, the reports and the CLI.

Kept apart so that the CLI and the reporters depend on plain data, never on libcst or a rule.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Severity = Literal["change", "declined", "error", "note"]
BatchPolicy = Literal["per-device", "global"]
LrPolicy = Literal["none", "linear", "sqrt"]
FrameworkChoice = Literal["auto", "torch", "tensorflow", "paddle"]


@dataclasses.dataclass(frozen=True)
class Options:
    """What the user chose (command line over ``[tool.dpmigrate]``); every rule reads the same object.

    ``select`` and ``ignore`` hold rule names (``dpmigrate --list-rules``): an empty ``select``
    runs every rule; a rule in ``ignore`` never runs, even when selected.
    """

    framework: FrameworkChoice = "auto"
    batch: BatchPolicy = "per-device"
    scale_lr: LrPolicy = "none"
    sync_batchnorm: bool = False  # batch normalisation synchronised over the ranks, in the framework's own form
    select: tuple[str, ...] = ()  # run only these rules (empty: every rule)
    ignore: tuple[str, ...] = ()  # never run these rules
    # (function, return position, role) of this module's functions, from the scripts that import it:
    # ("get_loaders", 0, "train") makes the loader get_loaders() returns first a training loader
    returned_roles: tuple[tuple[str, int, str], ...] = ()
    # the run's local modules (``data`` for data.py beside a script): calls into them are followed across files
    local_modules: tuple[str, ...] = ()
    # (local module name, framework) of the run's local modules that use one: a script importing no framework
    # itself but ("setup_mod", "tensorflow") is a TensorFlow script (detection, codemod/detect.py)
    local_frameworks: tuple[tuple[str, str], ...] = ()
    # "module.function" of local modules' functions that download, "module.Class" of their classes whose
    # construction does (pretrained weights in __init__): their calls run on the main process first
    downloading_functions: tuple[str, ...] = ()
    # (local module name, its top-level framework imports as source lines) of the modules a script of the run
    # star-imports (``from utils import *`` bringing ``import paddle``): written out in the script, so that its
    # framework names resolve (codemod/star_imports.py)
    star_framework_imports: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the run's local modules that import ``logging``: a script that logs through them gets the main-process switch
    local_logging: tuple[str, ...] = ()
    # "module.Name" of the local modules' classes and functions that build batch normalisation layers
    local_batchnorm_models: tuple[str, ...] = ()
    # "module.Class" of the local modules' model classes whose forward calls a layer only under a condition, or never
    local_unreached_layer_models: tuple[str, ...] = ()
    # "module.function:index:parameter" of the local modules' functions whose loop over that parameter trains: a
    # loader the script hands there is a training loader (``utils.train_per_epoch(loader, model, opt)``)
    local_training_parameters: tuple[str, ...] = ()
    # "module.function" of the local modules' functions that train: a file calling one trains (``train_model()``)
    local_trainers: tuple[str, ...] = ()
    # set when this file is a local module a converted training script imports: the random generators that
    # script seeds ("python", "numpy", "framework"); its data sets' constructors then build training data
    importer_seeds: tuple[str, ...] | None = None

    def runs(self, rule: str) -> bool:
        """Whether the rule named ``rule`` is to run under this selection."""
        return (not self.select or rule in self.select) and rule not in self.ignore


@dataclasses.dataclass(frozen=True)
class Finding:
    """One reported site: a change made, a site declined (with the manual fix), an error or a note.

    ``line`` is 1-based, ``col`` is 1-based (as editors and SARIF count), both in the input file.
    """

    path: str
    line: int
    col: int
    rule: str
    severity: Severity
    message: str
    fix: str | None = None  # for "declined" and "error": what the user should do by hand
    # what a change does to how the job trains, for the summary line: "shard" (training data split between the
    # ranks), "split-batch" (--batch global applied to a batch size), "scale-lr", "scale-loss"; None: nothing of that
    effect: str | None = None

    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


@dataclasses.dataclass(frozen=True)
class Conversion:
    """The result of converting one file: the new bytes (same encoding and line endings) and findings."""

    path: str
    original: bytes
    output: bytes
    findings: tuple[Finding, ...] = ()
    framework: str | None = None  # "torch", "tensorflow", "paddle", or None when none was detected
    generation: str | None = None  # the framework's API generation: "eager", "tf1-graph", "tf2-keras", "fluid"...
    left_alone: str | None = None  # why the whole script was left unchanged (its own processes, DDP by hand...)
    # (qualified function name, return position) of imported functions whose results this file trains on
    imported_training_returns: tuple[tuple[str, int], ...] = ()

    @property
    def changed(self) -> bool:
        return self.output != self.original

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


class ConversionError(Exception):
    """A file that cannot be converted at all (does not parse, is not text). The file is left untouched."""

    def __init__(self, path: str, reason: str, line: int | None = None, col: int | None = None):
        self.path, self.reason, self.line, self.col = path, reason, line, col
        where = path if line is None else f"{path}:{line}:{col or 1}"
        super().__init__(f"{where}: {reason}")
