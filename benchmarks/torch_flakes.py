"""Run the 2-rank equivalence job N times in a row (default 20) and report failures and wall times.

    python benchmarks/torch_flakes.py [--runs 20]

The job is tests/jobs/torch_train.py under `dpmigrate launch -n 2`, checked against a single-process
run to 1e-5 each time. A failure is any non-zero exit, or parameters that differ.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

JOB = Path(__file__).resolve().parent.parent / "tests" / "jobs" / "torch_train.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(JOB), "--out", "single.pt"], cwd=tmp, env=env, check=True,
                       capture_output=True)
        single = torch.load(Path(tmp) / "single.pt")
        failures, times = [], []
        for i in range(args.runs):
            out = Path(tmp) / f"dist{i}.pt"
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir",
                                   str(Path(tmp) / f"logs{i}"), str(JOB), "--out", str(out)],
                                  cwd=tmp, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - started)
            ok = proc.returncode == 0 and all(
                torch.allclose(single[k], v, atol=1e-5) for k, v in torch.load(out).items())
            if not ok:
                failures.append((i, proc.returncode, proc.stderr[-2000:]))
            print(f"run {i + 1:2d}/{args.runs}: {'ok' if ok else 'FAILED'} ({times[-1]:.1f} s)", flush=True)
    print(f"\n{args.runs} runs, {len(failures)} failures; wall time median {statistics.median(times):.1f} s, "
          f"min {min(times):.1f} s, max {max(times):.1f} s")
    for i, code, err in failures:
        print(f"--- run {i + 1} exit {code}:\n{err}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
