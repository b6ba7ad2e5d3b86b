#!/usr/bin/env python3
"""Streaming through the gateway at 1 000 concurrent streams — a benchmark, not a test.

The mock streams its answer one chunk every `--gap-ms` (default 100 ms). N clients
(default 1 000) open a stream each, first straight to the mock, then through the gateway
(same request, alternating rounds), and record when every chunk arrives. Reports:
time to first token (p50/p99) and inter-chunk gap (p99) for both sides and what the
gateway adds; whether every stream through the gateway delivered exactly the chunks the
mock sent (none lost, none merged); the gateway's RSS idle, with the streams open, and
after. Uses asyncio (one socket per stream), the standard library only.

Usage: cargo build --release && python3 bench/streams.py [--streams 1000] [--gap-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import DEFAULT_BIN, pct  # noqa: E402
from scenarios import KEYS, Stack  # noqa: E402


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def one_stream(port: int, key: str, body: bytes) -> tuple[float, list[float], list[str]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
    )
    await writer.drain()
    times, events, buf = [], [], b""
    header_done = False
    while True:
        data = await reader.read(65536)
        if not data:
            break
        now = time.perf_counter() - start
        buf += data
        if not header_done:
            if b"\r\n\r\n" not in buf:
                continue
            buf = buf.split(b"\r\n\r\n", 1)[1]
            header_done = True
        # Chunked transfer encoding: strip size lines, keep SSE events.
        while b"data: " in buf and b"\n\n" in buf[buf.index(b"data: "):]:
            i = buf.index(b"data: ")
            j = buf.index(b"\n\n", i)
            events.append(buf[i + 6:j].decode(errors="replace"))
            times.append(now)
            buf = buf[j + 2:]
    writer.close()
    return (times[0] if times else float("inf")), times, events


def content_of(events: list[str]) -> list[str]:
    out = []
    for e in events:
        if e == "[DONE]":
            out.append("[DONE]")
            continue
        try:
            v = json.loads(e)
        except ValueError:
            out.append("<bad>")
            continue
        for c in v.get("choices", []):
            t = (c.get("delta") or {}).get("content")
            if t:
                out.append(t)
    return out


async def round_of(port: int, key: str, n: int) -> list[tuple[float, list[float], list[str]]]:
    body = json.dumps({"model": "gpt-4o-mini", "stream": True, "max_tokens": 100,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return await asyncio.gather(*(one_stream(port, key, body) for _ in range(n)))


def summarise(results) -> dict:
    ttft = sorted(r[0] for r in results)
    gaps = sorted(b - a for r in results for a, b in zip(r[1], r[1][1:]))
    return {"ttft_p50_ms": round(pct(ttft, 50) * 1000, 3), "ttft_p99_ms": round(pct(ttft, 99) * 1000, 3),
            "gap_p50_ms": round(pct(gaps, 50) * 1000, 3), "gap_p99_ms": round(pct(gaps, 99) * 1000, 3)}


async def main_async(args) -> dict:
    binary = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
    s = Stack(binary)
    try:
        token = s.token()
        s.mock_call("POST", "/_mock/sticky", {"key": "*", "response": {"chunk_delay_ms": args.gap_ms}})
        for k in KEYS:
            s.mock_call("POST", "/_mock/sticky", {"key": k, "response": {"chunk_delay_ms": args.gap_ms}})
        await round_of(s.gw_port, token, 20)  # warm-up
        idle = rss_kb(s.gw.pid)
        direct = await round_of(s.mock_port, KEYS[0], args.streams)
        peak = [0]

        async def sample():
            while True:
                peak[0] = max(peak[0], rss_kb(s.gw.pid))
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        through = await round_of(s.gw_port, token, args.streams)
        sampler.cancel()
        await asyncio.sleep(1.0)
        after = rss_kb(s.gw.pid)
        expected = content_of(direct[0][2])
        intact = sum(content_of(r[2]) == expected for r in through)
        d, g = summarise(direct), summarise(through)
        return {
            "streams": args.streams, "chunk_gap_ms": args.gap_ms, "chunks_per_stream": len(expected),
            "direct": d, "gateway": g,
            "added": {k: round(g[k] - d[k], 3) for k in d},
            "streams_intact": intact,
            "rss_kb": {"idle": idle, "peak_with_streams_open": peak[0], "after": after,
                       "per_1000_streams": round((peak[0] - idle) * 1000 / args.streams)},
        }
    finally:
        s.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--gap-ms", type=int, default=100)
    args = ap.parse_args()
    result = asyncio.run(main_async(args))
    out = Path(__file__).resolve().parent / "results" / "streams.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
