"""``[tool.dpmigrate]`` in ``pyproject.toml``: a project's defaults, so every run and every hook converts alike.

Found the way ruff finds its own: the nearest ``pyproject.toml`` from a starting folder upward
that holds a ``[tool.dpmigrate]`` table (one without it is passed over, so a sub-package's
packaging file does not hide the repository's settings). The keys are the command-line flags::

    [tool.dpmigrate]
    batch = "global"                    # --batch
    scale-lr = "linear"                 # --scale-lr
    sync-batchnorm = true               # --sync-batchnorm
    framework = "torch"                 # --framework
    select = ["distributed-save"]       # --select: run only these rules
    ignore = ["main-process-print"]     # --ignore: never run these
    exclude = ["legacy/", "*_pb2.py"]   # paths a folder walk skips (.gitignore syntax, relative to this file)

A flag given on the command line replaces its key. A key or a value this module does not know is
an error naming the file, never silently ignored. Whether rule names exist is checked by the
caller, which knows the rules (this module loads none).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, get_args

from .findings import BatchPolicy, FrameworkChoice, LrPolicy
from .frameworks import REGISTRY

FILENAME = "pyproject.toml"
CHOICES: dict[str, tuple[str, ...]] = {
    "batch": get_args(BatchPolicy),
    "scale-lr": get_args(LrPolicy),
    "framework": ("auto", *REGISTRY),  # the registry's frameworks
}
LISTS = ("select", "ignore", "exclude")
BOOLS = ("sync-batchnorm",)


class ConfigError(Exception):
    """A pyproject.toml that cannot be read, or a [tool.dpmigrate] key or value that is not understood."""


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings of one ``[tool.dpmigrate]`` table; ``None`` where the table does not set a key."""

    path: str | None = None  # the pyproject.toml they came from; None when there is none
    batch: BatchPolicy | None = None
    scale_lr: LrPolicy | None = None
    sync_batchnorm: bool | None = None
    framework: FrameworkChoice | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    @property
    def root(self) -> str:
        """The folder ``exclude`` patterns are relative to: the one holding the pyproject.toml."""
        return os.path.dirname(self.path) if self.path else os.getcwd()


def load(start: str) -> Config:
    """The nearest ``[tool.dpmigrate]`` table from folder ``start`` upward; an empty Config when there is none."""
    folder = os.path.abspath(start)
    while True:
        candidate = os.path.join(folder, FILENAME)
        if os.path.isfile(candidate):
            table = _tool_table(candidate)
            if table is not None:
                return _parse(candidate, table)
        parent = os.path.dirname(folder)
        if parent == folder:
            return Config()
        folder = parent


def _tool_table(path: str) -> dict[str, Any] | None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the tests run on 3.11
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: is not valid TOML ({exc}); fix it, or run from a folder outside it") from None
    tool = document.get("tool")
    table = tool.get("dpmigrate") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: tool.dpmigrate must be a table ([tool.dpmigrate]), got {table!r}")
    return table


def _parse(path: str, table: dict[str, Any]) -> Config:
    values: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{path}: [tool.dpmigrate] {key}"
        if key in CHOICES:
            if value not in CHOICES[key]:
                choices = ", ".join(f'"{c}"' for c in CHOICES[key])
                raise ConfigError(f"{where} = {_toml(value)}: expected one of {choices}")
        elif key in LISTS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f'{where} = {_toml(value)}: expected a list of strings, e.g. {key} = ["..."]')
            value = tuple(value)
        elif key in BOOLS:
            if not isinstance(value, bool):
                raise ConfigError(f"{where} = {_toml(value)}: expected true or false")
        else:
            known = ", ".join(sorted([*CHOICES, *LISTS, *BOOLS]))
            raise ConfigError(f"{where}: unknown key; the keys are {known}")
        values[key.replace("-", "_")] = value
    return Config(path=path, **values)


def _toml(value: Any) -> str:
    """A value as it would be written in the file (``"x"``, ``["a", "b"]``, ``3``)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return repr(value)
