"""How fast and how lean ``dpmigrate --check`` is on big inputs, beside the tools it is compared with.

One invocation measures, on the same files:

- throughput over a tree (default: a copy of the installed torch's ``nn``, ``optim`` and
  ``utils/data``, about 200 files / 72,000 lines): ``dpmigrate --check -j 1``, libcst's own parse
  and print of each file (the floor for any libcst codemod), and TensorFlow's ``tf_upgrade_v2``
  when ``--tf-upgrade PATH`` names it (install ``tensorflow-cpu`` into a separate venv: one
  framework per process; run by that venv's python, file by file, see ``tf_upgrade_rate``);
  lines/s for each and the ratios;
- scaling: generated training-script-like files of 10k, 50k and 100k lines and one file holding
  a 1 MB line: wall time, peak memory and KB per line, each run in its own process, beside
  libcst's own ``parse_module`` of the same file (its tree is the floor of any libcst codemod);
- start-up as pre-commit sees it: ``python -m dpmigrate --check small.py`` on a small torch
  script and on a file importing no framework, median of 10 each, beside the bare interpreter.

Every measured run is a child process, timed by wall clock, its peak RSS read with ``os.wait4``.
Run by hand (nothing is written; no test asserts a timing):

    python benchmarks/bench_speed.py [--tree DIR] [--tf-upgrade /tmp/tfvenv/bin/tf_upgrade_v2]
                                     [--sizes 10000,50000,100000] [--skip-tree] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNK = ROOT / "fixtures" / "torch" / "mnist" / "before.py"  # a real single-GPU training script
ANCHOR = """\
import sys, time
import libcst
start, cpu = time.perf_counter(), time.process_time()
for path in sys.argv[1:]:
    with open(path, "rb") as handle:
        source = handle.read()
    assert libcst.parse_module(source).bytes == source, path
print(time.perf_counter() - start, time.process_time() - cpu)
"""

TF_UPGRADE = """\
import os, sys, time
from tensorflow.tools.compatibility import ast_edits, tf_upgrade_v2
upgrader = ast_edits.ASTCodeUpgrader(tf_upgrade_v2.TFAPIChangeSpec(import_rename=False, upgrade_compat_v1_import=True))
out, lines, failed, seconds, cpu = sys.argv[1], 0, 0, 0.0, 0.0
os.makedirs(out, exist_ok=True)
for i, path in enumerate(sys.argv[2:]):
    start, started = time.perf_counter(), time.process_time()
    try:
        upgrader.process_file(path, os.path.join(out, f"{i}.py"))
    except Exception:
        failed += 1
        continue
    seconds += time.perf_counter() - start
    cpu += time.process_time() - started
    with open(path, "rb") as handle:
        lines += handle.read().count(b"\\n")
print(seconds, lines, failed, cpu)
"""

PARSE_ONLY = """\
import sys
import libcst
with open(sys.argv[1], "rb") as handle:
    libcst.parse_module(handle.read())
