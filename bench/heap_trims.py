#!/usr/bin/env python3
"""By the second: the heap-release thread's trims (`gateway_heap_trims_total{rule}`) and the
gateway's anonymous and file-backed RSS around `overhead.py`'s streams phase — a warm-up of
20 streams, then 1 000 — on its rig (the mock, redis-server, a gateway at the `all` step,
pinned as `overhead.py` pins them). It shows when `ops::memory` trims and what each trim
gave back (docs/PERFORMANCE.md, "Streams and memory"). Not part of `make bench`.

    cargo build --release --locked --bins --examples
    python3 bench/heap_trims.py [--streams N] [--seconds S]
"""
from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402


def trims(rig: overhead.Rig) -> dict:
    url = f"http://127.0.0.1:{rig.gw_port}/metrics"
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    return {m[1]: int(m[2]) for m in re.finditer(r'gateway_heap_trims_total\{rule="(\w+)"\} (\d+)', text)}


def show(rig: overhead.Rig, label: str) -> None:
    split = overhead.rss_split_kb(rig.gw.pid)
    print(f"{label:<20} trims {trims(rig)}  anonymous {split['anon'] / 1024:.1f} MB  "
          f"file-backed {split['file'] / 1024:.1f} MB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=10, help="looks after each load (default 10)")
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args()
    rig = overhead.Rig(argparse.Namespace(no_pin=args.no_pin, quick=False, keep_dir=False,
                                          synchronous="normal"))
    try:
        rig.start()
        rig.gateway("all")
        rig.sticky({"chunk_delay_ms": 100, "text": overhead.STREAM_TEXT})
        show(rig, "start")
        for n, ramp in ((20, 100), (args.streams, 2000)):
            rig.lg("gateway", ["--stream", "--streams", str(n), "--ramp-ms", str(ramp),
                               "--expect-chunks", str(overhead.STREAM_CHUNKS)], stream=True)
            for s in range(args.seconds):
                show(rig, f"{n} streams +{s} s")
                time.sleep(1.0)
    finally:
        rig.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
