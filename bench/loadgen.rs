//! A small HTTP/1.1 load generator for `bench/overhead.py` (issue 10): hyper's low-level
//! client on one current-thread runtime, keep-alive connections with `TCP_NODELAY`, exact
//! percentiles. Pin it (`taskset -c 1`) so that it competes with one known process.
//!
//!     cargo build --release --example loadgen
//!     loadgen --url http://127.0.0.1:8080/v1/chat/completions --header 'authorization: Bearer T' \
//!             --body-file body.json --connections 1 --requests 2000 --warmup 200
//!
//! Modes
//! - closed loop (default): `--connections N` keep-alive connections, each sends its next
//!   request when the previous answer is fully read; `--requests R` in all or `--seconds S`.
//! - open loop (`--rate RPS`): requests are scheduled every 1/RPS (by a timer thread, not
//!   tokio's 1 ms wheel) whatever the answers, and each goes to an idle connection of the
//!   pool of N; when none is idle it waits. Latency counts from the *scheduled* time
//!   (no coordinated omission); `service_*` fields count from the actual send.
//! - streams (`--stream --streams N --ramp-ms M [--expect-chunks K]`): N streams, each on a
//!   connection of its own, started evenly over M ms; `"stream": true` is set in the body.
//!   Records the time to the first `data:` event with content (TTFT), every gap between
//!   content events, the content events per stream and whether `data: [DONE]` arrived.
//!
//! `--unique` replaces every `{n}` in the body with a number unique to the request (and to
//! the run: it starts at the microseconds since the epoch, mod 10^10), so a response cache
//! misses.
//! Any status other than 200, a transport error, a timeout or a body shorter than
//! `--min-body-bytes` is an error (counted; up to 5 samples kept). A broken connection is
//! reopened. One JSON object on stdout at the end; human text on stderr.
//! A benchmark tool, not a test: it asserts nothing.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

type Conn = SendRequest<Full<Bytes>>;

#[derive(Parser, Debug)]
#[command(
    about = "HTTP/1.1 load generator for bench/overhead.py (closed loop, open loop, SSE streams)"
)]
struct Args {
    /// http://host:port/path (plain HTTP only)
    #[arg(long)]
    url: String,
    /// Extra request header `name: value` (repeatable)
    #[arg(long = "header")]
    headers: Vec<String>,
    /// Request body (POSTed as application/json)
    #[arg(long)]
    body_file: PathBuf,
    /// Keep-alive connections (closed and open loop)
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Measured requests (closed loop: in all; open loop: scheduled)
    #[arg(long)]
    requests: Option<u64>,
    /// Measured duration in seconds (instead of --requests)
    #[arg(long)]
    seconds: Option<f64>,
    /// Closed-loop requests sent first and not measured
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Open loop: requests per second, scheduled at fixed intervals
    #[arg(long)]
    rate: Option<f64>,
    /// Replace `{n}` in the body by a per-request counter
    #[arg(long)]
    unique: bool,
    /// Start that counter here (default: from the clock): a run given another's base sends
    /// the same bodies again, as repeated questions
    #[arg(long)]
    unique_base: Option<u64>,
    /// SSE stream mode
    #[arg(long)]
    stream: bool,
    /// Stream mode: concurrent streams, one connection each
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Stream mode: start the streams evenly over this many milliseconds
    #[arg(long, default_value_t = 0)]
    ramp_ms: u64,
    /// Stream mode: content events each stream must carry (others are counted as mismatched)
    #[arg(long)]
    expect_chunks: Option<usize>,
    /// Per-request timeout (stream mode: longest silence between two reads), seconds
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// A 200 answer shorter than this is an error
    #[arg(long, default_value_t = 1)]
    min_body_bytes: usize,
    /// Also write every measured latency (µs, one a line) to this file, for pooling runs
    #[arg(long)]
    raw_out: Option<PathBuf>,
}