"""

NON_ML = '''"""A command-line helper that imports no deep-learning framework (what most pre-commit runs see)."""

import argparse
import json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    print(json.dumps(vars(parser.parse_args())))


if __name__ == "__main__":
    main()
'''


CPU_SECONDS: dict[int, float] = {}  # id of run_child's answer -> the child's CPU seconds (see cpu_of)


def run_child(argv: list[str], cwd: str | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit code) of one child process; its CPU seconds: ``cpu_of(answer)``."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    answer = (seconds, usage.ru_maxrss / 1024, process.returncode)
    CPU_SECONDS[id(answer)] = usage.ru_utime + usage.ru_stime
    return answer


def cpu_of(answer: tuple[float, float, int]) -> float:
    """User + system CPU seconds of the child run that gave ``answer``: on a shared, loaded machine
    (CI: 2 cores, other jobs) wall time says more about the neighbours than about the program."""
    return CPU_SECONDS[id(answer)]


def dpmigrate_check(*paths: str) -> list[str]:
    return [sys.executable, "-m", "dpmigrate", "--check", "-j", "1", *paths]


def copy_torch_tree(folder: Path) -> Path:
    """A copy of torch's nn, optim and utils/data (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed here: pass --tree DIR with the Python files to measure")
    torch_dir = Path(spec.origin).parent
    tree = folder / "torchsrc"
    for part in ("nn", "optim", "utils/data"):
        shutil.copytree(torch_dir / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tree


def python_files(tree: Path) -> list[Path]:
    return sorted(tree.rglob("*.py"))


def throughput(tree: Path, tf_upgrade: str | None, scratch: Path) -> None:
    files = python_files(tree)
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    print(f"## throughput: {tree}: {len(files)} files, {lines:,} lines (one run each)")
    rates: dict[str, float] = {}
    cpu_rates: dict[str, float] = {}

    answer = run_child(dpmigrate_check(str(tree)))
    seconds, rss, code = answer
    if code not in (0, 1):
        raise SystemExit(f"dpmigrate --check exited {code} on {tree}; run it by hand: {' '.join(dpmigrate_check(str(tree)))}")
    rates["dpmigrate --check"] = lines / seconds
    cpu_rates["dpmigrate --check"] = lines / cpu_of(answer)
    print(f"dpmigrate --check -j 1      {seconds:8.1f} s {rss:7.0f} MB  {lines / seconds:9,.0f} lines/s "
          f"(CPU {cpu_of(answer):.1f} s: {lines / cpu_of(answer):,.0f} lines per CPU second)")

    output = subprocess.run([sys.executable, "-c", ANCHOR, *map(str, files)], capture_output=True, text=True)
    if output.returncode != 0:
        raise SystemExit(f"libcst parse + print failed:\n{output.stderr}")
    seconds, cpu = map(float, output.stdout.split())
    rates["libcst parse + print"] = lines / seconds
    cpu_rates["libcst parse + print"] = lines / cpu
    print(f"libcst parse + print        {seconds:8.1f} s {'':10} {lines / seconds:9,.0f} lines/s (in-process, no import; "
          f"CPU {cpu:.1f} s: {lines / cpu:,.0f} lines per CPU second)")

    if tf_upgrade:
        tf = tf_upgrade_rate(tf_upgrade, files, scratch)
        if tf is not None:
            rates["tf_upgrade_v2"], cpu_rates["tf_upgrade_v2"] = tf
    ours, ours_cpu = rates["dpmigrate --check"], cpu_rates["dpmigrate --check"]
    for name, rate in rates.items():
        if name != "dpmigrate --check":
            print(f"dpmigrate / {name}: {ours / rate:.2f}x (per CPU second: {ours_cpu / cpu_rates[name]:.2f}x)")


def tf_upgrade_rate(tf_upgrade: str, files: list[Path], scratch: Path) -> tuple[float, float] | None:
    """tf_upgrade_v2's lines/s and lines per CPU second over ``files``, run file by file as its
    ``--intree`` mode does, in its own venv.

    Its ``--intree`` run stops at the first file its parser (pasta) crashes on (torch's sources
    use ``:=``, which pasta cannot annotate), so the files are upgraded one by one in one process
    with the same change spec, and the files it fails on are counted and left out of the rate.
    """
    python = Path(tf_upgrade).parent / "python"
    output = subprocess.run([str(python), "-c", TF_UPGRADE, str(scratch / "tf_out"), *map(str, files)],
                            capture_output=True, text=True)
    if output.returncode != 0:
        print(f"tf_upgrade_v2 could not run ({python}):\n{output.stderr[-2000:]}")
        return None
    seconds, lines, failed, cpu = output.stdout.split()
    seconds, lines, failed, cpu = float(seconds), int(lines), int(failed), float(cpu)
    print(f"tf_upgrade_v2               {seconds:8.1f} s {'':10} {lines / seconds:9,.0f} lines/s "
          f"({len(files) - failed} files, {lines:,} lines; {failed} files it crashes on left out; "
          f"CPU {cpu:.1f} s: {lines / cpu:,.0f} lines per CPU second)")
    return lines / seconds, lines / cpu


def generated_script(lines: int) -> str:
    """A training script of about ``lines`` lines: the mnist fixture, repeated with renamed definitions."""
    chunk = CHUNK.read_text()
    tree = ast.parse(chunk)
    first = next(node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))
                 and node is not (tree.body[0] if ast.get_docstring(tree) else None))
    cut = sum(len(line) for line in chunk.splitlines(keepends=True)[: first.lineno - 1])
    header, body = chunk[:cut], chunk[cut:]  # the docstring and imports once; the definitions repeated
    names = re.findall(r"^(?:def|class) (\w+)", body, flags=re.M)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    parts, count, i = [header], header.count("\n"), 0
    while count < lines:
        part = pattern.sub(lambda match, i=i: f"{match.group(1)}_{i}", body)
        parts.append(part)
        count += part.count("\n")
        i += 1
    return "".join(parts)


