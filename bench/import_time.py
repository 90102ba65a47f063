#!/usr/bin/env python3
"""How long `import hoist` takes in a fresh process, where neither torch nor
JAX is imported (issue 40's goal: a median under 0.2 s).

    .venv/bin/python bench/import_time.py [--runs 10] [--out DIR]

Each run is a new interpreter that times its own `import X` with
time.perf_counter (interpreter start-up excluded). One warm-up run first
(the page cache then holds every file); the figures are medians of --runs.
Measured in the same run: `import numpy` and `import ml_dtypes` (what hoist
imports and cannot do without), the baselines that show what is hoist's
own. Each hoist run also checks that torch, jax and pyarrow stayed
unimported. Writes DIR/import-time.json (DIR: bench-results/ by default)
and prints a table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import sys, time
t = time.perf_counter()
import {module}
elapsed = time.perf_counter() - t
heavy = sorted(m for m in ("torch", "jax", "pyarrow") if m in sys.modules)
print(elapsed, ",".join(heavy))
"""


def time_import(module):
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)],
                         check=True, capture_output=True, text=True,
                         cwd="/").stdout.split()
    return float(out[0]), (out[1] if len(out) > 1 else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench-results"))
    args = parser.parse_args()
    results = {}
    for module in ("numpy", "ml_dtypes", "hoist"):
        time_import(module)  # warm-up
        times = []
        for _ in range(args.runs):
            seconds, heavy = time_import(module)
            if module == "hoist" and heavy:
                sys.exit(f"import hoist imported {heavy}")
            times.append(seconds)
        results[module] = {"median_s": statistics.median(times),
                           "min_s": min(times), "max_s": max(times)}
    import hoist
    report = {"python": sys.version.split()[0], "hoist": hoist.__version__,
              "runs": args.runs, "imports": results,
              "goal_s": 0.2,
              "met": results["hoist"]["median_s"] < 0.2}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "import-time.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"import time, fresh interpreter, median of {args.runs} warm runs "
          f"(Python {report['python']}, hoist {report['hoist']})")
    print(f"{'module':<12}{'median':>10}{'min':>10}{'max':>10}")
    for module, r in results.items():
        print(f"{module:<12}{r['median_s']:>9.3f}s{r['min_s']:>9.3f}s"
              f"{r['max_s']:>9.3f}s")
    print(f"import hoist imports neither torch, JAX nor pyarrow; goal < 0.2 s: "
          f"{'met' if report['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
