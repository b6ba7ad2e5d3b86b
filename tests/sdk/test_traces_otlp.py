"""OpenTelemetry traces (DESIGN.md "Traces"): the real binary exports OTLP/HTTP protobuf to
a receiver here, decoded with the official `opentelemetry-proto` package.

Its own gateways (not the session's): with `[tracing] otlp_endpoint` on the receiver, on
a silent collector, with `sample_ratio = 0`, and without (off). All on SQLite: traces touch
no store, so the PostgreSQL pass of the suite skips this file.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import DEFAULT_BIN, STORE, free_port, http_json, stop, wait_healthy

pytestmark = pytest.mark.skipif(STORE == "postgres", reason="traces touch no store: run on the SQLite pass")

KEY_A = "sk-trace-upstream-a-canary-1111"
KEY_B = "sk-trace-upstream-b-canary-2222"
# In every prompt: no span may carry it.
PROMPT = "zebra-canary-prompt-7731 what is the capital of France?"


class Receiver:
    """An OTLP/HTTP collector: every POST to /v1/traces decoded into its spans."""

    def __init__(self):
        self.spans: list[tuple[dict, Span]] = []  # (resource attributes, span)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with receiver.lock:
                        for rs in req.resource_spans:
                            res = attrs(rs.resource.attributes)
                            for ss in rs.scope_spans:
                                receiver.spans.extend((res, s) for s in ss.spans)
                self.send_response(200 if ok else 400)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str, want: int, timeout=15.0) -> list[Span]:
        """The spans of one trace, once at least `want` have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                got = [s for _, s in self.spans if s.trace_id.hex() == trace_id]
            if len(got) >= want or time.monotonic() > deadline:
                return got
            time.sleep(0.1)


def attrs(kvs) -> dict:
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


def config(gw: int, mock: int, workdir: Path, tracing: str) -> str:
    ups = []
    for uid, key in (("up-a", KEY_A), ("up-b", KEY_B)):
        ups.append(
            f'[[upstreams]]\nid = "{uid}"\nprovider = "openai"\n'
            f'base_url = "http://127.0.0.1:{mock}/v1"\napi_key = "{key}"\nallow_private_network = true\n'
        )
    return (
        f'[server]\nlisten = "127.0.0.1:{gw}"\n\n[database]\nurl = "sqlite://{workdir}/sluice.db"\n\n'
        f'[backup]\ndir = "{workdir}/backup"\n\n{tracing}\n' + "\n".join(ups) + """
[[models]]
name = "gpt-main"
routes = [{ upstream = "up-a", model = "gpt-4o-mini" }]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
fallbacks = ["gpt-backup"]

[[models]]
name = "gpt-backup"
routes = [{ upstream = "up-b", model = "gpt-4o" }]
input_usd_per_mtok = 1.0
output_usd_per_mtok = 2.0
"""
    )


