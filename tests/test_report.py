"""The text, JSON and SARIF renderings of a run, from plain findings (no engine needed)."""

from __future__ import annotations

import json
import os

from dpmigrate.findings import Finding
from dpmigrate.reporting.report import Failure, FileResult, Summary, policy_line, render_json, render_text
from dpmigrate.reporting.sarif import render_sarif


def run_results(root: str) -> list[FileResult]:
    train = os.path.join(root, "src", "train.py")
    return [
        FileResult(train, changed=True, framework="torch", findings=(
            Finding(train, 40, 9, "save-on-main", "declined", "torch.save inside a helper",
                    fix="call dp.save(obj, path)"),
            Finding(train, 12, 5, "shard-training-loader", "change", "sharded the training DataLoader"),
            Finding(train, 55, 1, "rank-divergent", "error", "barrier only on rank 0",
                    fix="call dp.barrier() on every rank"),
            Finding(train, 3, 1, "runtime-import", "note", "added import dpmigrate.runtime.torch as dp"),
        )),
        FileResult(os.path.join(root, "util.py")),
        FileResult(os.path.join(root, "broken.py"), failure=Failure("does not parse: expected ')'", 7, 3)),
    ]


def test_text_report_is_one_line_per_finding_by_position_with_fixes_and_a_summary(tmp_path):
    results = run_results(str(tmp_path))
    train = results[0].path
    assert render_text(results).splitlines() == [
        f"{train}:3:1: note runtime-import: added import dpmigrate.runtime.torch as dp",
        f"{train}:12:5: change shard-training-loader: sharded the training DataLoader",
        f"{train}:40:9: declined save-on-main: torch.save inside a helper",
        "    fix: call dp.save(obj, path)",
        f"{train}:55:1: error rank-divergent: barrier only on rank 0",
        "    fix: call dp.barrier() on every rank",
        "3 files, 1 changed, 1 change, 1 declined, 1 error, 1 not converted",
    ]


def test_summary_counts_and_plurals():
    assert Summary(3, 2, 5, 1, 0, 0, 0).line() == "3 files, 2 changed, 5 changes, 1 declined, 0 errors"
    assert Summary(1, 0, 1, 0, 1, 0, 0).line() == "1 file, 0 changed, 1 change, 0 declined, 1 error"
    assert render_text([]) == "0 files, 0 changed, 0 changes, 0 declined, 0 errors\n"


def test_failure_line_names_path_line_and_reason():
    located = FileResult("a.py", failure=Failure("does not parse", 7, 3))
    assert located.failure_line() == "a.py:7:3: error: does not parse"
    unlocated = FileResult("a.py", failure=Failure("cannot be read: gone"))
    assert unlocated.failure_line() == "a.py: error: cannot be read: gone"


def test_json_report_has_the_documented_fields(tmp_path):
    results = run_results(str(tmp_path))
    report = json.loads(render_json(results, "check"))
    assert list(report) == ["schema", "tool", "mode", "summary", "policy", "files", "findings"]
    assert report["schema"] == "dpmigrate-report/1" and report["mode"] == "check"
    assert report["summary"] == {"files": 3, "changed": 1, "changes": 1, "declined": 1, "errors": 1,
                                 "notes": 1, "not_converted": 1}
    assert report["files"][0] == {"path": results[0].path, "framework": "torch", "changed": True, "left_alone": None,
                                  "failure": None}
    assert report["files"][2]["failure"] == {"reason": "does not parse: expected ')'", "line": 7, "col": 3}
    assert [f["line"] for f in report["findings"]] == [3, 12, 40, 55]
    declined = report["findings"][2]
    assert declined == {"path": results[0].path, "line": 40, "col": 9, "rule": "save-on-main", "severity": "declined",
                        "message": "torch.save inside a helper", "fix": "call dp.save(obj, path)"}


