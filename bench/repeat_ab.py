#!/usr/bin/env python3
"""Two builds of the gateway, alternating, on repeated questions — a benchmark, never a
test. Each run starts a gateway (a fresh database, `overhead.py`'s rig and pinning), stores
N distinct answers (the misses), waits past the cache's 1 s refresh, asks the mock the same
N directly and then the gateway again (all hits), and prints one line per run: the misses'
p50 and CPU per request, the repeats' p50 / p99 (the mock's beside them), CPU per repeat and
the RSS after. The side that goes first alternates by round.

    cargo build --release --locked --bins --examples   # then copy the binaries to compare
    python3 bench/repeat_ab.py OLD_BINARY NEW_BINARY --rounds 6 --requests 2000 --step all

Raw results of its runs: bench/results/repeat-1206.txt, hits-1206.txt.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as o  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--step", default="all", choices=o.LADDER)
    args = ap.parse_args()
    bins = {"base": args.base, "new": args.new}
    rig = o.Rig(argparse.Namespace(no_pin=False, keep_dir=False, synchronous="normal", quick=False))
    try:
        rig.start()
        for rnd in range(args.rounds):
            for name in (list(bins) if rnd % 2 == 0 else list(reversed(bins))):
                rig.bin = bins[name]
                rig.gateway(args.step)
                ex = ["--connections", "1", "--requests", str(args.requests),
                      "--unique-base", str(random.randrange(10**9, 9 * 10**9))]
                miss = rig.lg("gateway", ex)
                time.sleep(2.5)
                d = rig.lg("direct", ex)
                hit = rig.lg("gateway", ex)
                rss = o.rss_kb(rig.gw.pid)
                print(f"r{rnd} {name:5}: miss p50 {miss['p50_us'] / 1000:.3f} ms cpu "
                      f"{miss.get('gw_cpu_us_per_req')} | repeat p50 {hit['p50_us'] / 1000:.3f} p99 "
                      f"{hit['p99_us'] / 1000:.3f} (direct {d['p50_us'] / 1000:.3f}/{d['p99_us'] / 1000:.3f}) "
                      f"cpu {hit.get('gw_cpu_us_per_req')} us | rss {rss / 1024:.1f} MB", flush=True)
    finally:
        rig.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
