#!/usr/bin/env python3
"""Gateway overhead benchmark: the same non-streaming chat request sent straight to
`sluice mock` and through `sluice serve`, alternating in rounds.

A benchmark, never a test: it asserts nothing about speed. It builds nothing either;
build first (`cargo build --release`) or point SLUICE_BIN at a binary.

    python3 bench/overhead.py [--rounds 10] [--requests 200] [--concurrency 16]
                              [--tp-rounds 4] [--tp-seconds 3] [--out bench/results/latest.json]

Phases
  1. latency: concurrency 1, one keep-alive http.client connection per side;
     `rounds` x `requests` per side, alternating direct / gateway (the side that goes
     first alternates too), after a warm-up.
  2. throughput: `concurrency` threads, one keep-alive connection each, for
     `tp-seconds` per side, alternating for `tp-rounds` rounds.

When `taskset` exists and there are >= 2 CPUs, the gateway is pinned to CPU 0 and the
mock to CPU 1. The Python client is not pinned (it shares both CPUs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BIN = REPO_ROOT / "target" / "release" / "sluice"
UPSTREAM_KEY = "sk-upstream-canary-AAAA1111"
MODEL = "gpt-4o-mini"
MOCK_TEXT = (
    "Hello from the Sluice mock upstream. "
    "This answer is fixed so that tests can check every byte of it."
)

CONFIG = """\
[server]
listen = "127.0.0.1:{gw_port}"

[database]
url = "sqlite://{db_path}"

[quota]
synchronous = "{synchronous}"

[[upstreams]]
id = "mock-a"
provider = "openai"
base_url = "http://127.0.0.1:{mock_port}/v1"
api_key = "{key}"
allow_private_network = true

