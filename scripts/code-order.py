#!/usr/bin/env python3
"""Writes `link/code-order.txt`: the functions a gateway runs, hottest first, which the
release build's linker lays out together (`build.rs`, LLD's `--symbol-ordering-file`).

The kernel maps a binary's code 64 KiB around each page a process runs, and start-up and
the request path run code spread over most of the binary: laid out together, the pages
they touch are few (issue 21 item 2, idle RSS; docs/PERFORMANCE.md, "Streams and
memory"). Not part of any test; run it after a change that moves much code (a new
dependency, a toolchain update, many edits) — a name the build no longer has is skipped
by the linker, so a stale list only packs less. The names ThinLTO exports carry their
module's source name, not its hash (`.cargo/config.toml`), and `build.rs` lists them under
every codegen unit, so an ordinary commit leaves most of the list matching
(`bench/overhead.py` warns under 95 %).

    cargo build --release --locked --bins --examples
    python3 scripts/code-order.py          # ~1 minute; needs valgrind and nm (binutils)
    cargo build --release --locked --bins  # relinked in the new order

Under callgrind it starts a bare `sluice serve` on its embedded defaults (a first start:
the migrations run), then `bench/overhead.py`'s rig (the mock, redis-server, a gateway at
the `all` step) and sends what the benchmark sends — plain requests, the same questions
again (cache hits), SSE streams; and orders every function of the binary that ran in
either by the instructions it ran itself.
"""
from __future__ import annotations

import argparse
import collections
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import overhead as o  # noqa: E402

OUT = ROOT / "link" / "code-order.txt"


CALLGRIND = ["valgrind", "--tool=callgrind", "--demangle=no", "--compress-strings=no", "--compress-pos=no"]


def stop_slowly(gateway: subprocess.Popen | None) -> None:
    """Stops a gateway under callgrind, which writes its profile only as the process exits
    — ~50 times slower than natively: `overhead.py`'s 10 s before a kill would lose it."""
    if gateway is not None and gateway.poll() is None:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=300)


def record_start(binary: Path, profile: Path) -> None:
    """A bare `sluice serve` under callgrind on its embedded defaults in a new directory
    (so it migrates a new database first, as a first start does), stopped once it
    answers."""
    with tempfile.TemporaryDirectory(prefix="sluice-start-") as work:
        port = o.free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env["SLUICE_SERVER_LISTEN"] = f"127.0.0.1:{port}"
        gateway = subprocess.Popen(CALLGRIND + [f"--callgrind-out-file={profile}", str(binary), "serve"],
                                   cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            o.wait_http(f"http://127.0.0.1:{port}/healthz", gateway, timeout=300.0)
            time.sleep(3)  # the background work of an idle gateway
        finally:
            stop_slowly(gateway)


def record_traffic(profile: Path) -> None:
    """Runs the gateway under callgrind through the benchmark's traffic."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    rig = o.Rig(argparse.Namespace(no_pin=True, keep_dir=False, synchronous="normal", quick=False))
    rig.gw_pin = CALLGRIND + [f"--callgrind-out-file={profile}"]
    started = o.wait_http
    # Under callgrind the gateway starts ~50 times slower.
    o.wait_http = lambda url, proc, timeout=60.0: started(url, proc, timeout=300.0)
    try:
        rig.start()
        rig.gateway("all")
        plain = ["--connections", "1", "--requests", "30"]
        for ask in (plain, plain + ["--unique-base", "77"]):
            rig.lg("gateway", ask)
        time.sleep(3)  # past the cache's refresh: the same questions are hits
        rig.lg("gateway", plain + ["--unique-base", "77"])
        rig.sticky({"chunk_delay_ms": 10, "text": o.STREAM_TEXT})
        rig.lg("gateway", ["--stream", "--streams", "10", "--ramp-ms", "100",
                           "--expect-chunks", str(o.STREAM_CHUNKS)], stream=True)
        rig.sticky(None)
        time.sleep(3)  # the background work of an idle gateway
    finally:
        stop_slowly(rig.gw)
        rig.gw = None
        rig.close()


def own_costs(profile: Path, names: set[str], own: collections.Counter) -> None:
    """Adds the binary's functions in the profile to `own` with the instructions each ran
    itself (a cost line right after `calls=` is the call's, not the caller's); one that ran
    none of its own (only called others) is in it at 0."""
    fn, after_call = None, False
    for line in profile.read_text(errors="replace").splitlines():
        if line.startswith(("fn=", "cfn=")):
            # A recursive call's activations are named `name'2`, `name'3`…
            name = line.split("=", 1)[1].strip().split("'")[0]
            if line.startswith("fn="):
                fn, after_call = name, False
            if name in names:
                own[name] += 0
        elif line.startswith("calls="):
            after_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
            elif fn in names and len(line.split()) >= 2:
                own[fn] += int(line.split()[1])


def main() -> int:
    binary = Path(os.environ.get("SLUICE_BIN", str(o.DEFAULT_BIN))).resolve()
    listed = subprocess.run(["nm", "--defined-only", str(binary)], capture_output=True, text=True, check=True)
    names = {p[2] for p in (line.split() for line in listed.stdout.splitlines())
             if len(p) >= 3 and p[1] in "tTwW"}
    own = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="sluice-order-") as work:
        start, traffic = Path(work) / "start.out", Path(work) / "traffic.out"
        record_start(binary, start)
        record_traffic(traffic)
        for profile in (start, traffic):
            own_costs(profile, names, own)
    order = [name for name, _ in own.most_common()]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("\n".join(order) + "\n")
    print(f"{OUT.relative_to(ROOT)}: {len(order)} functions of {len(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
