"""Does this machine's CPU speed wander by itself? A fixed pure-Python task (sum of 2 million integers), timed
every half second for a minute on each CPU, with nothing else running. If its time wanders as much as the
serving numbers do, the spread is the host's (a shared or throttled machine), not vLLM's or the suite's.
(`suite doctor` runs the same probe for 3 s as its "CPU steadiness" check.)

    .venv/bin/python benchmarks/server_starts/host_probe.py --seconds 60
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

from suite.proc import cpu_timings, load_average


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    print(f"load before {load_average()}")
    times = cpu_timings(args.seconds, pause_s=0.5, work=2_000_000)
    for c, ts in times.items():
        cv = 100 * math.expm1(statistics.stdev(math.log(t) for t in ts))
        print(f"CPU {c}: {len(ts)} timings, median {1000 * statistics.median(ts):.1f} ms, "
              f"min {1000 * min(ts):.1f}, max {1000 * max(ts):.1f}, CV {cv:.1f} %")
    cpus = sorted(times)
    if len(cpus) > 1 and len(times[cpus[0]]) > 3:
        a, b = ([math.log(t) for t in times[c]] for c in cpus[:2])
        print(f"same-moment correlation CPU {cpus[0]} / CPU {cpus[1]}: {statistics.correlation(a, b):.2f}; "
              f"lag-1 autocorrelation (0.5 s apart) CPU {cpus[0]}: {statistics.correlation(a[:-1], a[1:]):.2f}")
    print(f"load after {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
