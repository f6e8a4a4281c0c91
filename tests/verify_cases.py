"""Running ``dpmigrate verify`` from the tests: the executed fixtures of every framework are checked with it.

``execute.json`` of a fixture says how (all keys optional):

- ``args``: the script's arguments for both runs, after ``batch_args`` (default ``--batch-size 32``; ``[]`` for a
  script that has no such option);
- ``steps``: optimizer steps to compare (default :data:`DEFAULT_STEPS`, past the first epoch of most cases);
- ``verify``: what verify must conclude when it is not "equivalent with the data split proven", with the
  reason the fixture is exempt, e.g. ``{"verdict": "diverges", "causes": ["not-sharded"], "why": "..."}``, or
  ``{"verdict": "error", "shows": "No module named 'torchvision'", "why": "..."}`` for a script that cannot run here;
- ``unlaunched``: ``false`` to leave the fixture out of the check that its ``after.py`` run plainly gives the
  original's checkpoint (a script that cannot run here, or saves no ``--save`` checkpoint);
- ``shares``: the fixture's verify also runs the shares pass (the conversion once more with the script's shuffling
  on), and its verdict on the ranks' shares must contain this text (``"disjoint"``, ``"not judged"``, or the idiom
  that reads samples twice by design): one verify per fixture checks both, instead of a second verify of the same
  fixture in ``test_verify_shares.py``;
- ``reference``: ``"converted"`` when the original cannot run here (an API the installed framework no longer
  has): the ``--batch global`` conversion run plainly (world size 1, which behaves as the original by the
  runtime's contract) is the reference the 2-process run is checked against.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpmigrate.verify.cli import main

DEFAULT_STEPS = 24


def verify(tmp_path: Path, monkeypatch, script: Path, *script_args: str, against: Path | None = None,
           steps: int = DEFAULT_STEPS, nproc: int = 2, timeout: float = 240, flags: tuple[str, ...] = (),
           to_end: float = 0, shares_pass: bool = False) -> dict:
    """Run ``dpmigrate verify`` in-process (the runs are subprocesses) from ``tmp_path``; its JSON report.

    Both runs stop at step K unless ``to_end`` says otherwise, and the shares pass (a third run, shuffling on) runs
    only when ``shares_pass`` asks: what happens past K and with shuffling on have tests of their own
    (``test_verify_to_end.py``, ``test_verify_shares.py``), and each is one more multi-process run per fixture on a
    2-core CI whose slow pass already takes most of its time. Every executed fixture passed the shares pass on
    2026-12-07 (three after the fixes of that day: a peeked batch and ``repeat()`` before ``shuffle`` leave the
    shares unjudged, a split not proven without shuffling is not checked again)."""
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "verify.json"
    argv = [str(script), "-n", str(nproc), "--steps", str(steps), "--timeout", f"{timeout:g}", "--report", "json",
            "--report-file", str(report), "--to-end", f"{to_end:g}", *flags,
            *["--no-shares-pass"] * (not shares_pass)]
    if against is not None:
        argv += ["--against", str(against)]
    code = main([*argv, "--", *script_args])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def causes(data: dict) -> list[str]:
    return [c["kind"] for c in (data["comparison"] or {}).get("causes", [])]


def explain(data: dict) -> str:
    """What a failed assertion should show: the headline, the causes, the output of a failed run."""
    lines = [data["headline"], *(f"  {c['kind']}: {c['message']}" for c in (data["comparison"] or {}).get("causes", [])),
             *data.get("details", [])]
    return "\n".join(lines)


def assert_as_expected(case: Path, data: dict) -> None:
    """Equivalent with the split proven, or exactly the exemption ``execute.json`` declares, with its reason."""
    settings = json.loads((case / "execute.json").read_text())
    if "shares" in settings:  # the shares pass ran (verify_fixture asked for it): its verdict
        assert settings["shares"] in data["shares"], (data["shares"], explain(data))
    spec = settings.get("verify")
    if spec is None:
        assert data["verdict"] == "equivalent", explain(data)
        check = data["comparison"]["data"]
        assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)
        return
    assert spec.get("why"), f"{case}/execute.json: an exemption says why"
    assert data["verdict"] == spec["verdict"], explain(data)
    assert causes(data) == spec.get("causes", []), explain(data)
    if "shows" in spec:  # what the runs printed that proves the reason (a missing package, a GPU-only call)
        assert any(spec["shows"] in line for line in [data["headline"], *data["details"]]), explain(data)


def spec_args(case: Path, batch: tuple[str, ...] = ("--batch-size", "32")) -> tuple[list[str], int]:
    """The script's arguments (``batch_args``, default ``batch``, then ``args``) and the steps to compare."""
    spec = json.loads((case / "execute.json").read_text())
    return [*spec.get("batch_args", batch), *spec.get("args", [])], int(spec.get("steps", DEFAULT_STEPS))


def verify_fixture(case: Path, tmp_path: Path, monkeypatch, shares_pass: bool = False) -> dict:
    """``dpmigrate verify`` of a fixture's ``before.py`` (or, with ``"reference": "converted"``, of its conversion
    against itself run plainly), with ``execute.json``'s arguments and steps."""
    from fixture_cases import options, run

    extra, steps = spec_args(case)
    spec = json.loads((case / "execute.json").read_text())
    shares_pass = shares_pass or "shares" in spec
    script = tmp_path / "train.py"
    if spec.get("reference") == "converted":
        script.write_bytes(run(case, batch="global").output)
        return verify(tmp_path, monkeypatch, script, *extra, steps=steps, against=script, shares_pass=shares_pass)
    script.write_bytes((case / "before.py").read_bytes())
    flags = ("--sync-batchnorm",) if options(case).sync_batchnorm else ()  # options.json's policy, as a flag
    return verify(tmp_path, monkeypatch, script, *extra, steps=steps, flags=flags, shares_pass=shares_pass)
