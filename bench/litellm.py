#!/usr/bin/env python3
"""Sluice and the LiteLLM proxy side by side (issue 21 item 3) — a benchmark, never a
test: it reports figures and asserts nothing.

    cargo build --release --locked --bins --examples    # the script builds nothing
    python3 bench/litellm.py                            # or: make bench-litellm
    python3 bench/litellm.py --rounds 2 --requests 300  # a smoke run

The first run makes a venv at target/litellm-venv and installs the pinned LiteLLM proxy
from PyPI into it (`LITELLM_PIN`); later runs reuse it. LiteLLM runs offline: the model
price map is read from the copy inside the package (`LITELLM_LOCAL_MODEL_COST_MAP=True`,
documented by LiteLLM), so nothing is fetched at start.

Both gateways run against the same `sluice mock` (1 worker, the ~1.4 KB answer of
overhead.py), both pinned on CPU 0 (one worker each; the one not being measured sits
idle); the mock, redis-server and the client (bench/loadgen.rs) share CPU 1. Cells:

  plain     Sluice `serve --ladder plain` (validate, route, call, answer; no token)
            against LiteLLM with no master key (no auth: its
            `dangerously_permit_weak_or_unset_master_key`), no Redis, no budget.
  governed  Sluice `--ladder quota`: sub-token lookup, RPM/TPM windows in Redis (one
            EVALSHA a request) and budget reserve + settle in SQLite; against LiteLLM
            with a master key, the deployment's RPM/TPM limits tracked in the same Redis
            (`usage-based-routing-v2`, pre-call checks on) and a proxy-wide `max_budget`
            (in process) — LiteLLM's virtual keys, per-key windows and key budgets need
            its database (`DATABASE_URL`), which is not set up here: a key other than
            the master key is answered "No connected db.".

Per cell, rounds alternate direct → Sluice → LiteLLM (the order rotates each round); each
round is one loadgen run per side of one client, closed loop. Figures: added p50 / p99
over direct (pooled over the rounds), gateway CPU per request (/proc schedstat of every
thread of the gateway's processes), and the closed-loop rate at 16 connections; plus
Redis commands per request, read from `INFO commandstats` over each run (which counts the
commands run inside a Lua script too, and whatever any process sent during the run). Writes
bench/results/litellm.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import (  # noqa: E402
    MODEL, REPO_ROOT, UPSTREAM_KEY, BenchError, Rig, cpu_model, cpu_seconds, free_port, git_rev,
    lat_summary, read_raw, stop, wait_http,
)

LITELLM_PIN = "1.106.12"
VENV = REPO_ROOT / "target" / "litellm-venv"
# A key LiteLLM accepts as strong (it refuses to start on a weak or missing one unless told).
MASTER_KEY = "sk-8f3c2a9d41b7e6f05c1a2b3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071"
CELLS = {"plain": "plain", "governed": "quota"}  # cell -> Sluice ladder step


def ensure_litellm() -> Path:
    exe = VENV / "bin" / "litellm"
    py = VENV / "bin" / "python"
    if exe.is_file():
        have = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                              capture_output=True, text=True).stdout.strip()
        if have == LITELLM_PIN:
            return exe
    print(f"installing litellm[proxy]=={LITELLM_PIN} into {VENV}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={LITELLM_PIN}"], check=True)
    return exe


def descendants(pid: int) -> list[int]:
    """pid and every process below it (LiteLLM's CLI may run its server in a child)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in descendants(pid):
        try:
            total += cpu_seconds(p)
        except OSError:
            pass
    return total


def redis_calls(port: int) -> int:
    """Every command Redis has run (INFO commandstats, less the INFO calls themselves)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"INFO commandstats\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            data += chunk
            if not chunk:
                break
            head, _, rest = data.partition(b"\r\n")
            if head.startswith(b"$") and len(rest) >= int(head[1:]):
                break
    total = 0
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("cmdstat_") and not line.startswith("cmdstat_info:"):
            total += int(line.split("calls=", 1)[1].split(",", 1)[0])
    return total


class Side:
    """One gateway under test: how to start it and where to send."""

    def __init__(self, name: str):
        self.name = name
        self.proc = None
        self.port = None
        self.key = None

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid) if self.proc else 0.0


class Bench(Rig):
    def __init__(self, args, litellm_exe: Path):
        super().__init__(args)
        self.litellm_exe = litellm_exe
        self.ll_port = free_port()
        self.ll = None

    def litellm_config(self, cell: str) -> Path:
        governed = cell == "governed"
        redis_port = self.redis_url.rsplit(":", 1)[1] if self.redis_url else None
        lines = [
            "model_list:",
            f"  - model_name: {MODEL}",
            "    litellm_params:",
            f"      model: openai/{MODEL}",
            f"      api_base: http://127.0.0.1:{self.mock_port}/v1",
            f"      api_key: {UPSTREAM_KEY}",
        ]
        if governed:
            lines += ["      rpm: 100000000", "      tpm: 100000000000"]
        lines += ["litellm_settings:", "  telemetry: false", "  drop_params: true"]
        if governed:
            lines += ["  max_budget: 1000000000", "  budget_duration: 30d"]
        lines += ["general_settings:", "  disable_spend_logs: true"]
        if not governed:
            # No key at all, as Sluice's plain step: LiteLLM refuses to start so without this.
            lines += ["  dangerously_permit_weak_or_unset_master_key: true"]
        else:
            lines += [f"  master_key: {MASTER_KEY}"]
            if redis_port:
                lines += ["router_settings:", "  routing_strategy: usage-based-routing-v2",
                          "  enable_pre_call_checks: true", "  redis_host: 127.0.0.1",
                          f"  redis_port: {redis_port}"]
        path = self.work / f"litellm-{cell}.yaml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_litellm(self, cell: str):
        self.stop_litellm()
        cfg = self.litellm_config(cell)
        env = {**self.env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
               "LITELLM_TELEMETRY": "False", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True"}
        env.pop("DATABASE_URL", None)
        self.ll = subprocess.Popen(
            self.gw_pin + [str(self.litellm_exe), "--config", str(cfg), "--host", "127.0.0.1",
                           "--port", str(self.ll_port), "--num_workers", "1"],
            stdout=self.log(f"litellm-{cell}.log"), stderr=subprocess.STDOUT, env=env, cwd=self.work)
        try:
            wait_http(f"http://127.0.0.1:{self.ll_port}/health/liveliness", self.ll, timeout=180)
        except SystemExit as e:
            log = (self.work / f"litellm-{cell}.log").read_text(errors="replace")[-800:]
            raise BenchError(f"litellm ({cell}) did not start: {e}: {log}") from None
        # taskset pins the first thread; children and later threads inherit it. What it
        # burns idle (it shares CPU 0 with the idle Sluice, and the other way round):
        time.sleep(1.0)
        c0 = tree_cpu(self.ll.pid)
        time.sleep(1.0)
        self.ll_idle_cpu_ms_per_s = round((tree_cpu(self.ll.pid) - c0) * 1000, 2)

    def stop_litellm(self):
        if self.ll is not None:
            for p in reversed(descendants(self.ll.pid)[1:]):
                try:
                    os.kill(p, 15)
                except OSError:
                    pass
            stop(self.ll)
            self.ll = None

    def side_args(self, side: str) -> list[str]:
        if side == "litellm":
            key = MASTER_KEY if self.cell == "governed" else "sk-anything"
            return ["--url", f"http://127.0.0.1:{self.ll_port}/v1/chat/completions",
                    "--header", f"authorization: Bearer {key}"]
        return super().side_args(side)

    def run(self, side: str, extra: list[str], raw: Path | None = None) -> dict:
        cmd = self.lg_cmd(side, extra + (["--raw-out", str(raw)] if raw else []))
        proc = {"gateway": self.gw, "litellm": self.ll}.get(side)
        c0 = tree_cpu(proc.pid) if proc else 0.0
        r0 = redis_calls(self.redis_port) if self.redis_port else 0
        p = subprocess.run(cmd, capture_output=True, env=self.env)
        c1 = tree_cpu(proc.pid) if proc else 0.0
        r1 = redis_calls(self.redis_port) if self.redis_port else 0
        if p.returncode != 0:
            raise BenchError(f"loadgen against {side} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
        res = json.loads(p.stdout.decode().strip().splitlines()[-1])
        sent = res.get("sent_total") or 0
        res["cpu_s"] = round(c1 - c0, 6)
        res["cpu_us_per_req"] = round((c1 - c0) / sent * 1e6, 1) if sent and proc else None
        res["redis_calls_per_req"] = round((r1 - r0) / sent, 3) if sent and self.redis_port else None
        return res


def cell_run(b: Bench, cell: str, a) -> dict:
    b.cell = cell
    b.gateway(CELLS[cell])
    b.start_litellm(cell)
    sides = ["direct", "gateway", "litellm"]
    for side in sides:  # sanity and warm-up
        r = b.run(side, ["--connections", "1", "--requests", "50"])
        if r["errors"]:
            raise BenchError(f"{cell}: {side} answers with errors: {r['error_samples']}")
    raw = {s: [] for s in sides}
    runs = {s: [] for s in sides}
    one = ["--connections", "1", "--requests", str(a.requests), "--warmup", str(a.warmup)]
    for r in range(a.rounds):
        order = sides[r % 3:] + sides[:r % 3]
        for side in order:
            f = b.work / f"raw-{side}.txt"
            runs[side].append(b.run(side, one, f))
            raw[side] += read_raw(f)
        print(f"  {cell}: round {r + 1}/{a.rounds} ({' → '.join(order)})", file=sys.stderr, flush=True)
    closed = {s: [] for s in sides}
    many = ["--connections", str(a.connections), "--seconds", str(a.seconds), "--warmup", str(a.connections * 10)]
    for r in range(a.closed_rounds):
        order = sides[r % 3:] + sides[:r % 3]
        for side in order:
            closed[side].append(b.run(side, many))
    summary = {s: lat_summary(raw[s]) for s in sides}
    out = {"sluice_step": CELLS[cell], "rounds": a.rounds, "requests_per_round": a.requests,
           "idle_cpu_ms_per_s": {"sluice": b.gw_idle_cpu_ms_per_s, "litellm": b.ll_idle_cpu_ms_per_s}}
    for side, name in (("gateway", "sluice"), ("litellm", "litellm")):
        cpu = sum(x["cpu_s"] for x in runs[side])
        sent = sum(x.get("sent_total", 0) for x in runs[side])
        ccpu = sum(x["cpu_s"] for x in closed[side])
        csent = sum(x.get("sent_total", 0) for x in closed[side])
        rc = [x["redis_calls_per_req"] for x in runs[side] if x["redis_calls_per_req"] is not None]
        out[name] = {
            **summary[side],
            "errors": sum(x["errors"] for x in runs[side]) + sum(x["errors"] for x in closed[side]),
            "added_p50_ms": round(summary[side]["p50_ms"] - summary["direct"]["p50_ms"], 3),
            "added_p99_ms": round(summary[side]["p99_ms"] - summary["direct"]["p99_ms"], 3),
            "cpu_us_per_req_1_client": round(cpu / sent * 1e6, 1) if sent else None,
            "closed_rps": round(statistics.fmean(x["rps"] for x in closed[side]), 1),
            "cpu_us_per_req_closed": round(ccpu / csent * 1e6, 1) if csent else None,
            "redis_calls_per_req": round(statistics.fmean(rc), 3) if rc else None,
        }
    out["direct"] = {**summary["direct"], "closed_rps": round(statistics.fmean(x["rps"] for x in closed["direct"]), 1)}
    s, l = out["sluice"], out["litellm"]
    out["litellm_over_sluice"] = {
        "added_p50": round(l["added_p50_ms"] / s["added_p50_ms"], 2) if s["added_p50_ms"] > 0 else None,
        "added_p99": round(l["added_p99_ms"] / s["added_p99_ms"], 2) if s["added_p99_ms"] > 0 else None,
        "cpu_per_req_1_client": round(l["cpu_us_per_req_1_client"] / s["cpu_us_per_req_1_client"], 2)
        if s["cpu_us_per_req_1_client"] else None,
        "cpu_per_req_closed": round(l["cpu_us_per_req_closed"] / s["cpu_us_per_req_closed"], 2)
        if s["cpu_us_per_req_closed"] else None,
        "closed_rps": round(l["closed_rps"] / s["closed_rps"], 3) if s["closed_rps"] else None,
    }
    out["runs"] = runs
    out["closed"] = closed
    b.stop_litellm()
    stop(b.gw)
    return out


def report(res: dict) -> None:
    print(f"\nSluice ({res['git']}) and LiteLLM {LITELLM_PIN}, {res['timestamp']}, load average "
          f"{res['conditions']['loadavg_before']} before / {res.get('loadavg_after')} after")
    head = ("cell", "figure", "Sluice", "LiteLLM", "LiteLLM ÷ Sluice")
    rows = []
    for cell, r in res.get("cells", {}).items():
        if "skipped" in r:
            rows.append((cell, "skipped", r["skipped"][:60], "", ""))
            continue
        s, l, q = r["sluice"], r["litellm"], r["litellm_over_sluice"]
        rows += [
            (cell, "1 client: added p50 (ms)", s["added_p50_ms"], l["added_p50_ms"], q["added_p50"]),
            (cell, "1 client: added p99 (ms)", s["added_p99_ms"], l["added_p99_ms"], q["added_p99"]),
            (cell, "1 client: CPU µs/request", s["cpu_us_per_req_1_client"], l["cpu_us_per_req_1_client"],
             q["cpu_per_req_1_client"]),
            (cell, f"{res['params']['connections']} connections: requests/s", s["closed_rps"], l["closed_rps"],
             q["closed_rps"]),
            (cell, f"{res['params']['connections']} connections: CPU µs/request", s["cpu_us_per_req_closed"],
             l["cpu_us_per_req_closed"], q["cpu_per_req_closed"]),
            # INFO commandstats counts the commands a Lua script runs too, and any process's
            # commands during the run (LiteLLM flushes its counters in the background).
            (cell, "Redis commands/request (incl. inside scripts)", s["redis_calls_per_req"],
             l["redis_calls_per_req"], ""),
            (cell, "errors", s["errors"], l["errors"], ""),
        ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="plain,governed")
    ap.add_argument("--rounds", type=int, default=6, help="one-client rounds per cell (each: every side once)")
    ap.add_argument("--requests", type=int, default=1000, help="measured requests per side per round")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--connections", type=int, default=16, help="connections of the closed-loop rate runs")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one closed-loop rate run")
    ap.add_argument("--closed-rounds", type=int, default=2)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--keep-dir", action="store_true")
    ap.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "litellm.json"))
    a = ap.parse_args()
    a.synchronous = "normal"
    cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    for c in cells:
        if c not in CELLS:
            ap.error(f"unknown cell {c!r}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))
    exe = ensure_litellm()
    b = Bench(a, exe)
    started = time.monotonic()
    res = {
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_rev(),
        "litellm": LITELLM_PIN,
        "conditions": {
            "cpus": os.cpu_count(), "cpu_model": cpu_model(), "kernel": platform.release(),
            "loadavg_before": " ".join(open("/proc/loadavg").read().split()[:3]),
            "pinning": {"gateway_and_litellm": " ".join(b.gw_pin) or None,
                        "mock_redis_loadgen": " ".join(b.side_pin) or None},
        },
        "params": {k: getattr(a, k) for k in ("rounds", "requests", "warmup", "connections", "seconds",
                                               "closed_rounds")},
        "cells": {},
    }
    try:
        b.start()
        b.redis_port = int(b.redis_url.rsplit(":", 1)[1]) if b.redis_url else None
        if not b.redis_port:
            print("warning: no redis-server: the governed cell runs without Redis on both sides", file=sys.stderr)
        for cell in cells:
            try:
                res["cells"][cell] = cell_run(b, cell, a)
            except BenchError as e:
                print(f"  {cell}: {e}", file=sys.stderr)
                res["cells"][cell] = {"skipped": str(e)}
                b.stop_litellm()
    finally:
        b.stop_litellm()
        b.close()
    res["loadavg_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
    res["duration_s"] = round(time.monotonic() - started, 1)
    report(res)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\n{res['duration_s']} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
