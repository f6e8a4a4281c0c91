"""Extra import time of dpmigrate.runtime.torch over `import torch` (median of 10 fresh processes).

    python benchmarks/import_time.py [--repeat 10]

Each fresh process imports torch, then dpmigrate.runtime.torch, and times both steps; the second step
is the extra cost a converted script pays. Also shows that `import dpmigrate.runtime` loads no framework.
"""

import argparse
import json
import statistics
import subprocess
import sys

PROBE = """
import json, sys, time
t0 = time.perf_counter(); import torch
t1 = time.perf_counter(); import dpmigrate.runtime.torch
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""
BARE = """
import json, sys, time
t0 = time.perf_counter(); import dpmigrate.runtime
print(json.dumps([time.perf_counter() - t0, sorted({'torch', 'tensorflow', 'paddle'} & set(sys.modules))]))
"""


def run(code: str):
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    samples = [run(PROBE) for _ in range(args.repeat)]
    bare = [run(BARE) for _ in range(args.repeat)]
    torch_ms = statistics.median(s[0] for s in samples) * 1000
    extra_ms = statistics.median(s[1] for s in samples) * 1000
    print(f"import torch                              median {torch_ms:7.1f} ms")
    print(f"then import dpmigrate.runtime.torch       median {extra_ms:7.1f} ms extra ({extra_ms / torch_ms:.1%})")
    print(f"import dpmigrate.runtime (no framework)   median {statistics.median(b[0] for b in bare) * 1000:7.1f} ms, "
          f"frameworks loaded: {bare[0][1] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