def test_sarif_levels_locations_and_rules(tmp_path):
    results = run_results(str(tmp_path))
    catalog = [("shard-training-loader", "Give each rank its own shard of the training DataLoader.\n\nWhy: ..."),
               ("unused-rule", "A rule that found nothing.")]
    sarif = json.loads(render_sarif(results, catalog, root=str(tmp_path)))
    assert sarif["version"] == "2.1.0"
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert ids[:2] == ["shard-training-loader", "unused-rule"]  # the catalog, in its order, even unused
    assert set(ids) == {"shard-training-loader", "unused-rule", "save-on-main", "rank-divergent",
                        "runtime-import", "not-converted"}
    assert rules[0]["shortDescription"]["text"] == "Give each rank its own shard of the training DataLoader."
    levels = {r["ruleId"]: r["level"] for r in run["results"]}
    assert levels == {"runtime-import": "note", "shard-training-loader": "note", "save-on-main": "warning",
                      "rank-divergent": "error", "not-converted": "error"}
    for result in run["results"]:
        assert ids[result["ruleIndex"]] == result["ruleId"]
    declined = next(r for r in run["results"] if r["ruleId"] == "save-on-main")
    assert declined["message"]["text"] == "torch.save inside a helper Fix: call dp.save(obj, path)"
    location = declined["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 40, "startColumn": 9}
    assert run["invocations"] == [{"executionSuccessful": False}]


def test_sarif_uri_is_escaped_and_files_outside_the_root_are_absolute(tmp_path):
    inside = os.path.join(str(tmp_path), "my dir", "t#1.py")
    outside = os.path.join(os.path.dirname(str(tmp_path)), "elsewhere.py")
    results = [FileResult(p, findings=(Finding(p, 1, 1, "r", "note", "m"),)) for p in (inside, outside)]
    run = json.loads(render_sarif(results, [], root=str(tmp_path)))["runs"][0]
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in run["results"]]
    assert uris[0] == {"uri": "my%20dir/t%231.py", "uriBaseId": "%SRCROOT%"}
    assert uris[1] == {"uri": "file://" + outside.replace(os.sep, "/")}
    assert run["invocations"] == [{"executionSuccessful": True}]


def test_the_summary_line_states_the_batch_and_learning_rate_policy_when_a_file_changed():
    changed = FileResult("a.py", True, "torch", ())
    line = render_text([changed], policy_line("global", "linear")).splitlines()[-1]
    assert line == ("1 file, 1 changed, 0 changes, 0 declined, 0 errors; --batch global: the script's batch size is the "
                    "global batch, split over the N ranks; lr x N (--scale-lr linear)")
    unchanged = FileResult("b.py", False, "torch", ())
    assert render_text([unchanged], policy_line("per-device", "none")).splitlines()[-1].endswith("0 errors")


# --- the summary line says the policy only as far as the changes applied it (issue 18) ----------------------------

def _finding(effect, severity="change"):
    return Finding("t.py", 1, 1, "r", severity, "m", effect=effect)


def test_the_policy_line_says_what_was_applied():
    nothing = policy_line("per-device", "none", [_finding(None)])
    assert "no training data was sharded" in nothing and "N x it" not in nothing
    assert policy_line("per-device", "none", [_finding("shard")]).startswith(
        "--batch per-device: every rank reads the script's batch size, so the global batch is N x it")
    assert policy_line("global", "none", [_finding("shard"), _finding("split-batch")]).startswith(
        "--batch global: the script's batch size is the global batch, split over the N ranks")
    unsplit = policy_line("global", "none", [_finding("shard")])
    assert unsplit.startswith("--batch global asked, but no batch size was split")
    assert policy_line("global", "linear", [_finding("split-batch")]).endswith(
        "lr unchanged (--scale-lr linear asked, but no learning rate was found to scale)")
    assert policy_line("global", "linear", [_finding("split-batch"), _finding("scale-lr")]).endswith(
        "lr x N (--scale-lr linear)")
    assert "split over the N ranks" in policy_line("global", "none", [_finding("split-batch", "note")])  # Keras fit


def test_the_policy_line_points_at_notes_only_when_there_are_some():
    """Issue 19, round G (the Paddle guide on layers and models): "as the notes and declined sites say" with none."""
    noted = policy_line("per-device", "none", [_finding(None), _finding(None, "note")])
    assert noted.endswith("(every rank reads all of it, as the notes and declined sites say); lr unchanged")
    silent = policy_line("per-device", "none", [_finding(None)])
    assert silent.startswith("--batch per-device: no training data was sharded (every rank reads all of it); lr")


def test_a_full_batch_script_is_not_said_to_have_a_global_batch_n_times_larger():
    from rule_testing import convert_text

    result = convert_text("""
        import torch
        x, y = torch.randn(64, 3), torch.randn(64, 1)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.LBFGS(model.parameters())
        def closure():
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            return loss
        for _ in range(5):
            opt.step(closure)
    """)
    line = policy_line("per-device", "none", result.findings)
    assert "no training data was sharded" in line
