"""Count 2-rank jobs that fail at exit while the machine's cores are kept busy by other processes.

    python benchmarks/torch_exit.py [--runs 200] [--busy N] [--job PATH]

Each run is ``dpmigrate launch -n 2`` of a tiny correct job (tests/jobs/torch_tiny.py: DDP, 5 SGD
steps, collectives right before exit). A run fails when the launcher's exit code is not 0 or the
main process did not print its result. ``--busy`` busy-loop processes (default: one per CPU) hold
the cores for the whole run: without load the exit race this measures almost never shows (before
the fix in dpmigrate/runtime/_torch_teardown.py: 4 of 30 such jobs aborted with SIGABRT).
Prints one line per run and a summary; exit code 1 if any run failed. Not a test: run it by hand.
"""

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "tests" / "jobs" / "torch_tiny.py"


def _spin() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy-loop processes (load)")
    parser.add_argument("--job", type=Path, default=JOB)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.setdefault("OMP_NUM_THREADS", "1")
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    failures, started = [], time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                proc = subprocess.run(
                    [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(Path(tmp) / f"logs{i}"),
                     str(args.job)], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
                ok = proc.returncode == 0 and "ok " in proc.stdout
                if not ok:
                    failures.append((i + 1, proc.returncode, (proc.stdout + proc.stderr)[-1500:]))
                print(f"run {i + 1:3d}/{args.runs}: {'ok' if ok else f'FAILED (exit {proc.returncode})'}", flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()
    minutes = (time.perf_counter() - started) / 60
    print(f"\n{args.runs} consecutive 2-rank jobs with {args.busy} busy processes: {len(failures)} failed "
          f"({minutes:.1f} min)")
    for i, code, tail in failures:
        print(f"--- run {i}, exit {code}:\n{tail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