/// Where and what to send.
struct Target {
    addr: String,
    authority: String,
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The body split at every `{n}` (one part when not unique).
    parts: Vec<Bytes>,
    unique_base: u64,
    timeout: Duration,
    min_body: usize,
}

impl Target {
    fn new(a: &Args, body: Vec<u8>) -> Result<Target> {
        let uri: Uri = a.url.parse().context("--url")?;
        if uri.scheme_str() != Some("http") {
            bail!("--url must be http://host:port/path");
        }
        let host = uri.host().ok_or_else(|| anyhow!("--url has no host"))?;
        let port = uri.port_u16().unwrap_or(80);
        let mut headers = Vec::new();
        for h in &a.headers {
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| anyhow!("--header {h:?}: expected `name: value`"))?;
            headers.push((
                HeaderName::from_bytes(k.trim().as_bytes())?,
                HeaderValue::from_str(v.trim())?,
            ));
        }
        let parts = if a.unique {
            let text = String::from_utf8(body).context("--unique needs a UTF-8 body")?;
            if !text.contains("{n}") {
                eprintln!("loadgen: --unique but the body has no {{n}}");
            }
            text.split("{n}")
                .map(|p| Bytes::from(p.to_string()))
                .collect()
        } else {
            vec![Bytes::from(body)]
        };
        Ok(Target {
            addr: format!("{host}:{port}"),
            authority: match uri.port_u16() {
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            },
            path: uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/".into()),
            headers,
            parts,
            // Microseconds since the epoch, last 10 digits: unique across the runs of a
            // few hours, and short enough to keep the body small.
            unique_base: a.unique_base.unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| (d.as_micros() % 10_000_000_000) as u64)
                    .unwrap_or(0)
            }),
            timeout: Duration::from_secs_f64(a.timeout),
            min_body: a.min_body_bytes,
        })
    }

    fn body(&self, n: u64) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts[0].clone();
        }
        let num = (self.unique_base + n).to_string();
        let mut out = Vec::with_capacity(self.parts.iter().map(Bytes::len).sum::<usize>() + 24);
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(num.as_bytes());
            }
            out.extend_from_slice(p);
        }
        Bytes::from(out)
    }

    fn request(&self, n: u64) -> Request<Full<Bytes>> {
        let mut b = Request::post(self.path.as_str())
            .header(hyper::header::HOST, self.authority.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (k, v) in &self.headers {
            b = b.header(k, v);
        }
        b.body(Full::new(self.body(n))).expect("a valid request")
    }

    async fn connect(&self) -> Result<Conn> {
        let tcp = TcpStream::connect(&self.addr)
            .await
            .with_context(|| format!("connect {}", self.addr))?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// Why a request failed. `Transport` means the connection must be reopened.
enum Fail {
    Status(String),
    Transport(String),
}

/// One request on `conn`, answer read to the end. Ok(bytes) or why not.
async fn one(t: &Target, conn: &mut Conn, n: u64) -> Result<usize, Fail> {
    let go = async {
        let resp = conn
            .send_request(t.request(n))
            .await
            .map_err(|e| Fail::Transport(format!("send: {e}")))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Fail::Transport(format!("body: {e}")))?
            .to_bytes();
        if status != hyper::StatusCode::OK {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            return Err(Fail::Status(format!("HTTP {}: {text}", status.as_u16())));
        }
        if body.len() < t.min_body {
            return Err(Fail::Status(format!("short body: {} bytes", body.len())));
        }
        Ok(body.len())
    };
    match tokio::time::timeout(t.timeout, go).await {
        Ok(r) => r,
        Err(_) => Err(Fail::Transport(format!("timeout after {:?}", t.timeout))),
    }
}

/// Makes sure `conn` holds a connection ready to send (reopening it when it was closed:
/// not an error — a server may close an idle keep-alive connection). Ok(true) when it
/// had to reopen one that existed before.
async fn ensure(t: &Target, conn: &mut Option<Conn>) -> Result<bool> {
    let existed = conn.is_some();
    if let Some(c) = conn.as_mut() {
        if !c.is_closed() && c.ready().await.is_ok() {
            return Ok(false);
        }
    }
    *conn = None;
    let mut c = tokio::time::timeout(t.timeout, t.connect())
        .await
        .map_err(|_| anyhow!("connect timeout"))??;
    c.ready().await?;
    *conn = Some(c);
    Ok(existed)
}

#[derive(Default)]
struct Tally {
    lat_us: Vec<u64>,
    service_us: Vec<u64>,
    errors: u64,
    samples: Vec<String>,
    reconnects: u64,
    bytes: u64,
    /// Next request number (also the `{n}` counter).
    next: u64,
    last_done: Option<Instant>,
    dropped: u64,
}

impl Tally {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.samples.len() < 5 {
            self.samples.push(what);
        }
    }
}

