#!/usr/bin/env python3
"""What the gateway adds over a direct call to its upstream (issue 10) — a benchmark,
never a test: it reports figures against the issue's targets and asserts nothing.

The client is `target/release/examples/loadgen` (bench/loadgen.rs: hyper, one
current-thread runtime, exact percentiles); this script only starts processes, pins
them, runs loadgen and writes the tables. It builds nothing:

    cargo build --release --locked --bins --examples
    python3 bench/overhead.py                 # 6-7 minutes, writes bench/results/latest.json
    python3 bench/overhead.py --quick         # ~1 minute smoke run, writes bench/results/quick.json
    python3 bench/overhead.py --phases ladder,streams --steps plain,all

Processes: the gateway (`sluice serve --ladder STEP`) on CPU 0; the mock (1 worker, a
~1.4 KB answer), redis-server and loadgen on CPU 1 (when taskset exists and there are
>= 2 CPUs). Each request is ~150 B with `max_tokens` set and a `{n}` made unique by
loadgen in both the system and the user message, so a cache misses every time (the
system message changes the cache's context key: no semantic candidate either). The
direct side is loadgen straight to the mock with the upstream key. Every figure is the
gateway minus direct (latency) or gateway over direct (rates), measured in interleaved
rounds so that drift on the machine hits both sides alike.

Phases
  ladder    one client, mock delay 0, each ladder step (plain, auth, window, quota, log,
            cache, all — cumulative) on a fresh gateway: added p50 / p99, gateway CPU per
            request (from /proc/PID/task/*/schedstat).
  delay     the same for plain and all with the mock delaying every answer 20 ms.
  hits      one client, all: each round a fresh gateway stores 2 000 distinct answers,
            then (2 s on, past its cache's 1 s refresh) is asked the same questions again:
            the hits' p50 / p99 and CPU per request (every one checked counted as a hit).
  frontier  open loop, 64 connections: the highest rate at which the added p99 stays
            <= 1 ms (plain) / 2 ms (all) with no error and >= 97 % of the rate achieved
            (rates x1.25 from 1 000 rps, then one bisection); and the closed-loop maximum
            of direct and gateway at 32 connections.
  soak      all, open loop at its frontier rate (3 000 rps if that is lower; 3 000 when
            the frontier was not measured) for --soak-seconds.
  traces    one client, mock delay 0, `all` with OpenTelemetry traces off (the default),
            on but sampling none (`sample_ratio = 0`), and on sampling every request
            (`sample_ratio = 1`) to an OTLP/HTTP sink in this process, the three in
            turn within each round: what traces cost.
  streams   1 000 SSE streams (20 chunks, 100 ms apart) started over 2 s, direct then
            through the gateway (all): added TTFT and inter-chunk gap, chunks lost or
            merged, gateway RSS idle / peak / 5 s after.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import datetime as dt
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BIN = REPO_ROOT / "target" / "release" / "sluice"
DEFAULT_LOADGEN = REPO_ROOT / "target" / "release" / "examples" / "loadgen"
UPSTREAM_KEY = "sk-upstream-canary-AAAA1111"
MODEL = "gpt-4o-mini"
LADDER = ["plain", "auth", "window", "quota", "log", "cache", "all"]
PHASES = ["ladder", "delay", "hits", "frontier", "soak", "traces", "streams"]

# The mock's non-streamed answer: ~1.2 KB of text, so its JSON is ~1.4 KB.
MOCK_TEXT = (
    "Thank you for the question. The short answer is that a gateway in front of a model "
    "provider should cost its callers almost nothing: it checks the token, counts the "
    "request against the rate limits and the budget, forwards it to one of the upstream "
    "keys, and writes down what happened. Everything it does on the request path is "
    "bounded and small, and everything else, such as rolling up reports, sending alerts "
    "and trimming old rows, runs off that path. The longer answer depends on what you "
    "measure. Added latency at one client is the time of the checks themselves; added "
    "latency at high load also includes queueing on the gateway's CPU, which grows as "
    "that CPU fills. Throughput at a latency bound is the honest figure for capacity, "
    "because a server can always answer more requests per second if it is allowed to "
    "answer each of them later. Memory per open stream matters when many clients keep "
    "long answers open at once. Finally, no request should ever fail because of the "
    "gateway itself: an error is a bug, not a cost."
)
# The streamed answer: 20 words, so 20 content chunks (the mock splits at spaces).
STREAM_TEXT = ("Streams are sent one word at a time so that every chunk can be counted "
               "and checked at the client.")
STREAM_CHUNKS = len(STREAM_TEXT.split(" "))

# {n}: unique per request (loadgen --unique), in the system message too so that even the
# cache's semantic lookup has no candidate (its context key excludes the user message).
BODY = {
    "model": MODEL,
    "max_tokens": 64,
    "messages": [
        {"role": "system", "content": "Run {n}."},
        {"role": "user", "content": "Request {n}: say hello."},
    ],
}
STREAM_BODY = {**BODY, "max_tokens": 100, "stream": True}

# issue 10's targets: (key, label, limit, unit, higher_is_better)
TARGETS = {
    "plain_added_p50_ms": 0.10, "plain_added_p99_ms": 0.30,
    "all_added_p50_ms": 0.25, "all_added_p99_ms": 0.8,
    "plain_cpu_us": 60, "all_cpu_us": 120,
    "plain_frontier_rps": 5000, "all_frontier_rps": 3000,
    "plain_ratio": 0.5, "all_ratio": 0.35,
    "soak_errors": 0,
    "stream_added_ttft_p50_ms": 0.3, "stream_added_ttft_p99_ms": 1.0,
    "stream_added_gap_p99_ms": 0.5, "stream_chunks_bad": 0,
    "idle_rss_mb": 20, "rss_per_1000_streams_mb": 25, "rss_after_over_idle": 1.10,
}


# ------------------------------------------------------------ helpers (also used by
# scenarios.py: keep free_port, pct, stop, wait_http, cpu_seconds)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin_prefix(cpu: int, enabled: bool = True) -> list[str]:
    if enabled and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(cpu)]
    return []


def wait_http(url: str, proc: subprocess.Popen, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not come up in {timeout}s")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """CPU time of a process in seconds: the sum of its live threads' run time from
    /proc/PID/task/*/schedstat (nanoseconds), else utime + stime (10 ms ticks)."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        if total:
            return total / 1e9
    except OSError:
        pass
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_kb(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_split_kb(pid: int) -> dict:
    """The RSS's anonymous part (heap, stacks, relocated data) and its file-backed part
    (the binary's pages, clean and shared): where memory above idle went."""
    split = {"anon": 0, "file": 0}
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                split["anon"] = int(line.split()[1])
            elif line.startswith("RssFile:"):
                split["file"] = int(line.split()[1])
    except OSError:
        pass
    return split


def pct(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def code_order(binary: Path) -> str:
    """How many of `link/code-order.txt`'s functions the binary has (`build.rs` lays them
    out first): a list gone stale as the code moved packs less (`scripts/code-order.py`)."""
    listed = REPO_ROOT / "link" / "code-order.txt"
    try:
        names = set(listed.read_text().split())
        out = subprocess.run(["nm", "--defined-only", str(binary)], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    have = {p[2] for p in (line.split() for line in out.splitlines()) if len(p) >= 3}
    found = sum(1 for name in names if any(form in have for form in linked_forms(name)))
    return f"{found} of {len(names)} listed functions in the binary"


def linked_forms(name: str) -> list[str]:
    """The names `build.rs` gives the linker for one of the list's: a function ThinLTO
    exported (`….llvm.<suffix>`) bare too and, from codegen unit k
    (`….llvm.<crate>_<hash>_cgu_<k>`), under every unit's number of the same width; any
    other name as it is."""
    bare, sep, unit = name.partition(".llvm.")
    if not sep:
        return [name]
    module, cgu, k = unit.rpartition("_cgu_")
    if not cgu or not k.isdigit():
        return [name, bare]
    units = range(min(10 ** len(k), CODEGEN_UNITS))
    return [name, bare] + [f"{bare}.llvm.{module}_cgu_{i:0{len(k)}}" for i in units]


# As `build.rs`'s: the most codegen units a crate is split into.
CODEGEN_UNITS = 16


def stale_code_order(found: str) -> bool:
    """Whether `code_order`'s "N of M listed functions" finds under 95 % of the list: one
    commit's edits cost 7 % of the names, and 3.5-4 MB of idle RSS, while ThinLTO named
    promoted functions by their module's hash (`.cargo/config.toml`)."""
    parts = found.split()
    if len(parts) < 3 or not (parts[0].isdigit() and parts[2].isdigit()):
        return False
    return int(parts[0]) < 0.95 * int(parts[2])


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--",
                                "src", "Cargo.toml", "Cargo.lock", "bench/loadgen.rs"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ms(us: float | None) -> float | None:
    return None if us is None or (isinstance(us, float) and math.isnan(us)) else round(us / 1000, 3)


class BenchError(Exception):
    pass


# ----------------------------------------------------------------------- the rig


class Rig:
    """The mock, redis-server, one gateway at a time (restarted per ladder step), and
    loadgen runs against either side."""

    def __init__(self, args):
        self.args = args
        self.bin = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
        self.loadgen = Path(os.environ.get("LOADGEN_BIN", str(DEFAULT_LOADGEN))).resolve()
        for p, what in ((self.bin, "sluice"), (self.loadgen, "loadgen")):
            if not p.is_file():
                raise SystemExit(f"{what} binary not found at {p}: run "
                                 "`cargo build --release --locked --bins --examples`")
        self.work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
        self.gw_pin = pin_prefix(0, not args.no_pin)
        self.side_pin = pin_prefix(1, not args.no_pin)
        self.mock_port, self.gw_port = free_port(), free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        self.mock = self.redis = self.gw = None
        self.gw_step = None
        self.gw_starts = 0
        # `[tracing]` for the next gateway start: None (off), else (OTLP endpoint, ratio).
        self.tracing = None
        self.db = self.work / "sluice-0.db"
        self.token = None
        self.redis_url = None
        self.body_file = self.work / "body.json"
        self.body_file.write_text(json.dumps(BODY, separators=(",", ":")))
        self.stream_body_file = self.work / "stream-body.json"
        self.stream_body_file.write_text(json.dumps(STREAM_BODY, separators=(",", ":")))
        self.ladder_supported = "--ladder" in subprocess.run(
            [str(self.bin), "serve", "--help"], capture_output=True, text=True, env=self.env).stdout
        self.logs = []

    # processes

    def log(self, name: str):
        f = open(self.work / name, "ab")
        self.logs.append(f)
        return f

    def start(self):
        self.mock = subprocess.Popen(
            self.side_pin + [str(self.bin), "mock", "--listen", f"127.0.0.1:{self.mock_port}",
                             "--workers", "1", "--text", MOCK_TEXT],
            stdout=self.log("mock.log"), stderr=subprocess.STDOUT, env=self.env, cwd=self.work)
        if shutil.which("redis-server"):
            port = free_port()
            self.redis = subprocess.Popen(
                self.side_pin + ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"],
                stdout=self.log("redis.log"), stderr=subprocess.STDOUT, cwd=self.work)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.05)
            self.redis_url = f"redis://127.0.0.1:{port}"
        wait_http(f"http://127.0.0.1:{self.mock_port}/_mock/stats", self.mock)

    def fresh_db(self, cfg: Path):
        """A new database for each gateway start (every step starts alike: empty cache, empty
        request log), with one token: windows high enough never to refuse, a budget that
        never runs out."""
        subprocess.run([str(self.bin), "--config", str(cfg), "migrate"], check=True,
                       capture_output=True, env=self.env, cwd=self.work)
        issued = subprocess.run(
            [str(self.bin), "--config", str(cfg), "token", "issue", "--user", "bench",
             "--budget-usd", "1000000000", "--rpm", "100000000", "--tpm", "100000000000", "--json"],
            check=True, capture_output=True, text=True, env=self.env, cwd=self.work)
        self.token = json.loads(issued.stdout)["token"]

    def close(self):
        stop(self.gw)
        stop(self.mock)
        stop(self.redis)
        for f in self.logs:
            f.close()
        if self.args.keep_dir:
            print(f"kept {self.work}", file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    def config(self, step: str) -> Path:
        rank = LADDER.index(step)
        redis = (f'[redis]\nurl = "{self.redis_url}"\n\n'
                 if self.redis_url and rank >= LADDER.index("window") else "")
        cache = ('[cache]\nmode = "all"\n\n' if rank >= LADDER.index("cache")
                 else '[cache]\nmode = "off"\n\n')
        tracing = (f'[tracing]\notlp_endpoint = "{self.tracing[0]}"\nsample_ratio = {self.tracing[1]}\n\n'
                   if self.tracing else "")
        text = (
            f'[server]\nlisten = "127.0.0.1:{self.gw_port}"\nworkers = 1\n'
            f"shutdown_timeout_seconds = 2\n\n"
            f'[database]\nurl = "sqlite://{self.db}"\n\n'
            f'[quota]\nsynchronous = "{self.args.synchronous}"\n\n'
            # The admission gate opened wide: 1 000 streams and 64-connection open loops.
            f"[queue]\nmax_in_flight = 4096\nmax_depth = 4096\n\n"
            f"{redis}{cache}{tracing}"
            f'[[upstreams]]\nid = "mock-a"\nprovider = "openai"\n'
            f'base_url = "http://127.0.0.1:{self.mock_port}/v1"\napi_key = "{UPSTREAM_KEY}"\n'
            f"allow_private_network = true\n\n"
            f'[[models]]\nname = "{MODEL}"\nroutes = [{{ upstream = "mock-a", model = "{MODEL}" }}]\n'
            f"input_usd_per_mtok = 0.15\noutput_usd_per_mtok = 0.60\n"
        )
        path = self.work / f"sluice-{step}.toml"
        path.write_text(text)
        return path

    def gateway(self, step: str, fresh: bool = True):
        """(Re)starts the gateway at a ladder step, on a new database; with fresh=False an
        already running gateway at that step is kept. Without --ladder in the binary only
        `all` (the default) can run."""
        if not fresh and self.gw is not None and self.gw_step == step and self.gw.poll() is None:
            return
        if step != "all" and not self.ladder_supported:
            raise BenchError(f"this sluice binary has no `serve --ladder`: step {step} skipped")
        stop(self.gw)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.db}{suffix}").unlink(missing_ok=True)
        self.gw_starts += 1
        self.db = self.work / f"sluice-{self.gw_starts}.db"
        cfg = self.config(step)
        self.fresh_db(cfg)
        cmd = self.gw_pin + [str(self.bin), "--config", str(cfg), "serve"]
        if self.ladder_supported:
            cmd += ["--ladder", step]
        self.gw = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log(f"gateway-{step}.log"),
                                   env=self.env, cwd=self.work)
        self.gw_step = step
        try:
            wait_http(f"http://127.0.0.1:{self.gw_port}/healthz", self.gw)
        except SystemExit as e:
            log = (self.work / f"gateway-{step}.log").read_text(errors="replace")[-400:]
            raise BenchError(f"gateway at step {step} did not start: {e}: {log}") from None
        # What the gateway burns idle (background tasks), for reading the CPU figures.
        time.sleep(0.2)
        c0 = cpu_seconds(self.gw.pid)
        time.sleep(0.5)
        self.gw_idle_cpu_ms_per_s = round((cpu_seconds(self.gw.pid) - c0) / 0.5 * 1000, 2)

    def sticky(self, response: dict | None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.mock_port}/_mock/sticky",
            data=json.dumps({"key": UPSTREAM_KEY, "response": response}).encode(),
            headers={"content-type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    # loadgen

    def side_args(self, side: str) -> list[str]:
        if side == "direct":
            port, key = self.mock_port, UPSTREAM_KEY
        else:
            port, key = self.gw_port, self.token
        return ["--url", f"http://127.0.0.1:{port}/v1/chat/completions",
                "--header", f"authorization: Bearer {key}"]

    def lg_cmd(self, side: str, extra: list[str], stream=False) -> list[str]:
        body = self.stream_body_file if stream else self.body_file
        cmd = self.side_pin + [str(self.loadgen), *self.side_args(side), "--body-file", str(body),
                               "--unique", *extra]
        if not stream:
            cmd += ["--min-body-bytes", "1000"]
        return cmd

    def lg(self, side: str, extra: list[str], stream=False, sample_rss=False) -> dict:
        """Runs loadgen against a side; for the gateway adds its CPU time during the run
        (`gw_cpu_s`) and, with sample_rss, its peak RSS (`gw_rss_peak_kb`)."""
        cmd = self.lg_cmd(side, extra, stream)
        gw = side == "gateway"
        c0 = cpu_seconds(self.gw.pid) if gw else 0.0
        err = self.work / "loadgen.err"
        with open(err, "wb") as ef:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=ef, env=self.env)
            peak = 0
            if sample_rss:
                while p.poll() is None:
                    peak = max(peak, rss_kb(self.gw.pid))
                    time.sleep(0.02)
            out, _ = p.communicate()
        c1 = cpu_seconds(self.gw.pid) if gw else 0.0
        if p.returncode != 0:
            raise BenchError(f"loadgen failed ({p.returncode}): {err.read_text()[-500:]}")
        res = json.loads(out.decode().strip().splitlines()[-1])
        if gw:
            res["gw_cpu_s"] = round(c1 - c0, 6)
            sent = res.get("sent_total") or 0
            if sent:
                res["gw_cpu_us_per_req"] = round((c1 - c0) / sent * 1e6, 1)
        if sample_rss:
            res["gw_rss_peak_kb"] = peak
        return res


# ------------------------------------------------------------------------ phases


# A streamed request's loadgen arguments: SSE, each stream checked for every chunk.
STREAMED = ["--stream", "--expect-chunks", str(STREAM_CHUNKS)]


def raise_fd_limit() -> None:
    """1 000 streams need 2 000+ descriptors in the gateway and 1 000 in loadgen."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


@contextlib.contextmanager
def warm_streams_rig():
    """The streams phase's rig for the heap scripts (`stream_heap.py`, `after_burst.py`): the
    `all` step's gateway, the mock streaming its 20 chunks 100 ms apart, and the phase's
    warm-up of 20 streams done; closed after."""
    raise_fd_limit()
    rig = Rig(argparse.Namespace(no_pin=False, keep_dir=False, synchronous="normal", quick=False))
    try:
        rig.start()
        rig.gateway("all")
        rig.sticky({"chunk_delay_ms": 100, "text": STREAM_TEXT})
        rig.lg("gateway", STREAMED + ["--streams", "20", "--ramp-ms", "100"], stream=True)
        yield rig
    finally:
        rig.sticky(None)
        rig.close()


def raw_args(path: Path) -> list[str]:
    return ["--raw-out", str(path)]


def read_raw(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except OSError:
        return []


def lat_summary(lat_us: list[int]) -> dict:
    s = sorted(lat_us)
    if not s:
        return {"samples": 0}
    return {"samples": len(s), "mean_ms": round(statistics.fmean(s) / 1000, 3),
            "p50_ms": ms(pct(s, 50)), "p90_ms": ms(pct(s, 90)), "p99_ms": ms(pct(s, 99)),
            "p999_ms": ms(pct(s, 99.9)), "max_ms": ms(s[-1])}


def interleaved(rig: Rig, step: str, rounds: int, extra: list[str], label: str) -> dict:
    """`rounds` rounds of one loadgen run per side (the side that goes first alternates),
    against a gateway at `step`; percentiles pooled over the rounds per side."""
    rig.gateway(step)
    raw = {s: [] for s in ("direct", "gateway")}
    runs = {s: [] for s in ("direct", "gateway")}
    cpu = sent = errors_gw = errors_d = 0
    for r in range(rounds):
        for side in (("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")):
            f = rig.work / f"raw-{side}.txt"
            res = rig.lg(side, extra + raw_args(f))
            raw[side] += read_raw(f)
            runs[side].append(res)
            if side == "gateway":
                cpu += res["gw_cpu_s"]
                sent += res.get("sent_total", 0)
                errors_gw += res["errors"]
            else:
                errors_d += res["errors"]
        print(f"  {label} {step}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    stored = cache_entries(rig) if LADDER.index(step) >= LADDER.index("cache") else None
    if stored == 0:
        # The step is there to time the lookup and the write of each answer; with nothing
        # written it timed lookups only (cache_lookup.rs once measured misses as hits after
        # a change to what the cache keeps): say so rather than print a figure.
        raise BenchError(f"step {step} stored no cache entry: its answers were not cacheable")
    d, g = lat_summary(raw["direct"]), lat_summary(raw["gateway"])
    paired = [(gr["p50_us"] - dr["p50_us"], gr["p99_us"] - dr["p99_us"])
              for dr, gr in zip(runs["direct"], runs["gateway"])]
    out = {
        "step": step, "rounds": rounds,
        "direct": {**d, "errors": errors_d, "rps_mean": round(statistics.fmean(x["rps"] for x in runs["direct"]), 1)},
        "gateway": {**g, "errors": errors_gw, "rps_mean": round(statistics.fmean(x["rps"] for x in runs["gateway"]), 1)},
        "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3) if g.get("samples") and d.get("samples") else None,
        "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3) if g.get("samples") and d.get("samples") else None,
        "added_mean_ms": round(g["mean_ms"] - d["mean_ms"], 3) if g.get("samples") and d.get("samples") else None,
        "added_p50_ms_median_of_rounds": ms(statistics.median(p[0] for p in paired)) if paired else None,
        "added_p99_ms_median_of_rounds": ms(statistics.median(p[1] for p in paired)) if paired else None,
        "gw_cpu_us_per_req": round(cpu / sent * 1e6, 1) if sent else None,
        "gw_idle_cpu_ms_per_s": rig.gw_idle_cpu_ms_per_s,
        "cache_entries": stored,
        "runs": runs,
    }
    print(f"  {label} {step}: added p50 {out['added_p50_ms']} ms, p99 {out['added_p99_ms']} ms, "
          f"gateway CPU {out['gw_cpu_us_per_req']} us/req, errors {errors_d}/{errors_gw}",
          file=sys.stderr, flush=True)
    return out


def cache_hits(rig: Rig) -> int:
    """Hits counted on the running gateway's cache entries (the counts linger as writes)."""
    time.sleep(0.2)
    with sqlite3.connect(f"file:{rig.db}?mode=ro", uri=True, timeout=5) as db:
        return db.execute("SELECT coalesce(sum(hits), 0) FROM cache_entries").fetchone()[0]


def cache_entries(rig: Rig) -> int:
    """Rows in the running gateway's response cache (its writes linger up to 25 ms)."""
    time.sleep(0.2)
    with sqlite3.connect(f"file:{rig.db}?mode=ro", uri=True, timeout=5) as db:
        return db.execute("SELECT count(*) FROM cache_entries").fetchone()[0]


def phase_ladder(rig: Rig, p: dict, steps: list[str]) -> dict:
    out = {}
    extra = ["--connections", "1", "--requests", str(p["ladder_requests"]), "--warmup", str(p["ladder_warmup"])]
    for step in steps:
        try:
            out[step] = interleaved(rig, step, p["ladder_rounds"], extra, "ladder")
        except BenchError as e:
            print(f"  ladder {step}: {e}", file=sys.stderr)
            out[step] = {"skipped": str(e)}
    return out


def phase_delay(rig: Rig, p: dict, steps: list[str]) -> dict:
    out = {"mock_delay_ms": 20}
    extra = ["--connections", "1", "--requests", str(p["delay_requests"]), "--warmup", str(p["delay_warmup"])]
    rig.sticky({"delay_ms": 20})
    try:
        for step in steps:
            try:
                out[step] = interleaved(rig, step, p["delay_rounds"], extra, "delay 20 ms")
            except BenchError as e:
                out[step] = {"skipped": str(e)}
    finally:
        rig.sticky(None)
    return out


def phase_hits(rig: Rig, p: dict) -> dict:
    """Whole cache hits at one client, `all` step: each round the gateway (fresh) stores
    `hits_requests` distinct answers, waits past its cache's refresh (1 s), and is asked the
    same questions again — a repeated question answered from a replica's memory. Gateway
    percentiles are the hits'; the direct side is the same questions to the mock."""
    runs = []
    n = p["hits_requests"]
    for r in range(p["hits_rounds"]):
        rig.gateway("all")
        base = ["--connections", "1", "--requests", str(n),
                "--unique-base", str(1_000_000_000 + r * 10 * n)]
        rig.lg("gateway", base)
        time.sleep(2.0)
        sides = ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")
        res = {side: rig.lg(side, base) for side in sides}
        counted = cache_hits(rig)
        if counted != n:
            raise BenchError(f"hits: {counted} of {n} repeated questions counted as cache hits")
        runs.append(res)
        print(f"  hits: round {r + 1}/{p['hits_rounds']}", file=sys.stderr, flush=True)

    def median(f):
        return round(statistics.median(f(x) for x in runs), 3)

    return {"requests_per_round": n, "rounds": len(runs),
            "gateway_p50_ms": median(lambda x: ms(x["gateway"]["p50_us"])),
            "gateway_p99_ms": median(lambda x: ms(x["gateway"]["p99_us"])),
            "direct_p50_ms": median(lambda x: ms(x["direct"]["p50_us"])),
            "direct_p99_ms": median(lambda x: ms(x["direct"]["p99_us"])),
            "gw_cpu_us_per_req": median(lambda x: x["gateway"]["gw_cpu_us_per_req"]),
            "errors": sum(x["gateway"]["errors"] + x["direct"]["errors"] for x in runs),
            "runs": runs}


def rate_point(rig: Rig, rate: float, p: dict, first: str) -> dict:
    extra = ["--connections", "64", "--rate", f"{rate:.0f}", "--seconds", str(p["rate_seconds"]),
             "--warmup", "256"]
    res = {}
    for side in ((first, "gateway" if first == "direct" else "direct")):
        res[side] = rig.lg(side, extra)
    return res


def ok_side(r: dict, rate: float) -> bool:
    return r["errors"] == 0 and r["rps"] >= 0.97 * rate


def phase_frontier(rig: Rig, p: dict, steps: list[str]) -> dict:
    limits = {"plain": 1.0, "all": 2.0}
    out = {}
    for step in steps:
        limit = limits.get(step, 2.0)
        try:
            rig.gateway(step)
        except BenchError as e:
            out[step] = {"skipped": str(e)}
            continue
        points = []
        last_good = first_bad = None
        stop_reason = "max rate"

        def measure(rate):
            r = rate_point(rig, rate, p, "direct" if len(points) % 2 == 0 else "gateway")
            d, g = r["direct"], r["gateway"]
            added = (g["p99_us"] - d["p99_us"]) / 1000
            pt = {"rate": round(rate), "direct_ok": ok_side(d, rate), "gateway_ok": ok_side(g, rate),
                  "added_p99_ms": round(added, 3), "added_p50_ms": round((g["p50_us"] - d["p50_us"]) / 1000, 3),
                  "gw_cpu_us_per_req": g.get("gw_cpu_us_per_req"),
                  "direct": d, "gateway": g}
            pt["pass"] = pt["direct_ok"] and pt["gateway_ok"] and added <= limit
            points.append(pt)
            print(f"  frontier {step} @ {rate:.0f} rps: gateway {g['rps']} rps, errors {g['errors']}, "
                  f"p99 {g['p99_us']} us vs direct {d['p99_us']} us (added {added:.3f} ms) -> "
                  f"{'pass' if pt['pass'] else 'fail'}", file=sys.stderr, flush=True)
            return pt

        rate = p["frontier_start"]
        while rate <= p["frontier_max"]:
            pt = measure(rate)
            if not pt["direct_ok"]:
                stop_reason = f"direct side could not sustain {rate:.0f} rps (client/mock limit)"
                break
            if pt["pass"]:
                last_good = rate
                rate *= p["frontier_factor"]
            else:
                first_bad = rate
                stop_reason = "gateway over its bound"
                break
        if first_bad is not None and last_good is None:
            # Below the start rate: halve three times at most.
            rate = first_bad / 2
            for _ in range(3):
                pt = measure(rate)
                if pt["pass"]:
                    last_good = rate
                    break
                first_bad = rate
                rate /= 2
        if last_good is not None and first_bad is not None and first_bad > last_good:
            mid = (last_good + first_bad) / 2
            if measure(mid)["pass"]:
                last_good = mid
        at = next((pt for pt in points if last_good is not None and pt["rate"] == round(last_good) and pt["pass"]), None)
        # Closed-loop maximum at 32 connections, interleaved.
        closed = {"direct": [], "gateway": []}
        extra = ["--connections", "32", "--seconds", str(p["closed_seconds"]), "--warmup", "320"]
        for r in range(p["closed_rounds"]):
            for side in (("direct", "gateway") if r % 2 == 0 else ("gateway", "direct")):
                closed[side].append(rig.lg(side, extra))
        dmax = statistics.fmean(x["rps"] for x in closed["direct"])
        gmax = statistics.fmean(x["rps"] for x in closed["gateway"])
        gcpu = [x.get("gw_cpu_us_per_req") for x in closed["gateway"] if x.get("gw_cpu_us_per_req")]
        out[step] = {
            "added_p99_limit_ms": limit,
            "frontier_rps": round(last_good) if last_good else 0,
            "stopped": stop_reason,
            "gw_cpu_us_per_req_at_frontier": at["gw_cpu_us_per_req"] if at else None,
            "added_p99_ms_at_frontier": at["added_p99_ms"] if at else None,
            "direct_closed_max_rps": round(dmax, 1),
            "gateway_closed_max_rps": round(gmax, 1),
            "gateway_closed_cpu_us_per_req": round(statistics.fmean(gcpu), 1) if gcpu else None,
            "frontier_over_direct_max": round(last_good / dmax, 3) if last_good and dmax else 0,
            "closed_max_gateway_over_direct": round(gmax / dmax, 3) if dmax else None,
            "points": points,
            "closed": closed,
        }
        print(f"  frontier {step}: {out[step]['frontier_rps']} rps; closed max direct {dmax:.0f}, "
              f"gateway {gmax:.0f} rps", file=sys.stderr, flush=True)
    return out


def phase_soak(rig: Rig, p: dict, frontier: dict | None) -> dict:
    # At the frontier of `all`, or 3 000 rps (its target) when that is lower; 3 000 rps
    # when the frontier was not measured or nothing passed.
    rate = 3000
    if frontier and frontier.get("all", {}).get("frontier_rps"):
        rate = min(rate, frontier["all"]["frontier_rps"])
    rig.gateway("all")
    res = rig.lg("gateway", ["--connections", "64", "--rate", str(rate), "--seconds", str(p["soak_seconds"]),
                             "--warmup", "256"])
    print(f"  soak: {res['requests']} requests at {rate} rps for {p['soak_seconds']} s, "
          f"{res['errors']} errors, p99 {res['p99_us']} us", file=sys.stderr, flush=True)
    return {"rate": rate, "seconds": p["soak_seconds"], **res}


class OtlpSink(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP exports and answers each with an empty (valid) protobuf response,
    counting requests and bytes."""
    received = {"requests": 0, "bytes": 0}

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        OtlpSink.received["requests"] += 1
        OtlpSink.received["bytes"] += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def phase_traces(rig: Rig, p: dict) -> dict:
    """`all` with traces off, on at sample ratio 0, on at 1: in each round one run of each
    (in a rotating order, each on a fresh gateway, each against its own direct run), so
    that drift on the machine hits the three alike; per variant the median over rounds."""
    sink = ThreadingHTTPServer(("127.0.0.1", 0), OtlpSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    variants = [("off", None), ("sampled_0", (endpoint, 0.0)), ("sampled_1", (endpoint, 1.0))]
    extra = ["--connections", "1", "--requests", str(p["ladder_requests"]), "--warmup", str(p["ladder_warmup"])]
    runs = {label: [] for label, _ in variants}
    exports = {label: [0, 0] for label, _ in variants}
    try:
        for r in range(p["ladder_rounds"]):
            for label, tracing in variants[r % 3:] + variants[:r % 3]:
                rig.tracing = tracing
                before = dict(OtlpSink.received)
                runs[label].append(interleaved(rig, "all", 1, extra, f"traces {label} round {r + 1}"))
                # The exporter sends in batches: its gateway's stop flushes the last.
                stop(rig.gw)
                rig.gw = None
                exports[label][0] += OtlpSink.received["requests"] - before["requests"]
                exports[label][1] += OtlpSink.received["bytes"] - before["bytes"]
    except BenchError as e:
        print(f"  traces: {e}", file=sys.stderr)
        return {"skipped": str(e)}
    finally:
        rig.tracing = None
        sink.shutdown()

    def median(key, rs):
        vals = [x[key] for x in rs if x.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    return {label: {"added_p50_ms": median("added_p50_ms", rs),
                    "added_p99_ms": median("added_p99_ms", rs),
                    "gw_cpu_us_per_req": median("gw_cpu_us_per_req", rs),
                    "errors": sum(x["gateway"]["errors"] + x["direct"]["errors"] for x in rs),
                    "rounds": len(rs),
                    "otlp_exports": exports[label][0], "otlp_bytes": exports[label][1],
                    "runs": rs}
            for label, rs in runs.items()}


def phase_streams(rig: Rig, p: dict) -> dict:
    n, ramp = p["streams"], p["ramp_ms"]
    rig.gateway("all")
    rig.sticky({"chunk_delay_ms": 100, "text": STREAM_TEXT})
    try:
        extra = ["--stream", "--streams", str(n), "--ramp-ms", str(ramp), "--expect-chunks", str(STREAM_CHUNKS)]
        warm = ["--stream", "--streams", "20", "--ramp-ms", "100", "--expect-chunks", str(STREAM_CHUNKS)]
        rig.lg("direct", warm, stream=True)
        rig.lg("gateway", warm, stream=True)
        # Read at 1 s as before s44, and at 4 s: at rest, past the heap-release thread's two
        # quiet seconds after the warm-up, when it hands the free heap back (`ops::memory`).
        time.sleep(1.0)
        idle_at_1s = rss_kb(rig.gw.pid)
        time.sleep(3.0)
        idle, idle_split = rss_kb(rig.gw.pid), rss_split_kb(rig.gw.pid)
        direct = rig.lg("direct", extra, stream=True)
        through = rig.lg("gateway", extra, stream=True, sample_rss=True)
        time.sleep(5.0)
        after, after_split = rss_kb(rig.gw.pid), rss_split_kb(rig.gw.pid)
    finally:
        rig.sticky(None)
    peak = through.pop("gw_rss_peak_kb")
    bad = (through["chunk_count_mismatch"] or 0) + through["done_missing"]
    out = {
        "streams": n, "ramp_ms": ramp, "chunk_delay_ms": 100, "chunks_per_stream": STREAM_CHUNKS,
        "direct": direct, "gateway": through,
        "added_ttft_p50_ms": ms(through["ttft_p50_us"] - direct["ttft_p50_us"]),
        "added_ttft_p99_ms": ms(through["ttft_p99_us"] - direct["ttft_p99_us"]),
        "added_gap_p50_ms": ms(through["gap_p50_us"] - direct["gap_p50_us"]),
        "added_gap_p99_ms": ms(through["gap_p99_us"] - direct["gap_p99_us"]),
        "streams_lost_or_merged": bad,
        "rss_kb": {"idle": idle, "idle_at_1s": idle_at_1s, "peak": peak, "after_5s": after,
                   "idle_split": idle_split, "after_5s_split": after_split,
                   "per_1000_streams": round((peak - idle) * 1000 / n) if n else None,
                   "after_over_idle": round(after / idle, 3) if idle else None},
    }
    print(f"  streams: {through['streams_ok']}/{n} ok through the gateway; added TTFT p50 "
          f"{out['added_ttft_p50_ms']} ms, gap p99 {out['added_gap_p99_ms']} ms; RSS idle "
          f"{idle / 1024:.1f} MB (at 1 s {idle_at_1s / 1024:.1f}), peak {peak / 1024:.1f} MB, after {after / 1024:.1f} MB "
          f"(anonymous {idle_split['anon'] / 1024:.1f} → {after_split['anon'] / 1024:.1f} MB, "
          f"file-backed {idle_split['file'] / 1024:.1f} → {after_split['file'] / 1024:.1f} MB)",
          file=sys.stderr, flush=True)
    return out


# ------------------------------------------------------------------------ report


def fmt(v, unit="") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        v = f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:.0f}"
    return f"{v}{unit}"


def target_rows(res: dict) -> list[tuple[str, object, str, str, str]]:
    """(figure, measured, unit, target text, verdict)."""
    rows = []

    def row(name, value, unit, key, higher=False):
        limit = TARGETS[key]
        if value is None:
            verdict = "not run"
        else:
            verdict = "met" if (value >= limit if higher else value <= limit) else "MISSED"
        rows.append((name, value, unit, f"{'≥' if higher else '≤'} {fmt(limit)}{unit}", verdict))

    lad = res.get("phases", {}).get("ladder", {})
    for step in ("plain", "all"):
        r = lad.get(step, {})
        row(f"1 client, {step}: added p50", r.get("added_p50_ms"), " ms", f"{step}_added_p50_ms")
        row(f"1 client, {step}: added p99", r.get("added_p99_ms"), " ms", f"{step}_added_p99_ms")
        row(f"1 client, {step}: gateway CPU/request", r.get("gw_cpu_us_per_req"), " µs", f"{step}_cpu_us")
    dl = res.get("phases", {}).get("delay", {})
    for step in ("plain", "all"):
        r = dl.get(step, {})
        row(f"1 client, mock +20 ms, {step}: added p50", r.get("added_p50_ms"), " ms", f"{step}_added_p50_ms")
        row(f"1 client, mock +20 ms, {step}: added p99", r.get("added_p99_ms"), " ms", f"{step}_added_p99_ms")
    fr = res.get("phases", {}).get("frontier", {})
    for step, bound in (("plain", 1), ("all", 2)):
        r = fr.get(step, {})
        row(f"{step}: rps at added p99 ≤ {bound} ms (open loop)", r.get("frontier_rps"), " rps",
            f"{step}_frontier_rps", higher=True)
        row(f"{step}: frontier / direct closed max", r.get("frontier_over_direct_max"), "", f"{step}_ratio", higher=True)
        row(f"{step}: gateway CPU/request at the frontier", r.get("gw_cpu_us_per_req_at_frontier"), " µs", f"{step}_cpu_us")
    sk = res.get("phases", {}).get("soak")
    row(f"soak: errors over {sk['seconds'] if sk else '—'} s at {sk['rate'] if sk else '—'} rps",
        sk["errors"] if sk else None, "", "soak_errors")
    if sk:
        rows.append(("soak: achieved rate", sk["rps"], " rps", "(info)", "info"))
        rows.append(("soak: p99 (from the scheduled time)", ms(sk["p99_us"]), " ms", "(info)", "info"))
    st = res.get("phases", {}).get("streams")
    row("streams: added TTFT p50", st and st["added_ttft_p50_ms"], " ms", "stream_added_ttft_p50_ms")
    row("streams: added TTFT p99", st and st["added_ttft_p99_ms"], " ms", "stream_added_ttft_p99_ms")
    row("streams: added inter-chunk p99", st and st["added_gap_p99_ms"], " ms", "stream_added_gap_p99_ms")
    row("streams: streams with chunks lost/merged", st and st["streams_lost_or_merged"], "", "stream_chunks_bad")
    rss = st["rss_kb"] if st else None
    row("gateway RSS idle", rss and round(rss["idle"] / 1024, 1), " MB", "idle_rss_mb")
    per = round(rss["per_1000_streams"] / 1024, 1) if rss and rss["per_1000_streams"] is not None else None
    row(f"gateway RSS per 1 000 streams ({st['streams'] if st else '—'} open)", per, " MB",
        "rss_per_1000_streams_mb")
    row("gateway RSS 5 s after / idle", rss and rss["after_over_idle"], "", "rss_after_over_idle")
    return rows


def print_report(res: dict) -> None:
    lad = res.get("phases", {}).get("ladder")
    for title, block in (("Feature ladder, 1 client, mock delay 0", lad),
                         ("1 client, mock delay 20 ms", res.get("phases", {}).get("delay"))):
        if not block:
            continue
        print(f"\n{title} (pooled over rounds; ms)")
        print(f"{'step':<8} {'direct p50':>10} {'gw p50':>8} {'+p50':>7} {'direct p99':>10} {'gw p99':>8} "
              f"{'+p99':>7} {'gw CPU µs/r':>11} {'errors':>7}")
        for step in LADDER:
            r = block.get(step)
            if not isinstance(r, dict):
                continue
            if "skipped" in r:
                print(f"{step:<8} skipped: {r['skipped']}")
                continue
            d, g = r["direct"], r["gateway"]
            print(f"{step:<8} {fmt(d.get('p50_ms')):>10} {fmt(g.get('p50_ms')):>8} {fmt(r['added_p50_ms']):>7} "
                  f"{fmt(d.get('p99_ms')):>10} {fmt(g.get('p99_ms')):>8} {fmt(r['added_p99_ms']):>7} "
                  f"{fmt(r['gw_cpu_us_per_req']):>11} {d['errors'] + g['errors']:>7}")
    hits = res.get("phases", {}).get("hits")
    if hits:
        print("\nCache hits, `all`, 1 client: the same questions a second after they were stored "
              "(median over rounds; ms)")
        if "skipped" in hits:
            print(f"skipped: {hits['skipped']}")
        else:
            print(f"gateway (hits) p50 {fmt(hits['gateway_p50_ms'])} p99 {fmt(hits['gateway_p99_ms'])}; "
                  f"direct (the mock) p50 {fmt(hits['direct_p50_ms'])} p99 {fmt(hits['direct_p99_ms'])}; "
                  f"gw CPU {fmt(hits['gw_cpu_us_per_req'])} µs/r; errors {hits['errors']}")
    tr = res.get("phases", {}).get("traces")
    if tr:
        print("\nTraces, `all`, 1 client, mock delay 0 (median over rounds; ms)")
        if "skipped" in tr:
            print(f"skipped: {tr['skipped']}")
            tr = {}
        for label, r in tr.items():
            print(f"{label:<10} +p50 {fmt(r['added_p50_ms']):>7} +p99 {fmt(r['added_p99_ms']):>7} "
                  f"gw CPU {fmt(r['gw_cpu_us_per_req']):>7} µs/r, OTLP exports {r.get('otlp_exports')} "
                  f"({r.get('otlp_bytes')} B)")
    fr = res.get("phases", {}).get("frontier")
    if fr:
        print("\nThroughput (open loop, 64 connections; closed loop, 32 connections)")
        for step, r in fr.items():
            if "skipped" in r:
                print(f"{step:<8} skipped: {r['skipped']}")
                continue
            print(f"{step:<8} frontier {r['frontier_rps']} rps at added p99 ≤ {r['added_p99_limit_ms']} ms "
                  f"(stopped: {r['stopped']}); closed max direct {r['direct_closed_max_rps']:.0f} / gateway "
                  f"{r['gateway_closed_max_rps']:.0f} rps (ratio {r['closed_max_gateway_over_direct']})")
            for pt in r["points"]:
                print(f"         {pt['rate']:>6} rps: added p50 {pt['added_p50_ms']:.3f} ms, p99 {pt['added_p99_ms']:.3f} ms, "
                      f"gateway {pt['gateway']['rps']:.0f} rps / {pt['gateway']['errors']} errors, "
                      f"CPU {fmt(pt['gw_cpu_us_per_req'])} µs/r -> {'pass' if pt['pass'] else 'fail'}")
    print("\nIssue 10 targets")
    rows = target_rows(res)
    w = max(len(r[0]) for r in rows)
    print(f"{'figure':<{w}}  {'measured':>12}  {'target':>12}  verdict")
    for name, value, unit, target, verdict in rows:
        print(f"{name:<{w}}  {fmt(value, unit):>12}  {target:>12}  {verdict}")
    res["targets"] = [{"figure": r[0], "measured": r[1], "unit": r[2].strip(), "target": r[3], "verdict": r[4]}
                      for r in rows]


# -------------------------------------------------------------------------- main


def params(args) -> dict:
    if args.quick:
        p = dict(ladder_rounds=2, ladder_requests=300, ladder_warmup=50,
                 delay_rounds=2, delay_requests=25, delay_warmup=5, hits_rounds=1, hits_requests=300,
                 rate_seconds=1.0, frontier_start=1000.0, frontier_factor=1.6, frontier_max=50000.0,
                 closed_rounds=1, closed_seconds=1.0, soak_seconds=5, streams=200, ramp_ms=500)
    else:
        p = dict(ladder_rounds=6, ladder_requests=2000, ladder_warmup=200,
                 delay_rounds=4, delay_requests=100, delay_warmup=10, hits_rounds=4, hits_requests=2000,
                 rate_seconds=3.0, frontier_start=1000.0, frontier_factor=1.25, frontier_max=50000.0,
                 closed_rounds=2, closed_seconds=3.0, soak_seconds=60, streams=1000, ramp_ms=2000)
    for k in ("soak_seconds", "streams", "ramp_ms", "ladder_rounds", "ladder_requests", "rate_seconds"):
        v = getattr(args, k, None)
        if v is not None:
            p[k] = v
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run (fewer rounds, shorter phases)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, from {','.join(PHASES)}")
    ap.add_argument("--steps", default=",".join(LADDER), help="ladder steps for the ladder phase")
    ap.add_argument("--soak-seconds", type=int, default=None, help="default 60 (quick: 5)")
    ap.add_argument("--streams", type=int, default=None, help="default 1000 (quick: 200)")
    ap.add_argument("--ramp-ms", type=int, default=None, help="default 2000 (quick: 500)")
    ap.add_argument("--ladder-rounds", type=int, default=None, help="default 6 (quick: 2)")
    ap.add_argument("--ladder-requests", type=int, default=None, help="per side per round; default 2000 (quick: 300)")
    ap.add_argument("--rate-seconds", type=float, default=None, help="per rate per side; default 3 (quick: 1)")
    ap.add_argument("--synchronous", choices=["normal", "full"], default="normal",
                    help="the gateway's [quota] synchronous setting")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes with taskset")
    ap.add_argument("--out", default=None, help="default bench/results/latest.json (quick: quick.json)")
    ap.add_argument("--keep-dir", action="store_true", help="keep the temp dir (configs, db, logs)")
    args = ap.parse_args()
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    for x in phases:
        if x not in PHASES:
            ap.error(f"unknown phase {x!r}")
    for x in steps:
        if x not in LADDER:
            ap.error(f"unknown ladder step {x!r}")
    p = params(args)
    out_path = Path(args.out or REPO_ROOT / "bench" / "results" / ("quick.json" if args.quick else "latest.json"))

    raise_fd_limit()

    rig = Rig(args)
    started = time.monotonic()
    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_rev(),
        "quick": args.quick,
        "conditions": {
            "binary": str(rig.bin),
            "binary_mtime": dt.datetime.fromtimestamp(rig.bin.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "loadgen": str(rig.loadgen),
            "ladder_supported": rig.ladder_supported,
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "pinning": {"gateway": " ".join(rig.gw_pin) or None,
                        "mock_redis_loadgen": " ".join(rig.side_pin) or None},
            "client": "bench/loadgen.rs (hyper 1 http1, current-thread runtime, TCP_NODELAY, keep-alive)",
            "mock_workers": 1,
            # {n} becomes a 10-digit number.
            "request_body_bytes": len(json.dumps(BODY, separators=(",", ":")).replace("{n}", "1" * 10)),
            "mock_text_bytes": len(MOCK_TEXT),
            "redis": shutil.which("redis-server") is not None,
            "code_order": code_order(rig.bin),
            "synchronous": args.synchronous,
            "gateway": "workers = 1, [queue] max_in_flight = max_depth = 4096, cache mode all "
                       "(cache and all steps), redis window store (window step and above)",
        },
        "params": p,
        "phases": {},
    }
    try:
        rig.start()
        # Sanity: one request each way, and the answer sizes.
        rig.gateway("all")
        for side in ("direct", "gateway"):
            r = rig.lg(side, ["--connections", "1", "--requests", "20"])
            result["conditions"][f"answer_bytes_{side}"] = r["mean_body_bytes"]
            if r["errors"]:
                raise BenchError(f"{side} side answers with errors: {r['error_samples']}")
        if not rig.ladder_supported:
            print("warning: this sluice has no `serve --ladder`; only the `all` step (the default) runs",
                  file=sys.stderr)
        if stale_code_order(result["conditions"]["code_order"]):
            print(f"warning: {result['conditions']['code_order']}: the list is stale and the RSS "
                  "figures read high; `python3 scripts/code-order.py` remakes it", file=sys.stderr)
        print(f"pinning: gateway {result['conditions']['pinning']['gateway']}, mock/redis/loadgen "
              f"{result['conditions']['pinning']['mock_redis_loadgen']}; redis {'on' if rig.redis_url else 'absent'}",
              file=sys.stderr)
        ph = result["phases"]
        if "ladder" in phases:
            ph["ladder"] = phase_ladder(rig, p, steps)
        if "delay" in phases:
            ph["delay"] = phase_delay(rig, p, ["plain", "all"])
        if "hits" in phases:
            try:
                ph["hits"] = phase_hits(rig, p)
            except BenchError as e:
                print(f"  hits: {e}", file=sys.stderr)
                ph["hits"] = {"skipped": str(e)}
        if "frontier" in phases:
            ph["frontier"] = phase_frontier(rig, p, ["plain", "all"])
        if "soak" in phases:
            ph["soak"] = phase_soak(rig, p, ph.get("frontier"))
        if "traces" in phases:
            ph["traces"] = phase_traces(rig, p)
        if "streams" in phases:
            ph["streams"] = phase_streams(rig, p)
    except BenchError as e:
        print(f"benchmark stopped: {e}", file=sys.stderr)
        result["stopped"] = str(e)
    finally:
        rig.close()
    result["duration_s"] = round(time.monotonic() - started, 1)
    print_report(result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out_path)
    print(f"\n{result['duration_s']} s; wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
