#!/usr/bin/env python3
"""Defence scenarios — benchmarks, never tests: they report figures and assert nothing.

1. **429 storm**: a model served by 3 upstream keys of which 2 answer 429 to everything.
   Reports the share of client requests that succeed and the latency added over a direct
   call, against the same gateway with 3 healthy keys.
2. **Batch fault**: 30 engineers ask the same question about 30 different vehicles
   (different VINs and timestamps) at temperature 0. Reports how many were answered from
   the cache (`x-sluice-cache: hit-*`) and how many reached the upstream — by default
   (identifiers significant: each VIN is its own question) and with the opt-in
   `[cache] ignore_identifiers = true`.
3. **Window cost**: a token with an RPM limit, with the window in Redis (one EVALSHA per
   request) and in process, against a token without limits — the added latency, in
   alternating rounds of both tokens.

Usage: `cargo build --release && python3 bench/scenarios.py` (SLUICE_BIN=... for another
binary). Needs `redis-server` for scenario 3 (skipped without it). Writes
bench/results/scenarios.json.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import DEFAULT_BIN, free_port, pct, stop, wait_http  # noqa: E402

KEYS = ["sk-storm-key-a-0001", "sk-storm-key-b-0002", "sk-storm-key-c-0003"]


def config(gw_port: int, mock_port: int, db: Path, redis_url: str | None, extra: str = "") -> str:
    ups = "".join(
        f'[[upstreams]]\nid = "k{i}"\nprovider = "openai"\nbase_url = "http://127.0.0.1:{mock_port}/v1"\n'
        f'api_key = "{k}"\nallow_private_network = true\n\n'
        for i, k in enumerate(KEYS)
    )
    routes = ", ".join(f'{{ upstream = "k{i}", model = "gpt-4o-mini" }}' for i in range(len(KEYS)))
    redis = f'[redis]\nurl = "{redis_url}"\n\n' if redis_url else ""
    return (
        f'[server]\nlisten = "127.0.0.1:{gw_port}"\n\n[database]\nurl = "sqlite://{db}"\n\n{redis}'
        f"[retry]\nmax_cooldown_seconds = 1\n\n"
        # The admission gate is opened wide: these scenarios measure the other defences.
        f"[queue]\nmax_in_flight = 4096\nmax_depth = 4096\n\n{extra}{ups}"
        f'[[models]]\nname = "gpt-4o-mini"\nroutes = [{routes}]\ninput_usd_per_mtok = 0.15\noutput_usd_per_mtok = 0.60\n'
    )


class Stack:
    def __init__(self, binary: Path, redis_url: str | None = None, extra: str = ""):
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-scen-"))
        self.bin = binary
        self.mock_port, self.gw_port = free_port(), free_port()
        self.cfg = self.dir / "sluice.toml"
        self.cfg.write_text(config(self.gw_port, self.mock_port, self.dir / "s.db", redis_url, extra))
        self.mock = subprocess.Popen([str(binary), "mock", "--listen", f"127.0.0.1:{self.mock_port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.gw = subprocess.Popen([str(binary), "--config", str(self.cfg), "serve"],
                                   stdout=subprocess.DEVNULL, stderr=open(self.dir / "gw.log", "wb"),
                                   env={**os.environ, "SLUICE_LOG": "warn"})
        wait_http(f"http://127.0.0.1:{self.gw_port}/healthz", self.gw)

    def cli(self, *args: str) -> str:
        return subprocess.run([str(self.bin), "--config", str(self.cfg), *args], check=True,
                              capture_output=True, text=True).stdout

    def token(self, *extra: str) -> str:
        return json.loads(self.cli("token", "issue", "--user", f"u{time.time_ns()}", "--json", *extra))["token"]

    def mock_call(self, method: str, path: str, body=None) -> dict:
        c = http.client.HTTPConnection("127.0.0.1", self.mock_port, timeout=10)
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return json.loads(data) if data else {}

    def close(self):
        stop(self.gw)
        stop(self.mock)
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(conn: http.client.HTTPConnection, path: str, body: dict, headers: dict) -> tuple[int, float, dict]:
    t = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json", **headers})
    r = conn.getresponse()
    r.read()
    return r.status, time.perf_counter() - t, dict(r.getheaders())


def run_requests(port: int, token: str, n: int, body_of) -> tuple[list[int], list[float], list[dict]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    statuses, lats, heads = [], [], []
    for i in range(n):
        s, lat, h = timed(conn, "/v1/chat/completions", body_of(i), {"authorization": f"Bearer {token}"})
        statuses.append(s)
        lats.append(lat)
        heads.append(h)
    conn.close()
    return statuses, lats, heads


def direct_latency(stack: Stack, n: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.mock_port, timeout=30)
    body = {"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    lats = [timed(conn, "/v1/chat/completions", body, {"authorization": f"Bearer {KEYS[2]}"})[1] for _ in range(n)]
    conn.close()
    return sorted(lats)


def ms(v: float) -> float:
    return round(v * 1000, 3)


def storm(binary: Path, n: int) -> dict:
    out = {}
    for label, storming in (("healthy", False), ("storm", True)):
        s = Stack(binary)
        try:
            if storming:
                for k in KEYS[:2]:
                    s.mock_call("POST", "/_mock/sticky", {"key": k, "response": {"status": 429, "headers": [["Retry-After", "1"]]}})
            token = s.token()
            direct = direct_latency(s, 200)
            body = {"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
            statuses, lats, _ = run_requests(s.gw_port, token, n, lambda i: body)
            lats.sort()
            stats = s.mock_call("GET", "/_mock/stats")["keys"]
            out[label] = {
                "requests": n,
                "succeeded_share": round(statuses.count(200) / n, 4),
                "gateway_p50_ms": ms(pct(lats, 50)), "gateway_p99_ms": ms(pct(lats, 99)),
                "direct_p50_ms": ms(pct(direct, 50)), "direct_p99_ms": ms(pct(direct, 99)),
                "added_p50_ms": ms(pct(lats, 50) - pct(direct, 50)), "added_p99_ms": ms(pct(lats, 99) - pct(direct, 99)),
                "upstream_attempts": {k: v["count"] for k, v in stats.items()},
                # The same, less the direct calls (made with the third key).
                "gateway_attempts": {k: v["count"] - (200 if k == KEYS[2] else 0) for k, v in stats.items()},
            }
        finally:
            s.close()
    return out


def batch_fault(binary: Path, ignore_identifiers: bool) -> dict:
    s = Stack(binary, extra="[cache]\nignore_identifiers = true\n\n" if ignore_identifiers else "")
    try:
        token = s.token()

        def body(i: int) -> dict:
            vin = f"WVWZZZ1JZXW{100000 + i * 7919:06d}"
            when = f"2026-11-{1 + i % 28:02d}T0{i % 10}:1{i % 6}:00"
            return {"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 200, "messages": [
                {"role": "system", "content": "You are the diagnostic assistant of a vehicle fleet."},
                {"role": "user", "content": f"Vehicle {vin} reported fault P0401 (EGR flow insufficient) at {when}. What should the workshop check first?"}]}

        conn = http.client.HTTPConnection("127.0.0.1", s.gw_port, timeout=30)
        lats, heads = [], []
        for i in range(30):
            _, la, he = timed(conn, "/v1/chat/completions", body(i), {"authorization": f"Bearer {token}"})
            lats.append(la)
            heads.append(he)
            if i == 0:
                time.sleep(0.2)  # the first answer is stored off the request path
        conn.close()
        kinds = [h.get("x-sluice-cache", "?") for h in heads]
        upstream = sum(v["count"] for v in s.mock_call("GET", "/_mock/stats")["keys"].values())
        # Requests 2..30, split by how they were answered (the first is always a miss).
        hits = sorted(la for la, k in zip(lats[1:], kinds[1:]) if k.startswith("hit"))
        misses = sorted(la for la, k in zip(lats[1:], kinds[1:]) if not k.startswith("hit"))
        return {"requests": 30, "from_cache": sum(k.startswith("hit") for k in kinds),
                "hit_exact": kinds.count("hit-exact"), "hit_semantic": kinds.count("hit-semantic"),
                "upstream_calls": upstream,
                "hit_p50_ms": ms(pct(hits, 50)) if hits else None,
                "miss_p50_ms": ms(pct(misses, 50)) if misses else None}
    finally:
        s.close()


def window_cost(binary: Path, n: int, rounds: int = 10) -> dict | None:
    if not shutil.which("redis-server"):
        return None
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL)
    time.sleep(0.3)
    out = {}
    try:
        for label, url in (("local", None), ("redis", f"redis://127.0.0.1:{port}/0")):
            s = Stack(binary, url)
            try:
                body = {"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
                free = s.token()
                limited = s.token("--rpm", "1000000", "--tpm", "1000000000")
                run_requests(s.gw_port, free, 200, lambda i: body)  # warm-up
                run_requests(s.gw_port, limited, 50, lambda i: body)
                # Alternating rounds (the side that goes first alternates too), pooled: drift
                # on a shared machine hits both alike.
                a, b = [], []
                for r in range(rounds):
                    for tok, into in ((free, a), (limited, b)) if r % 2 == 0 else ((limited, b), (free, a)):
                        into += run_requests(s.gw_port, tok, n // rounds, lambda i: body)[1]
                a.sort()
                b.sort()
                out[label] = {"rounds": rounds, "requests_per_side": len(a),
                              "no_limit_p50_ms": ms(pct(a, 50)), "with_window_p50_ms": ms(pct(b, 50)),
                              "added_p50_ms": ms(pct(b, 50) - pct(a, 50)),
                              "no_limit_p99_ms": ms(pct(a, 99)), "with_window_p99_ms": ms(pct(b, 99))}
            finally:
                s.close()
    finally:
        stop(redis)
    return out


def main() -> int:
    binary = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
    if not binary.is_file():
        print(f"no binary at {binary}; run cargo build --release", file=sys.stderr)
        return 2
    results = {"storm": storm(binary, 400), "batch_fault": batch_fault(binary, False),
               "batch_fault_ignoring_identifiers": batch_fault(binary, True), "window_cost": window_cost(binary, 1000)}
    out = Path(__file__).resolve().parent / "results" / "scenarios.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