class Gateway:
    def __init__(self, tmp: Path, tracing: str, env_extra: dict | None = None):
        self.bin = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
        self.gw, self.mock_port = free_port(), free_port()
        self.cfg = tmp / "sluice.toml"
        self.cfg.write_text(config(self.gw, self.mock_port, tmp, tracing))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "OTEL_")) or k == "SLUICE_BIN"}
        env.update(env_extra or {})
        self.log = tmp / "gateway.log"
        self.mock = subprocess.Popen(
            [str(self.bin), "mock", "--listen", f"127.0.0.1:{self.mock_port}"],
            stdout=open(tmp / "mock.log", "wb"), stderr=subprocess.STDOUT, env=env, cwd=tmp,
        )
        self.run("migrate", env=env)
        self.proc = subprocess.Popen(
            [str(self.bin), "--config", str(self.cfg), "serve"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"), env=env, cwd=tmp,
        )
        wait_healthy(f"http://127.0.0.1:{self.gw}/healthz", self.proc, self.log)
        info = json.loads(self.run("token", "issue", "--user", "alice", "--budget-usd", "5", "--json", env=env))
        self.token, self.token_id = info["token"], info["id"]
        deadline = time.monotonic() + 10
        while True:
            try:
                self.stats()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def run(self, *args, env) -> str:
        res = subprocess.run([str(self.bin), "--config", str(self.cfg), *args], capture_output=True,
                             text=True, timeout=60, env=env)
        assert res.returncode == 0, res.stderr
        return res.stdout

    def stats(self) -> dict:
        return http_json("GET", f"http://127.0.0.1:{self.mock_port}/_mock/stats")[1]["keys"]

    def script(self, key: str, responses: list) -> None:
        http_json("POST", f"http://127.0.0.1:{self.mock_port}/_mock/script", {"key": key, "responses": responses})

    def chat(self, traceparent: str | None, **extra) -> tuple[int, bytes]:
        body = {"model": "gpt-main", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 50, **extra}
        req = urllib.request.Request(f"http://127.0.0.1:{self.gw}/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST")
        req.add_header("content-type", "application/json")
        req.add_header("authorization", f"Bearer {self.token}")
        if traceparent is not None:
            req.add_header("traceparent", traceparent)
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.read()

    def stop(self):
        stop(self.proc)
        stop(self.mock)


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def traced(tmp_path_factory, receiver):
    g = Gateway(
        tmp_path_factory.mktemp("traces-on"),
        f'[tracing]\notlp_endpoint = "http://127.0.0.1:{receiver.port}"\nservice_name = "sluice-test"\n',
    )
    yield g
    g.stop()


def new_ids() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def request_span(spans: list[Span]) -> Span:
    servers = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    assert len(servers) == 1, [s.name for s in spans]
    return servers[0]


def children(spans: list[Span], parent: Span) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_span_id == parent.span_id:
            out.setdefault(s.name, []).append(s)
    return out


def no_secret_in(spans: list[Span], g: Gateway) -> None:
    for s in spans:
        for k, v in attrs(s.attributes).items():
            for secret in ("zebra-canary", g.token, KEY_A, KEY_B, "capital of France"):
                assert secret not in str(v), (s.name, k)


def sent_traceparent(g: Gateway, key: str) -> str | None:
    return g.stats()[key]["last_headers"][-1].get("traceparent")


def test_a_chat_is_one_request_span_under_the_clients_traceparent(traced, receiver):
    tid, parent = new_ids()
    status, _ = traced.chat(f"00-{tid}-{parent}-01")
    assert status == 200
    spans = receiver.trace(tid, 8)
    req = request_span(spans)
    assert req.parent_span_id.hex() == parent  # the client's span is its parent
    assert req.name == "chat gpt-main"
    a = attrs(req.attributes)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "gpt-main"
    assert a["gen_ai.response.model"] == "gpt-4o-mini"
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.system"] == "openai"
    assert a["gen_ai.usage.input_tokens"] == 12 and a["gen_ai.usage.output_tokens"] == 24
    assert a["gen_ai.request.max_tokens"] == 50
    assert a["server.address"] == "127.0.0.1"
    assert a["sluice.token_id"] == traced.token_id and isinstance(a["sluice.team_id"], int)
    assert a["sluice.cache"] == "off"  # not deterministic (no temperature 0): not cached
    assert a["sluice.cost_micros"] == 12 * 1 + 24 * 2
    assert a["http.response.status_code"] == 200
    kids = children(spans, req)
    for stage in ("auth", "window", "cache", "reserve", "queue", "upstream", "settle"):
        assert stage in kids, (stage, sorted(kids))
    (up,) = kids["upstream"]
    assert up.kind == Span.SPAN_KIND_CLIENT
    u = attrs(up.attributes)
    assert u["sluice.upstream"] == "up-a" and u["sluice.retry_tier"] == "served"
    assert u["http.response.status_code"] == 200 and u["server.address"] == "127.0.0.1"
    # The upstream saw the attempt span as its parent.
    assert sent_traceparent(traced, KEY_A) == f"00-{tid}-{up.span_id.hex()}-01"
    # Stages nest inside the request in time.
    for s in kids["auth"] + kids["upstream"]:
        assert req.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= req.end_time_unix_nano
    service = next(res for res, s in receiver.spans if s.span_id == req.span_id)["service.name"]
    assert service == "sluice-test"
    no_secret_in(spans, traced)


def test_a_stream_settles_under_its_request_span(traced, receiver):
    tid, parent = new_ids()
    status, body = traced.chat(f"00-{tid}-{parent}-01", stream=True, stream_options={"include_usage": True})
    assert status == 200 and b"[DONE]" in body
    spans = receiver.trace(tid, 8)
    req = request_span(spans)
    a = attrs(req.attributes)
    assert a["sluice.stream"] is True and a["gen_ai.usage.output_tokens"] == 24
    assert a["sluice.cost_micros"] == 60
    kids = children(spans, req)
    assert "settle" in kids and "upstream" in kids
    (up,) = kids["upstream"]
    assert sent_traceparent(traced, KEY_A) == f"00-{tid}-{up.span_id.hex()}-01"
    no_secret_in(spans, traced)


def test_a_failed_attempt_and_its_retry_are_two_upstream_spans(traced, receiver):
    traced.script(KEY_A, [{"status": 500}])
    tid, parent = new_ids()
    status, _ = traced.chat(f"00-{tid}-{parent}-01")
    assert status == 200
    spans = receiver.trace(tid, 9)
    req = request_span(spans)
    a = attrs(req.attributes)
    assert a["sluice.attempts"] == 2 and a["gen_ai.response.model"] == "gpt-4o"
    ups = {attrs(s.attributes)["sluice.upstream"]: s for s in children(spans, req)["upstream"]}
    assert set(ups) == {"up-a", "up-b"}
    failed, served = attrs(ups["up-a"].attributes), attrs(ups["up-b"].attributes)
    assert (failed["http.response.status_code"], failed["sluice.retry_tier"]) == (500, "server_error")
    assert ups["up-a"].status.code == ups["up-a"].status.STATUS_CODE_ERROR
    assert (served["http.response.status_code"], served["sluice.retry_tier"]) == (200, "served")
    # Each upstream saw its own attempt's span.
    assert sent_traceparent(traced, KEY_A) == f"00-{tid}-{ups['up-a'].span_id.hex()}-01"
    assert sent_traceparent(traced, KEY_B) == f"00-{tid}-{ups['up-b'].span_id.hex()}-01"
    no_secret_in(spans, traced)


def test_the_cache_outcome_is_recorded(traced, receiver):
    ids = []
    for _ in range(2):
        tid, parent = new_ids()
        ids.append(tid)
        assert traced.chat(f"00-{tid}-{parent}-01", temperature=0)[0] == 200
    first = request_span(receiver.trace(ids[0], 8))
    second_spans = receiver.trace(ids[1], 4)
    second = request_span(second_spans)
    assert attrs(first.attributes)["sluice.cache"] == "miss"
    assert attrs(second.attributes)["sluice.cache"] == "hit-exact"  # as the request log says
    (cache,) = children(second_spans, second)["cache"]
    assert attrs(cache.attributes)["sluice.cache"] == "hit"


@pytest.mark.parametrize("bad", ["00-zzzz-1234-01", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "garbage"])
def test_a_malformed_traceparent_starts_a_new_trace(traced, receiver, bad):
    before = time.time_ns()
    status, _ = traced.chat(bad)
    assert status == 200
    deadline = time.monotonic() + 15
    while True:
        with receiver.lock:
            roots = [s for _, s in receiver.spans
                     if s.kind == Span.SPAN_KIND_SERVER and s.start_time_unix_nano >= before]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(roots) == 1 and roots[0].parent_span_id == b""


def test_off_nothing_is_sent_and_no_traceparent_goes_upstream(tmp_path_factory, receiver):
    # Even the exporters' own variable does not turn it on: only `[tracing] otlp_endpoint`.
    g = Gateway(tmp_path_factory.mktemp("traces-off"), "",
                {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"})
    try:
        tid, parent = new_ids()
        assert g.chat(f"00-{tid}-{parent}-01")[0] == 200
        assert "traceparent" not in g.stats()[KEY_A]["last_headers"][-1]
        time.sleep(2.5)  # longer than the export interval
        with receiver.lock:
            assert not [s for _, s in receiver.spans if s.trace_id.hex() == tid]
    finally:
        g.stop()


def test_a_collector_that_never_answers_slows_no_request(tmp_path_factory):
    # It takes the connection and never answers: every export waits out its timeout.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    g = Gateway(tmp_path_factory.mktemp("traces-silent"),
                f'[tracing]\notlp_endpoint = "http://127.0.0.1:{silent.getsockname()[1]}"\n')
    try:
        slowest = 0.0
        for _ in range(20):
            started = time.monotonic()
            assert g.chat(None)[0] == 200
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < 1.0, slowest  # the export timeout is 5 s
        # The spans that could not be delivered are counted.
        deadline = time.monotonic() + 20
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{g.gw}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            dropped = [line for line in text.splitlines()
                       if line.startswith('gateway_trace_spans_dropped_total{reason="export_failed"}')]
            if dropped or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert dropped and float(dropped[0].split()[-1]) > 0, text[-2000:]
    finally:
        g.stop()
        silent.close()


def test_sample_ratio_zero_keeps_only_the_traces_a_client_sampled(tmp_path_factory, receiver):
    g = Gateway(tmp_path_factory.mktemp("traces-ratio0"),
                f'[tracing]\notlp_endpoint = "http://127.0.0.1:{receiver.port}"\nsample_ratio = 0.0\n')
    try:
        # A new trace: not kept, nothing built, nothing sent upstream.
        before = time.time_ns()
        assert g.chat(None)[0] == 200
        assert "traceparent" not in g.stats()[KEY_A]["last_headers"][-1]
        unsampled, _ = new_ids()
        assert g.chat(f"00-{unsampled}-{secrets.token_hex(8)}-00")[0] == 200
        # The client's sampled flag decides for its own trace (parent-based sampling).
        tid, parent = new_ids()
        assert g.chat(f"00-{tid}-{parent}-01")[0] == 200
        req = request_span(receiver.trace(tid, 8))
        assert req.parent_span_id.hex() == parent
        time.sleep(1.5)
        with receiver.lock:
            mine = [s for res, s in receiver.spans if s.start_time_unix_nano >= before
                    and s.trace_id.hex() != tid and res.get("service.name") == "sluice"]
        assert mine == [], [s.name for s in mine]
    finally:
        g.stop()