/// Closed loop on one connection, until `limit` requests were taken (all connections
/// together) or `deadline`. Latencies are kept only when `record`; errors always.
async fn closed_worker(
    t: Rc<Target>,
    tally: Rc<RefCell<Tally>>,
    mut conn: Option<Conn>,
    limit: Option<u64>,
    deadline: Option<Instant>,
    record: bool,
) -> Option<Conn> {
    loop {
        let n = {
            let mut s = tally.borrow_mut();
            if limit.is_some_and(|l| s.next >= l) || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            s.next += 1;
            s.next - 1
        };
        match ensure(&t, &mut conn).await {
            Ok(reopened) => tally.borrow_mut().reconnects += reopened as u64,
            Err(e) => {
                tally.borrow_mut().error(format!("connect: {e:#}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let c = conn.as_mut().expect("ensured");
        let start = Instant::now();
        let r = one(&t, c, n).await;
        let end = Instant::now();
        let mut s = tally.borrow_mut();
        match r {
            Ok(len) => {
                if record {
                    s.lat_us.push((end - start).as_micros() as u64);
                    s.bytes += len as u64;
                    s.last_done = Some(end);
                }
            }
            Err(Fail::Status(e)) => s.error(e),
            Err(Fail::Transport(e)) => {
                s.error(e);
                conn = None;
            }
        }
    }
    conn
}

/// Open loop on one connection: takes the next scheduled request when idle.
async fn open_worker(
    t: Rc<Target>,
    tally: Rc<RefCell<Tally>>,
    rx: Rc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<(u64, Instant)>>>,
    mut conn: Option<Conn>,
    drain_deadline: Instant,
) {
    loop {
        let job = {
            let mut r = rx.lock().await;
            r.recv().await
        };
        let Some((n, scheduled)) = job else { break };
        if Instant::now() > drain_deadline {
            tally.borrow_mut().dropped += 1;
            continue;
        }
        match ensure(&t, &mut conn).await {
            Ok(reopened) => tally.borrow_mut().reconnects += reopened as u64,
            Err(e) => {
                tally.borrow_mut().error(format!("connect: {e:#}"));
                continue;
            }
        }
        let c = conn.as_mut().expect("ensured");
        let sent = Instant::now();
        let r = one(&t, c, n).await;
        let end = Instant::now();
        let mut s = tally.borrow_mut();
        s.last_done = Some(end);
        match r {
            Ok(len) => {
                s.lat_us
                    .push(end.saturating_duration_since(scheduled).as_micros() as u64);
                s.service_us.push((end - sent).as_micros() as u64);
                s.bytes += len as u64;
            }
            Err(Fail::Status(e)) => s.error(e),
            Err(Fail::Transport(e)) => {
                s.error(e);
                conn = None;
            }
        }
    }
}

/// Exact percentile of sorted values (nearest rank).
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn lat_fields(prefix: &str, v: &mut [u64], out: &mut serde_json::Map<String, Value>) {
    v.sort_unstable();
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };
    out.insert(
        format!("{prefix}mean_us"),
        json!((mean * 10.0).round() / 10.0),
    );
    for (name, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)] {
        out.insert(format!("{prefix}{name}_us"), json!(pct(v, p)));
    }
    out.insert(
        format!("{prefix}max_us"),
        json!(v.last().copied().unwrap_or(0)),
    );
}

/// Opens `n` connections (errors are counted, the slot stays empty and is retried later).
async fn open_pool(t: &Target, n: usize, tally: &RefCell<Tally>) -> Vec<Option<Conn>> {
    let mut pool = Vec::with_capacity(n);
    for _ in 0..n {
        match t.connect().await {
            Ok(c) => pool.push(Some(c)),
            Err(e) => {
                tally.borrow_mut().error(format!("connect: {e:#}"));
                pool.push(None);
            }
        }
    }
    pool
}

async fn run_load(a: &Args, t: Rc<Target>) -> Result<Value> {
    if a.requests.is_none() && a.seconds.is_none() {
        bail!("give --requests or --seconds");
    }
    let n_conns = a.connections.max(1);
    let tally = Rc::new(RefCell::new(Tally::default()));
    let mut pool = open_pool(&t, n_conns, &tally).await;
    // Warm-up: closed loop, not measured.
    if a.warmup > 0 {
        let ws = pool
            .drain(..)
            .map(|c| closed_worker(t.clone(), tally.clone(), c, Some(a.warmup), None, false));
        pool = futures_util::future::join_all(ws).await;
        eprintln!("loadgen: {} warm-up requests done", a.warmup);
    }
    let warm_errors = {
        let mut s = tally.borrow_mut();
        let e = s.errors;
        s.errors = 0;
        s.samples.clear();
        e
    };
    let first = tally.borrow().next;
    let start = Instant::now();
    let mut out = serde_json::Map::new();
    match a.rate {
        None => {
            let limit = a.requests.map(|r| first + r);
            let deadline = a.seconds.map(|s| start + Duration::from_secs_f64(s));
            let ws = pool
                .drain(..)
                .map(|c| closed_worker(t.clone(), tally.clone(), c, limit, deadline, true));
            futures_util::future::join_all(ws).await;
            out.insert("mode".into(), json!("closed"));
        }
        Some(rate) => {
            if rate <= 0.0 {
                bail!("--rate must be positive");
            }
            let total = a
                .requests
                .unwrap_or_else(|| (rate * a.seconds.unwrap_or(0.0)).round() as u64);
            let planned = Duration::from_secs_f64(total as f64 / rate);
            let drain_deadline = start + planned + planned.max(Duration::from_secs(5));
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let interval = Duration::from_secs_f64(1.0 / rate);
            // The schedule runs on a thread of its own: tokio's timer wheel has a 1 ms
            // granularity, a thread's sleep has tens of microseconds.
            let sched = std::thread::spawn(move || {
                for k in 0..total {
                    let at = start + interval.mul_f64(k as f64);
                    let now = Instant::now();
                    if at > now + Duration::from_micros(20) {
                        std::thread::sleep(at - now);
                    }
                    if tx.send((first + k, at)).is_err() {
                        break;
                    }
                }
            });
            let rx = Rc::new(tokio::sync::Mutex::new(rx));
            let ws = pool
                .drain(..)
                .map(|c| open_worker(t.clone(), tally.clone(), rx.clone(), c, drain_deadline));
            futures_util::future::join_all(ws).await;
            let _ = sched.join();
            tally.borrow_mut().next = first + total;
            out.insert("mode".into(), json!("open"));
            out.insert("target_rps".into(), json!(rate));
            out.insert("scheduled".into(), json!(total));
        }
    }
    let mut s = tally.borrow_mut();
    let end = s.last_done.unwrap_or_else(Instant::now).max(start);
    let wall = (end - start).as_secs_f64();
    if s.dropped > 0 {
        let d = s.dropped;
        s.errors += d;
        if s.samples.len() < 5 {
            s.samples.push(format!(
                "{d} scheduled requests dropped: still queued after the drain deadline"
            ));
        }
    }
    let n = s.lat_us.len() as u64;
    out.insert("requests".into(), json!(n));
    out.insert("errors".into(), json!(s.errors));
    out.insert("error_samples".into(), json!(s.samples));
    out.insert("wall_s".into(), json!((wall * 1e4).round() / 1e4));
    let rps = if wall > 0.0 { n as f64 / wall } else { 0.0 };
    out.insert("rps".into(), json!((rps * 10.0).round() / 10.0));
    let mut lat = std::mem::take(&mut s.lat_us);
    if let Some(path) = &a.raw_out {
        let text: String = lat.iter().map(|v| format!("{v}\n")).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    lat_fields("", &mut lat, &mut out);
    if a.rate.is_some() {
        let mut svc = std::mem::take(&mut s.service_us);
        lat_fields("service_", &mut svc, &mut out);
    }
    out.insert("connections".into(), json!(n_conns));
    out.insert("warmup".into(), json!(a.warmup));
    out.insert("warmup_errors".into(), json!(warm_errors));
    out.insert("sent_total".into(), json!(s.next));
    out.insert("reconnects".into(), json!(s.reconnects));
    out.insert(
        "mean_body_bytes".into(),
        json!(s.bytes.checked_div(n).unwrap_or(0)),
    );
    Ok(Value::Object(out))
}

/// What one stream saw.
#[derive(Default)]
struct StreamSeen {
    ttft_us: Option<u64>,
    gaps_us: Vec<u64>,
    content_events: usize,
    done: bool,
    error: Option<String>,
}

/// Whether an SSE `data:` payload carries content (OpenAI chat/completions or Anthropic).
fn has_content(data: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return false;
    };
    let nonempty = |x: Option<&Value>| x.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    if let Some(c) = v.pointer("/choices/0") {
        return nonempty(c.pointer("/delta/content")) || nonempty(c.get("text"));
    }
    nonempty(v.pointer("/delta/text"))
}

async fn one_stream(t: &Target, n: u64) -> StreamSeen {
    let mut seen = StreamSeen::default();
    let mut conn = match tokio::time::timeout(t.timeout, t.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            seen.error = Some(format!("connect: {e:#}"));
            return seen;
        }
        Err(_) => {
            seen.error = Some("connect timeout".into());
            return seen;
        }
    };
    if let Err(e) = conn.ready().await {
        seen.error = Some(format!("ready: {e}"));
        return seen;
    }
    let sent = Instant::now();
    let resp = match tokio::time::timeout(t.timeout, conn.send_request(t.request(n))).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            seen.error = Some(format!("send: {e}"));
            return seen;
        }
        Err(_) => {
            seen.error = Some("timeout waiting for the response head".into());
            return seen;
        }
    };
    let status = resp.status();
    let mut body = resp.into_body();
    if status != hyper::StatusCode::OK {
        let text = match tokio::time::timeout(t.timeout, body.collect()).await {
            Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes())
                .chars()
                .take(200)
                .collect(),
            _ => String::new(),
        };
        seen.error = Some(format!("HTTP {}: {text}", status.as_u16()));
        return seen;
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut data: Vec<String> = Vec::new();
    let mut last: Option<Instant> = None;
    loop {
        let frame = match tokio::time::timeout(t.timeout, body.frame()).await {
            Err(_) => {
                seen.error = Some(format!("silent for {:?}", t.timeout));
                return seen;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                seen.error = Some(format!("body: {e}"));
                return seen;
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(bytes) = frame.into_data() else {
            continue;
        };
        let now = Instant::now();
        buf.extend_from_slice(&bytes);
        // Whole lines only; a blank line ends an event.
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
            } else if line.is_empty() && !data.is_empty() {
                let payload = data.join("\n");
                data.clear();
                if payload == "[DONE]" {
                    seen.done = true;
                } else if has_content(&payload) {
                    seen.content_events += 1;
                    match last {
                        None => seen.ttft_us = Some((now - sent).as_micros() as u64),
                        Some(l) => seen.gaps_us.push((now - l).as_micros() as u64),
                    }
                    last = Some(now);
                }
            }
        }
    }
    if !seen.done {
        seen.error = Some("stream ended without data: [DONE]".into());
    }
    seen
}