[[models]]
name = "{model}"
routes = [{{ upstream = "mock-a", model = "{model}" }}]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"""

# The same body both ways. max_tokens is set so that the gateway forwards it unchanged
# and the reservation stays small.
BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in one sentence."}],
        "max_tokens": 64,
    }
).encode()


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin_prefix(cpu: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(cpu)]
    return []


def wait_http(url: str, proc: subprocess.Popen, timeout=20.0) -> None:
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


# ------------------------------------------------------------------ client


class Side:
    def __init__(self, name: str, port: int, auth: str, pid: int):
        self.name, self.port, self.auth, self.pid = name, port, auth, pid
        self.headers = {
            "content-type": "application/json",
            "authorization": f"Bearer {auth}",
        }

    def connect(self) -> http.client.HTTPConnection:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.connect()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def one(self, conn: http.client.HTTPConnection) -> tuple[int, bytes]:
        conn.request("POST", "/v1/chat/completions", body=BODY, headers=self.headers)
        r = conn.getresponse()
        data = r.read()
        return r.status, data

    def safe_one(self, conn: http.client.HTTPConnection) -> tuple[int, bytes]:
        """`one`, but a transport failure counts as status 0 and reopens the connection
        (outside the timing of the next request) instead of killing the caller."""
        try:
            return self.one(conn)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            try:
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            return 0, repr(e).encode()


def check_answer(status: int, data: bytes, side: str) -> None:
    if status != 200:
        raise SystemExit(f"{side}: HTTP {status}: {data[:300]!r}")
    content = json.loads(data)["choices"][0]["message"]["content"]
    if content != MOCK_TEXT:
        raise SystemExit(f"{side}: unexpected answer {content!r}")


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(round(p / 100 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


def summarise(lat: list[float], wall: float, errors: int, cpu: float | None) -> dict:
    s = sorted(lat)
    n = len(s)
    out = {
        "requests": n,
        "errors": errors,
        "wall_s": round(wall, 3),
        "rps": round(n / wall, 1) if wall > 0 else None,
        "mean_ms": round(statistics.fmean(s) * 1e3, 3) if s else None,
        "p50_ms": round(pct(s, 50) * 1e3, 3),
        "p90_ms": round(pct(s, 90) * 1e3, 3),
        "p99_ms": round(pct(s, 99) * 1e3, 3),
        "max_ms": round(s[-1] * 1e3, 3) if s else None,
    }
    if cpu is not None and n:
        out["server_cpu_us_per_req"] = round(cpu / n * 1e6, 1)
    return out


# ------------------------------------------------------------------ phases


def latency_round(side: Side, conn, n: int, lat: list[float]) -> tuple[float, int]:
    errors = 0
    t0 = time.perf_counter()
    for _ in range(n):
        a = time.perf_counter()
        status, _ = side.safe_one(conn)
        if status != 200:
            errors += 1
            continue
        lat.append(time.perf_counter() - a)
    return time.perf_counter() - t0, errors


def throughput_round(side: Side, n_conns: int, seconds: float, lat: list[float]) -> tuple[float, int, float]:
    """Returns (wall seconds, errors, server CPU seconds) of the timed window only."""
    # Fresh connections every round, opened and warmed before the clock starts: a pool
    # left idle while the other side runs would hit the servers' keep-alive timeout.
    conns = [side.connect() for _ in range(n_conns)]
    for c in conns:
        check_answer(*side.one(c), side.name)
    stop_at = [0.0]
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(conns) + 1)

    def worker(conn):
        local, errs = [], 0
        start.wait()
        while True:
            a = time.perf_counter()
            if a >= stop_at[0]:
                break
            status, _ = side.safe_one(conn)
            if status != 200:
                errs += 1
                continue
            local.append(time.perf_counter() - a)
        with lock:
            lat.extend(local)
            errors[0] += errs

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in conns]
    for t in threads:
        t.start()
    c0 = cpu_seconds(side.pid)
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(side.pid) - c0
    for c in conns:
        c.close()
    return wall, errors[0], cpu


# -------------------------------------------------------------------- main


def git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=200, help="per side per round")
    ap.add_argument("--warmup", type=int, default=200, help="per side, not measured")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tp-rounds", type=int, default=4)
    ap.add_argument("--tp-seconds", type=float, default=3.0, help="per side per round")
    ap.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "latest.json"))
    ap.add_argument("--keep-dir", action="store_true", help="keep the temp dir (config, db, logs)")
    ap.add_argument("--synchronous", choices=["normal", "full"], default="normal",
                    help="the gateway's [quota] synchronous setting")
    args = ap.parse_args()

    bin_path = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
    if not bin_path.is_file():
        print(f"sluice binary not found at {bin_path}: run `cargo build --release` or set SLUICE_BIN",
              file=sys.stderr)
        return 2
    profile = "release" if "release" in bin_path.parts else ("debug" if "debug" in bin_path.parts else "unknown")

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    gw_port, mock_port = free_port(), free_port()
    db_path = work / "sluice.db"
    cfg = work / "sluice.toml"
    cfg.write_text(CONFIG.format(gw_port=gw_port, mock_port=mock_port, db_path=db_path,
                                 synchronous=args.synchronous,
                                 key=UPSTREAM_KEY, model=MODEL))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") or k == "SLUICE_BIN"}

    gw_pin, mock_pin = pin_prefix(0), pin_prefix(1)
    mock = gw = None
    mock_log = open(work / "mock.log", "wb")
    gw_log = open(work / "gateway.log", "wb")
    try:
        mock = subprocess.Popen(
            mock_pin + [str(bin_path), "mock", "--listen", f"127.0.0.1:{mock_port}", "--workers", "1"],
            stdout=mock_log, stderr=subprocess.STDOUT, env=env, cwd=work)
        subprocess.run([str(bin_path), "--config", str(cfg), "migrate"], check=True,
                       capture_output=True, env=env, cwd=work)
        gw = subprocess.Popen(
            gw_pin + [str(bin_path), "--config", str(cfg), "serve"],
            stdout=subprocess.DEVNULL, stderr=gw_log, env=env, cwd=work)
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw)
        wait_http(f"http://127.0.0.1:{mock_port}/_mock/stats", mock)
        issued = subprocess.run(
            [str(bin_path), "--config", str(cfg), "token", "issue", "--user", "bench",
             "--budget-usd", "1000000", "--json"],
            check=True, capture_output=True, text=True, env=env, cwd=work)
        token = json.loads(issued.stdout)["token"]

        # With taskset the process we started is the server itself (taskset execs).
        direct = Side("direct", mock_port, UPSTREAM_KEY, mock.pid)
        gateway = Side("gateway", gw_port, token, gw.pid)
        sides = [direct, gateway]

        print(f"sluice {profile} build: {bin_path}")
        print(f"pinning: gateway {'CPU 0' if gw_pin else 'none'}, mock {'CPU 1' if mock_pin else 'none'}, client unpinned")

        # Sanity + warm-up.
        conns = {s.name: s.connect() for s in sides}
        for s in sides:
            check_answer(*s.one(conns[s.name]), s.name)
            for _ in range(args.warmup):
                s.one(conns[s.name])

        # Phase 1: latency at concurrency 1, alternating.
        lat = {s.name: [] for s in sides}
        wall = {s.name: 0.0 for s in sides}
        errs = {s.name: 0 for s in sides}
        cpu = {s.name: 0.0 for s in sides}
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                c0 = cpu_seconds(s.pid)
                w, e = latency_round(s, conns[s.name], args.requests, lat[s.name])
                cpu[s.name] += cpu_seconds(s.pid) - c0
                wall[s.name] += w
                errs[s.name] += e
            print(f"  latency round {r + 1}/{args.rounds} done", flush=True)
        for c in conns.values():
            c.close()
        phase1 = {s.name: summarise(lat[s.name], wall[s.name], errs[s.name], cpu[s.name]) for s in sides}

        # Phase 2: throughput at concurrency N, alternating.
        lat2 = {s.name: [] for s in sides}
        wall2 = {s.name: 0.0 for s in sides}
        errs2 = {s.name: 0 for s in sides}
        cpu2 = {s.name: 0.0 for s in sides}
        for r in range(args.tp_rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                w, e, c = throughput_round(s, args.concurrency, args.tp_seconds, lat2[s.name])
                cpu2[s.name] += c
                wall2[s.name] += w
                errs2[s.name] += e
            print(f"  throughput round {r + 1}/{args.tp_rounds} done", flush=True)
        phase2 = {s.name: summarise(lat2[s.name], wall2[s.name], errs2[s.name], cpu2[s.name]) for s in sides}
    finally:
        stop(gw)
        stop(mock)
        mock_log.close()
        gw_log.close()
        if not args.keep_dir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")

    def ratios(p):
        d, g = p["direct"], p["gateway"]
        return {
            "rps_ratio_gateway_over_direct": round(g["rps"] / d["rps"], 3),
            "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
            "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
            "added_mean_ms": round(g["mean_ms"] - d["mean_ms"], 3),
        }

    result = {
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_rev(),
        "conditions": {
            "binary": str(bin_path),
            "binary_mtime": dt.datetime.fromtimestamp(bin_path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "profile": profile,
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "gateway_pinned": " ".join(gw_pin) or None,
            "mock_pinned": " ".join(mock_pin) or None,
            "client": "python http.client, keep-alive, unpinned",
            "mock_workers": 1,
            "request_body_bytes": len(BODY),
            "redis": False,
            "request_log": True,
            "quota_reserve_settle": True,
            "synchronous": args.synchronous,
        },
        "params": {
            "rounds": args.rounds, "requests_per_round": args.requests, "warmup": args.warmup,
            "concurrency": args.concurrency, "tp_rounds": args.tp_rounds, "tp_seconds": args.tp_seconds,
        },
        "latency_c1": {**phase1, **ratios(phase1)},
        f"throughput_c{args.concurrency}": {**phase2, **ratios(phase2)},
    }

    def row(label, p):
        return (f"{label:<10} {p['rps']:>9.1f} {p['p50_ms']:>9.3f} {p['p99_ms']:>9.3f} "
                f"{p.get('server_cpu_us_per_req', float('nan')):>12.1f} {p['errors']:>6}")

    print()
    for title, p in (("concurrency 1 (latency)", result["latency_c1"]),
                     (f"concurrency {args.concurrency} (throughput)", result[f"throughput_c{args.concurrency}"])):
        print(title)
        print(f"{'side':<10} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'srv cpu us/r':>12} {'errors':>6}")
        print(row("direct", p["direct"]))
        print(row("gateway", p["gateway"]))
        print(f"gateway/direct req/s = {p['rps_ratio_gateway_over_direct']:.3f}; "
              f"added p50 = {p['added_p50_ms']:.3f} ms; added p99 = {p['added_p99_ms']:.3f} ms")
        print()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
