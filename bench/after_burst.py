#!/usr/bin/env python3
"""What holds the gateway's memory after a burst — a benchmark, never a test.

Runs `overhead.py`'s streams phase on its rig (the `all` step, 20 warm-up streams, then
1 000 SSE streams of 20 chunks 100 ms apart started over 2 s), waits `--after` seconds (the
heap-release thread's trims come 1 and 3 s after the streams end), and reads the serving
worker's glibc arena — the anonymous mapping holding the most resident memory — from
/proc/PID/pagemap and /proc/PID/mem: its resident pages per MiB, and its chunks walked
header by header, the live ones (the next chunk's PREV_INUSE bit) sorted by size, in the
part of the arena the burst added (past its extent at rest before the streams). A live chunk
there outlived the burst among the burst's freed buffers, and pins the pages around it.
`--show N` prints the start of N chunks of each of the commonest sizes (what they are).
Needs root (or ptrace rights over the gateway) for /proc/PID/mem.

    cargo build --release --locked --bins --examples
    python3 bench/after_burst.py [--after 5] [--show 2]

Raw results: bench/results/after-burst-1207.txt.
"""
from __future__ import annotations

import argparse
import collections
import re
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as o  # noqa: E402

PAGE = 4096


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def biggest_anon(pid: int) -> tuple[int, int]:
    """The anonymous mapping with the most anonymous memory resident: (start, end)."""
    best, span = -1, (0, 0)
    for line in open(f"/proc/{pid}/smaps"):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            here = (int(m.group(1), 16), int(m.group(2), 16))
        elif line.startswith("Anonymous:") and int(line.split()[1]) > best:
            best, span = int(line.split()[1]), here
    return span


def resident_per_mib(pid: int, lo: int, hi: int) -> list[int]:
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(lo // PAGE * 8)
        data = f.read((hi - lo) // PAGE * 8)
    present = [(struct.unpack_from("<Q", data, i * 8)[0] >> 63) & 1 for i in range((hi - lo) // PAGE)]
    return [sum(present[i:i + 256]) for i in range(0, len(present), 256)]


def chunks(pid: int, lo: int, hi: int) -> list[tuple[int, int, bool]]:
    """(address, size, live) of every chunk of a thread arena's first heap. The first chunk
    follows the heap's header and the arena's state; it is found as the first offset from
    which 50 chunk sizes chain without leaving the heap."""
    mem = open(f"/proc/{pid}/mem", "rb")

    def size_at(a: int) -> int:
        mem.seek(a + 8)
        return struct.unpack("<Q", mem.read(8))[0]

    first = None
    for off in range(0x20, PAGE, 16):
        a, ok = lo + off, True
        for _ in range(50):
            sz = size_at(a) & ~7
            if sz < 32 or sz % 16 or a + sz > hi:
                ok = False
                break
            a += sz
        if ok:
            first = lo + off
            break
    if first is None:
        return []
    walked, a = [], first
    while a < hi - 16:
        s = size_at(a)
        sz = s & ~7
        if sz < 16 or a + sz > hi:
            break
        walked.append([a, sz, bool(s & 1)])
        a += sz
    # A chunk is live when the next one's PREV_INUSE bit says so.
    return [(c[0], c[1], walked[i + 1][2]) for i, c in enumerate(walked[:-1])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--after", type=float, default=5.0, help="seconds after the streams")
    ap.add_argument("--bursts", type=int, default=1, help="bursts of streams, `--after` seconds apart")
    ap.add_argument("--show", type=int, default=0, help="chunks of each common size to print")
    args = ap.parse_args()
    if args.bursts < 1:
        ap.error("--bursts must be at least 1")
    with o.warm_streams_rig() as rig:
        time.sleep(4.0)
        pid = rig.gw.pid
        idle = o.rss_split_kb(pid)
        before = biggest_anon(pid)
        for _ in range(args.bursts):
            run = rig.lg("gateway", o.STREAMED + ["--streams", str(args.streams), "--ramp-ms", "2000"],
                         stream=True, sample_rss=True)
            time.sleep(args.after)
        after = o.rss_split_kb(pid)
        sockets = sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if "socket" in _link(fd))
        lo, hi = biggest_anon(pid)
        per_mib = resident_per_mib(pid, lo, hi)
        walked = chunks(pid, lo, hi)
        # The part the burst added: past the arena's extent at rest, when it is the same one.
        since = before[1] if before[0] == lo else lo
        live = [c for c in walked if c[2]]
        added = [c for c in live if c[0] >= since]
        print(f"{run['streams_ok']} of {args.streams} streams whole (the last of {args.bursts} bursts); "
              f"{args.after:g} s after them")
        print(f"anonymous {idle['anon'] / 1024:.1f} → {after['anon'] / 1024:.1f} MB, file-backed "
              f"{idle['file'] / 1024:.1f} → {after['file'] / 1024:.1f} MB; {sockets} sockets open")
        print(f"the worker's arena {hex(lo)}: {(hi - lo) >> 10} KiB mapped, {sum(per_mib) * 4} KiB resident; "
              f"at rest before the streams {(before[1] - before[0]) >> 10} KiB")
        print(f"resident pages per MiB: {per_mib}")
        print(f"chunks {len(walked)}, live {len(live)} ({sum(c[1] for c in live) >> 10} KiB); in the part the "
              f"burst added: {len(added)} live ({sum(c[1] for c in added) >> 10} KiB)")
        sizes = collections.Counter(c[1] for c in added)
        print("live chunks the burst added, by size (bytes × count):",
              ", ".join(f"{s} × {n}" for s, n in sizes.most_common(12)))
        if args.show:
            mem = open(f"/proc/{pid}/mem", "rb")
            for size, _ in sizes.most_common(6):
                for c in [c for c in added if c[1] == size][:args.show]:
                    mem.seek(c[0] + 16)
                    raw = mem.read(min(size - 16, 96))
                    text = re.sub(rb"[^ -~]", b".", raw).decode()
                    print(f"  {size}: {raw[:48].hex()}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
