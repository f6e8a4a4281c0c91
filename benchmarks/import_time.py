"""Extra import time of dpmigrate.runtime.torch over `import torch` (median of 10 fresh processes each).

    python benchmarks/import_time.py [--repeat 10]
"""

import argparse
import statistics
import subprocess
import sys

PROBE = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"


def measure(stmt: str, repeat: int) -> list:
    return [float(subprocess.run([sys.executable, "-c", PROBE.format(stmt=stmt)], capture_output=True,
                                 text=True, check=True).stdout) for _ in range(repeat)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    plain, ours, base = [], [], []
    for _ in range(args.repeat):  # interleaved, so machine load affects both alike
        plain += measure("import torch", 1)
        ours += measure("import dpmigrate.runtime.torch", 1)
        base += measure("import dpmigrate.runtime", 1)
    p, o = statistics.median(plain), statistics.median(ours)
    print(f"import torch                    median {p * 1000:7.1f} ms")
    print(f"import dpmigrate.runtime.torch  median {o * 1000:7.1f} ms")
    print(f"extra over torch                median {(o - p) * 1000:7.1f} ms")
    print(f"import dpmigrate.runtime        median {statistics.median(base) * 1000:7.1f} ms (no framework)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