async fn run_streams(a: &Args, t: Rc<Target>) -> Result<Value> {
    let n = a.streams.max(1);
    let ramp = Duration::from_millis(a.ramp_ms);
    let start = Instant::now() + Duration::from_millis(20);
    let jobs = (0..n).map(|i| {
        let t = t.clone();
        let at = start + ramp.mul_f64(i as f64 / n as f64);
        async move {
            tokio::time::sleep_until(at.into()).await;
            one_stream(&t, i as u64).await
        }
    });
    let seen = futures_util::future::join_all(jobs).await;
    let wall = start.elapsed().as_secs_f64();
    let mut ttft: Vec<u64> = seen.iter().filter_map(|s| s.ttft_us).collect();
    let mut gaps: Vec<u64> = seen
        .iter()
        .flat_map(|s| s.gaps_us.iter().copied())
        .collect();
    ttft.sort_unstable();
    gaps.sort_unstable();
    let errors: Vec<&String> = seen.iter().filter_map(|s| s.error.as_ref()).collect();
    let counts: Vec<usize> = seen.iter().map(|s| s.content_events).collect();
    let mismatched = a.expect_chunks.map(|k| {
        seen.iter()
            .filter(|s| s.error.is_none() && s.content_events != k)
            .count()
    });
    let ok = seen
        .iter()
        .filter(|s| s.error.is_none() && a.expect_chunks.is_none_or(|k| s.content_events == k))
        .count();
    Ok(json!({
        "mode": "stream",
        "streams": n,
        "ramp_ms": a.ramp_ms,
        "streams_ok": ok,
        "errors": errors.len(),
        "error_samples": errors.iter().take(5).collect::<Vec<_>>(),
        "done_missing": seen.iter().filter(|s| !s.done).count(),
        "expect_chunks": a.expect_chunks,
        "chunk_count_mismatch": mismatched,
        "content_events_min": counts.iter().min(),
        "content_events_max": counts.iter().max(),
        "content_events_total": counts.iter().sum::<usize>(),
        "wall_s": (wall * 1e3).round() / 1e3,
        "ttft_p50_us": pct(&ttft, 50.0),
        "ttft_p99_us": pct(&ttft, 99.0),
        "ttft_max_us": ttft.last().copied().unwrap_or(0),
        "gaps": gaps.len(),
        "gap_p50_us": pct(&gaps, 50.0),
        "gap_p99_us": pct(&gaps, 99.0),
        "gap_max_us": gaps.last().copied().unwrap_or(0),
    }))
}