def one_long_line(size: int = 1_000_000) -> str:
    items = []
    total = 0
    while total < size:
        item = f"torch.tensor({len(items)})"
        items.append(item)
        total += len(item) + 2
    return "import torch\n\nVALUES = [" + ", ".join(items) + "]\n"


def scaling(sizes: list[int], scratch: Path) -> None:
    """Per file: ours, then libcst's parse alone of the same file (the floor: its tree is most of our memory)."""
    print("## scaling: one generated file per run, `dpmigrate --check -j 1 FILE` in its own process; "
          "`libcst floor` is `libcst.parse_module` of the same file alone, in its own process")
    small = scratch / "small.py"
    small.write_text(generated_script(1))
    _, base_rss, _ = run_child(dpmigrate_check(str(small)))
    print(f"baseline (a {small.read_text().count(chr(10))}-line script): {base_rss:.0f} MB peak RSS")
    cases = [(f"{n // 1000}k lines", generated_script(n)) for n in sizes] + [("one 1 MB line", one_long_line())]
    for name, text in cases:
        path = scratch / f"big_{name.replace(' ', '_')}.py"
        path.write_text(text)
        lines = text.count("\n")
        ours = run_child(dpmigrate_check(str(path)))
        floor = run_child([sys.executable, "-c", PARSE_ONLY, str(path)])
        (seconds, rss, code), (floor_seconds, floor_rss, floor_code) = ours, floor
        status = "" if code in (0, 1) else f"  (exit {code}!)"
        status += "" if floor_code == 0 else f"  (libcst parse exit {floor_code}!)"
        print(f"{name:14} {lines:7,} lines {len(text) / 1e6:5.2f} MB  {seconds:7.1f} s  {rss:6.0f} MB peak  "
              f"{rss * 1024 / lines:7.1f} KB/line  {lines / seconds:7,.0f} lines/s | libcst floor {floor_seconds:7.1f} s  "
              f"{floor_rss:6.0f} MB  {floor_rss * 1024 / lines:7.1f} KB/line | ours over floor: "
              f"{seconds / floor_seconds:4.2f}x time, {(rss - floor_rss) * 1024 / lines:6.1f} KB/line{status}\n"
              f"{'':14} CPU: ours {cpu_of(ours):7.1f} s ({cpu_of(ours) * 1000 / lines:.2f} ms/line), libcst floor "
              f"{cpu_of(floor):7.1f} s ({cpu_of(floor) * 1000 / lines:.2f} ms/line), "
              f"ours / floor {cpu_of(ours) / cpu_of(floor):.2f}x")


def startup(scratch: Path, runs: int = 10) -> None:
    """Pre-commit on one file: a small torch training script, and a file that imports no framework."""
    torch_file = scratch / "pre_commit.py"
    torch_file.write_text(CHUNK.read_text())
    other = scratch / "cli_helper.py"
    other.write_text(NON_ML)
    # as installed: with the bytecode of dpmigrate's modules written once (PYTHONDONTWRITEBYTECODE would
    # make every run compile them again, which no installed package does)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(dpmigrate_check(str(torch_file)), env=env, capture_output=True)
    for what, path in ((f"{CHUNK.relative_to(ROOT)}", torch_file), ("a file importing no framework", other)):
        times = [run_child(dpmigrate_check(str(path)))[0] for _ in range(runs)]
        print(f"## start-up: python -m dpmigrate --check on {what} ({path.read_text().count(chr(10))} lines): "
              f"median {statistics.median(times) * 1000:.0f} ms of {runs} (min {min(times) * 1000:.0f} ms)")
    times = [run_child([sys.executable, "-c", "pass"])[0] for _ in range(runs)]
    print(f"## start-up of the interpreter alone (python -c pass): median {statistics.median(times) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="folder of Python files (default: a copy of torch's nn, optim, utils/data)")
    parser.add_argument("--tf-upgrade", metavar="PATH", help="path of tf_upgrade_v2 (from a venv with tensorflow-cpu)")
    parser.add_argument("--sizes", default="10000,50000,100000", help="line counts of the generated files")
    parser.add_argument("--skip-tree", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        if not args.skip_tree:
            throughput(args.tree or copy_torch_tree(scratch), args.tf_upgrade, scratch)
        if not args.skip_scaling:
            scaling([int(n) for n in args.sizes.split(",") if n], scratch)
        startup(scratch)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
