"""The run as SARIF 2.1.0, so GitHub code scanning (and any SARIF viewer) shows the findings in review.

Mapping: every rule is a ``reportingDescriptor`` in ``tool.driver.rules``; a finding is a
``result`` whose level follows its severity (error -> "error", declined -> "warning",
change/note -> "note"), located by a path relative to the folder the run started in
(``%SRCROOT%``, the repository root in CI) and a 1-based line and column. A file that could not
be converted at all is reported under the rule ``not-converted``, level "error".

The output is checked against the official SARIF 2.1.0 JSON schema (OASIS, errata 01) with its URI formats
in tests/test_sarif_schema.py: code scanning rejects a whole upload over one invalid field.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Sequence

from .. import __version__
from .report import FileResult, ordered

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "declined": "warning", "change": "note", "note": "note"}
NOT_CONVERTED = ("not-converted",
                 "The file could not be converted: it does not parse, is not text, or cannot be written.")


def render_sarif(results: Sequence[FileResult], catalog: Sequence[tuple[str, str]], root: str | None = None) -> str:
    """``catalog`` is (rule name, description) for every known rule; rules only seen in results are added."""
    root = os.path.abspath(root or os.getcwd())
    known = dict(catalog)
    used = [f.rule for r in results for f in r.findings]
    if any(r.failure for r in results):
        used.append(NOT_CONVERTED[0])
        known.setdefault(*NOT_CONVERTED)
    for name in used:
        known.setdefault(name, name)
    index = {name: i for i, name in enumerate(known)}
    sarif_results = []
    for r in results:
        for f in ordered(r.findings):
            text = f.message if not f.fix else f"{f.message} Fix: {f.fix}"
            sarif_results.append(_result(f.rule, index[f.rule], LEVELS[f.severity], text, r.path, f.line, f.col, root))
        if r.failure:
            sarif_results.append(_result(NOT_CONVERTED[0], index[NOT_CONVERTED[0]], "error", r.failure.reason,
                                         r.path, r.failure.line or 1, r.failure.col or 1, root))
    driver = {
        "name": "dpmigrate",
        "version": __version__,
        "informationUri": "https://pypi.org/project/dpmigrate/",
        "rules": [
            {"id": name, "name": name, "shortDescription": {"text": _first_line(text)},
             "fullDescription": {"text": text}}
            for name, text in known.items()
        ],
    }
    document = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": driver},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": _as_uri(os.path.join(root, ""))}},  # a folder: ends in /
            "results": sarif_results,
            "invocations": [{"executionSuccessful": not any(r.failure for r in results)}],
            "columnKind": "unicodeCodePoints",
        }],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _result(rule: str, rule_index: int, level: str, text: str, path: str, line: int, col: int, root: str) -> dict:
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, root)
    # Outside the run's folder: an absolute file URI, no base. (A folder named like ..data is inside.)
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        location = {"uri": _as_uri(absolute)}
    else:
        location = {"uri": urllib.parse.quote(relative.replace(os.sep, "/")), "uriBaseId": "%SRCROOT%"}
    return {
        "ruleId": rule,
        "ruleIndex": rule_index,
        "level": level,
        "message": {"text": text},
        "locations": [{"physicalLocation": {
            "artifactLocation": location,
            "region": {"startLine": max(line, 1), "startColumn": max(col, 1)},
        }}],
    }


def _as_uri(absolute: str) -> str:
    return "file://" + urllib.parse.quote(absolute.replace(os.sep, "/"))


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]