fn main() -> Result<()> {
    let a = Args::parse();
    let mut body = std::fs::read(&a.body_file)
        .with_context(|| format!("reading {}", a.body_file.display()))?;
    if a.stream {
        let mut v: Value = serde_json::from_slice(&body).context("--stream needs a JSON body")?;
        v["stream"] = json!(true);
        body = serde_json::to_vec(&v)?;
    }
    let t = Rc::new(Target::new(&a, body)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        if a.stream {
            run_streams(&a, t).await
        } else {
            run_load(&a, t).await
        }
    })?;
    let summary = |k: &str| out.get(k).map(Value::to_string).unwrap_or_default();
    if a.stream {
        eprintln!(
            "loadgen: {} streams, {} ok, {} errors; TTFT p50 {} us p99 {} us; gap p99 {} us",
            summary("streams"),
            summary("streams_ok"),
            summary("errors"),
            summary("ttft_p50_us"),
            summary("ttft_p99_us"),
            summary("gap_p99_us")
        );
    } else {
        eprintln!(
            "loadgen: {} requests, {} errors, {} rps; p50 {} us p99 {} us max {} us",
            summary("requests"),
            summary("errors"),
            summary("rps"),
            summary("p50_us"),
            summary("p99_us"),
            summary("max_us")
        );
    }
    println!("{out}");
    Ok(())
}
