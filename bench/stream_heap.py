#!/usr/bin/env python3
"""What one open stream holds on the gateway's heap, by owner — a benchmark, never a test.
Runs `overhead.py`'s streams phase on its rig (the `all` step, 20 warm-up streams, then
1 000 SSE streams of 20 chunks 100 ms apart started over 2 s) with heaptrack attached to
the gateway after the warm-up, and sorts the heap at its peak (heaptrack's peak flame
graph) into the owners below, per stream. Needs `heaptrack` (Debian: `apt install
heaptrack`).

    cargo build --release --locked --bins --examples
    python3 bench/stream_heap.py [--streams 1000] [--keep FILE.zst]

Each stack goes to one owner: a task's allocation (tokio's `Cell::new`) by the site that
spawned it, any other by the deepest frame an owner names (`frame|also` also needs `also`
somewhere in the stack). What no owner names is "everything else", which also holds the
few allocations made after the attach that are not the streams'. Raw result of a run:
bench/results/stream-heap-1206.txt.
"""
from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as o  # noqa: E402

OWNERS = [
    ("client connection: actix-http's read + write buffers (8 KiB each)",
     "actix_http::h1::dispatcher::Dispatcher$LT$T$C$S$C$B$C$X$C$U$GT$::new"),
    ("client connection: actix-http's request head (pooled)",
     "RequestHead$u20$as$u20$core..default..Default"),
    ("upstream connection: hyper's read buffer (8 KiB)", "Buffered$LT$T$C$B$GT$::poll_read_from_io"),
    ("upstream connection: hyper's write buffer (8 KiB)", "hyper::proto::h1::io::Buffered$LT$T$C$B$GT$::new"),
    ("upstream connection: hyper's request channel (a tokio mpsc block)",
     "tokio::sync::mpsc::block::Block$LT$T$GT$::new|hyper_util::client::legacy::client::Client$LT$C$C$B$GT$::connect_to"),
    ("upstream connection: reqwest's boxed connection", "reqwest::connect::verbose::Wrapper::wrap"),
    ("upstream connection: hyper's boxed connection future", "hyper_util::common::exec::Exec::execute"),
    ("the client's event channel (pipeline::stream::sse_channel)", "sluice::pipeline::stream::sse_channel"),
    ("the client's event channel's block (a tokio mpsc block)",
     "tokio::sync::mpsc::block::Block$LT$T$GT$::new|sluice::pipeline::stream::sse_channel"),
    ("the answer rebuilt for the cache (cache::replay::Assembler)", "sluice::cache::replay::Assembler"),
    ("the upstream's event reader (pipeline::stream::events)", "sluice::pipeline::stream::events"),
]
TASKS = [
    ("task: the stream's pump (pipeline::stream)", "sluice::pipeline::stream::start"),
    ("task: the client connection (actix-server)", "actix_server..service..StreamService"),
    ("task: the upstream connection (hyper)", "hyper_util..rt..tokio..TokioExecutor"),
]
TASK_CELL = "tokio::runtime::task::core::Cell$LT$T$C$S$GT$::new"
RUNTIME_FRAMES = ("tokio::", "_R", "core::", "std::", "alloc::")


def owner(frames: list[str], stack: str) -> str:
    cell = [i for i, f in enumerate(frames) if TASK_CELL in f]
    if cell:
        j = cell[0] - 1
        while j > 0 and frames[j].startswith(RUNTIME_FRAMES) and not any(k in frames[j] for _, k in TASKS):
            j -= 1
        return next((name for name, k in TASKS if k in frames[j]), "task: other")
    best, depth = "everything else", -1
    for name, rule in OWNERS:
        frame, _, also = rule.partition("|")
        if also and also not in stack:
            continue
        at = [i for i, f in enumerate(frames) if frame in f]
        if at and at[-1] > depth:
            best, depth = name, at[-1]
    return best


def per_owner(folded: Path) -> tuple[int, collections.Counter]:
    total, by = 0, collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        by[owner(stack.split(";"), stack)] += int(n)
    return total, by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--keep", type=Path, default=None, help="keep heaptrack's recording here (.zst)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-heap-"))
    recording = (args.keep or work / "gateway.zst").resolve()
    with o.warm_streams_rig() as rig:
        time.sleep(1.0)
        idle = o.rss_kb(rig.gw.pid)
        # heaptrack names its file by appending `.zst` to the name it is given.
        attach = subprocess.Popen(["heaptrack", "-o", str(recording.with_suffix("")), "-p", str(rig.gw.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(6)  # the attach (gdb) and heaptrack's first samples
        run = rig.lg("gateway", o.STREAMED + ["--streams", str(args.streams), "--ramp-ms", "2000"],
                     stream=True, sample_rss=True)
        time.sleep(1)
        attach.send_signal(signal.SIGINT)
        attach.wait(60)
    folded = work / "peak.folded"
    subprocess.run(["heaptrack_print", "-f", str(recording), "--print-peaks", "0", "--print-allocators", "0",
                    "--print-temporary", "0", "--print-leaks", "0", "--flamegraph-cost-type", "peak",
                    "-F", str(folded)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total, by = per_owner(folded)
    n = args.streams
    print(f"{run['streams_ok']} of {n} streams whole; gateway RSS idle {idle / 1024:.1f} MB, peak "
          f"{run['gw_rss_peak_kb'] / 1024:.1f} MB: {(run['gw_rss_peak_kb'] - idle) / n:.1f} KB per stream "
          f"(under heaptrack)")
    print(f"heap at its peak {total / 1e6:.2f} MB: {total / n / 1e3:.2f} KB per stream, of which")
    for name, _ in OWNERS + TASKS + [("task: other", ""), ("everything else", "")]:
        print(f"{by[name] / n / 1e3:7.2f} KB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
