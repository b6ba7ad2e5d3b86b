//! The gateway's own shortage is not the upstream's fault (issue 16's load finding). A
//! gateway process whose open-file limit (soft and hard, so it cannot raise it) is used up
//! cannot open a connection to its upstream: those requests fail before anything leaves
//! the gateway. They must not count toward the upstream's circuit breaker — or a few
//! seconds of descriptor exhaustion open it for `open_seconds` (60) and every request is
//! answered 503 long after the descriptors came back.
//!
//! How the descriptors are used up, without guessing how many the gateway needs for itself:
//! the mock holds its answers for an hour; requests on new connections ("holders", each a
//! client socket and an upstream socket in the gateway) are added one at a time while
//! `/proc/PID/fd` shows room for both. Then requests go over keep-alive connections opened
//! before the limit bit ("probes"): their upstream connect fails with `EMFILE`. A probe that
//! still found a descriptor free is held like a holder, and the next probe is tried. Then
//! the holders leave, the gateway cancels their upstream calls, and the next request must be
//! served at once. The probes ask for a model with two routes: the second would fail the
//! same way, so it is not tried.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sluice::mock::{MockConfig, MockServer, Script};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::gateway_proc::{db_and_token, free_port, healthy, write_config};
use crate::helpers::*;

/// The gateway's soft and hard open-file limit: ~30 for itself at start, the rest for
/// connections.
const LIMIT: u64 = 96;
/// Keep-alive connections opened before the limit bites.
const PROBES: usize = 12;
/// Probe failures wanted: more than the breaker's threshold (3).
const FAILURES: usize = 5;
const HOUR_MS: u64 = 3_600_000;
/// Bounds every wait (for the gateway or the mock to act); only a stuck test reaches it.
const BOUND: Duration = Duration::from_secs(20);

/// One HTTP/1.1 keep-alive connection to the gateway, driven by hyper: it never reconnects
/// behind the test's back. Dropped, its socket closes.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

type Answer = (u16, hyper::HeaderMap, Bytes);

async fn open(url: &str) -> Conn {
    let addr = url.trim_start_matches("http://");
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    Conn { send, driver }
}

/// Sends `req` on `conn`; the answer is read whole by a task of its own, so a request the
/// mock holds stays in flight (and its connection open) for as long as the test keeps it.
async fn send(conn: &mut Conn, req: hyper::Request<Full<Bytes>>) -> JoinHandle<Answer> {
    conn.send
        .ready()
        .await
        .expect("the connection is still open");
    let answer = conn.send.send_request(req);
    tokio::spawn(async move {
        let resp = answer.await.expect("an answer");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("a whole body").to_bytes();
        (parts.status.as_u16(), parts.headers, body)
    })
}

async fn healthz(conn: &mut Conn) {
    let req = hyper::Request::get("/healthz")
        .header("host", "gateway")
        .body(Full::default())
        .unwrap();
    let (status, _, _) = tokio::time::timeout(BOUND, send(conn, req).await)
        .await
        .expect("/healthz answers")
        .unwrap();
    assert_eq!(status, 200);
}

/// A second key on the mock, and a model routed to both keys.
fn two_routes(mock: &MockServer) -> String {
    format!(
        r#"
[queue]
max_in_flight = 500
max_depth = 500
[[upstreams]]
id = "b"
provider = "openai"
base_url = "{}/v1"
api_key = "{KEY_B}"
allow_private_network = true
[[models]]
name = "{PAIR}"
routes = [{{ upstream = "a", model = "gpt-4o-mini" }}, {{ upstream = "b", model = "gpt-4o-mini" }}]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"#,
        mock.base_url()
    )
}

const PAIR: &str = "pair";

fn chat(model: &str) -> Value {
    let mut body = chat_body(100);
    body["model"] = json!(model);
    body
}

/// Whether probe `i` is an OpenAI request; otherwise an Anthropic one. One in three: any run
/// of failures sees both error formats, and no number of held probes lines the formats up
/// with the failures' own order.
fn openai_probe(i: usize) -> bool {
    i.is_multiple_of(3)
}

fn probe_request(i: usize, token: &str) -> hyper::Request<Full<Bytes>> {
    let (path, body) = if openai_probe(i) {
        ("/v1/chat/completions", chat(PAIR))
    } else {
        (
            "/v1/messages",
            json!({"model": PAIR, "max_tokens": 100,
                "messages": [{"role": "user", "content": "Why does the engine light blink?"}]}),
        )
    };
    hyper::Request::post(path)
        .header("host", "gateway")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Waits until the mock has received `n` requests in all, or `answered` resolves first (the
/// gateway answered without reaching the mock): `Some(answer)` then.
async fn held_or_answered<F>(mock: &MockServer, n: u64, answered: F) -> Option<Answer>
where
    F: std::future::Future<Output = Answer>,
{
    let reached = async {
        let until = Instant::now() + BOUND;
        while mock.state.total_count() < n {
            assert!(
                Instant::now() < until,
                "neither held by the mock nor answered"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        biased;
        a = answered => Some(a),
        () = reached => None,
    }
}

/// The gateway as a child process whose soft and hard open-file limits are both `LIMIT`.
fn command(config: &std::path::Path, log: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["--config", config.to_str().unwrap(), "serve"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    // SAFETY: between fork and exec only setrlimit runs (async-signal-safe); lowering the
    // hard limit needs no privilege.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_open_files_does_not_open_the_upstreams_breaker() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let port = free_port();
    let config = write_config(dir.path(), &mock, port, &two_routes(&mock));
    let log = dir.path().join("gateway.log");
    let gateway = healthy(command(&config, &log).spawn().unwrap(), port, &log).await;
    let pid = gateway.child.id();
    let (db, token) = db_and_token(dir.path(), "fds").await;

    // Warm: the token known, the database connections open.
    let http = reqwest::Client::new();
    let chat_url = format!("{}/v1/chat/completions", gateway.url);
    for _ in 0..2 {
        let resp = http
            .post(&chat_url)
            .bearer_auth(&token)
            .json(&chat_body(100))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    }
    drop(http);
    let mut probes = Vec::new();
    for _ in 0..PROBES {
        let mut conn = open(&gateway.url).await;
        healthz(&mut conn).await;
        probes.push(conn);
    }

    // Fill: holders while there is room for a client and an upstream socket.
    mock.state.sticky(
        "*",
        Some(Script {
            delay_ms: HOUR_MS,
            ..Default::default()
        }),
    );
    let mut holders: Vec<TcpStream> = Vec::new();
    let mut early: Option<String> = None;
    let mut reached = mock.state.total_count();
    let mut warmed = Instant::now();
    while fds(pid) + 2 <= LIMIT {
        assert!(
            holders.len() < LIMIT as usize,
            "the gateway's descriptors never ran out"
        );
        let mut holder = send_raw_chat(&gateway.url, &token, &chat_body(100), None).await;
        let answered = async {
            holder.readable().await.unwrap();
            (0, hyper::HeaderMap::new(), Bytes::new())
        };
        let was_answered = held_or_answered(&mock, reached + 1, answered)
            .await
            .is_some();
        if was_answered {
            // The gateway took a descriptor of its own meanwhile (a database connection):
            // the limit bit already, and this holder's answer is a first failure.
            let mut buf = vec![0u8; 4096];
            let n = tokio::io::AsyncReadExt::read(&mut holder, &mut buf)
                .await
                .unwrap();
            early = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            holders.push(holder);
            break;
        }
        reached += 1;
        holders.push(holder);
        // The gateway closes a keep-alive connection idle for 5 s.
        if warmed.elapsed() > Duration::from_secs(1) {
            for p in &mut probes {
                healthz(p).await;
            }
            warmed = Instant::now();
        }
    }

    assert!(
        holders.len() >= 5,
        "room for only {} holders: the gateway used {} descriptors of {LIMIT} before",
        holders.len(),
        fds(pid)
    );

    // One holder leaves (the gateway closes its client and upstream sockets): the first
    // probes find those descriptors free and are held, so the held path runs every time, and
    // each failure must be read in its own probe's format, whatever its place among them.
    drop(holders.remove(0));
    let until = Instant::now() + BOUND;
    while fds(pid) + 2 > LIMIT {
        assert!(
            Instant::now() < until,
            "a holder left but the gateway kept its descriptors"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for p in &mut probes {
        healthz(p).await;
    }
    warmed = Instant::now();

    // Probe over the connections opened before: the upstream connect has no descriptor.
    // Each failure with the index of its probe: a probe that found a descriptor free is held,
    // so the failures' own order says nothing of which format each was asked in.
    let mut failures: Vec<(usize, Answer)> = Vec::new();
    let mut held: Vec<JoinHandle<Answer>> = Vec::new();
    for i in 0..PROBES {
        if failures.len() == FAILURES {
            break;
        }
        if warmed.elapsed() > Duration::from_secs(1) {
            for p in &mut probes[i..] {
                healthz(p).await;
            }
            warmed = Instant::now();
        }
        let mut answer = send(&mut probes[i], probe_request(i, &token)).await;
        let answered = async { (&mut answer).await.unwrap() };
        match held_or_answered(&mock, reached + 1, answered).await {
            Some(a) => failures.push((i, a)),
            None => {
                reached += 1;
                held.push(answer);
            }
        }
    }
    assert_eq!(
        failures.len(),
        FAILURES,
        "{PROBES} probes with {} descriptors open of {LIMIT}: only {} failed",
        fds(pid),
        failures.len()
    );

    // Release: the holders leave; the gateway cancels their upstream calls.
    mock.state.sticky("*", None);
    drop(holders);
    for h in held {
        h.abort();
    }
    drop(probes);
    let until = Instant::now() + BOUND;
    while established_to(mock.port) > 0 || fds(pid) + 4 > LIMIT {
        assert!(
            Instant::now() < until,
            "the gateway kept its upstream calls ({} connections) or descriptors ({} of \
             {LIMIT})",
            established_to(mock.port),
            fds(pid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // At once, the next requests are served, on either model.
    let http = reqwest::Client::new();
    for model in ["gpt-4o-mini", PAIR] {
        let resp = http
            .post(&chat_url)
            .bearer_auth(&token)
            .json(&chat(model))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert_eq!(
            status, 200,
            "once the descriptors are back the gateway serves {model} at once, not after \
             the breaker's open time: {body}"
        );
    }

    // Each shortage was answered 503 `service_degraded`, soon to retry, in its client's format.
    for (i, (status, headers, body)) in &failures {
        let text = String::from_utf8_lossy(body);
        assert_eq!(*status, 503, "probe {i}: {text}");
        let v: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["error"]["code"], "service_degraded", "probe {i}: {v}");
        if openai_probe(*i) {
            assert_eq!(v["error"]["type"], "server_error", "probe {i}: {v}");
            assert_eq!(v["error"]["retry_after_seconds"], 1, "{v}");
        } else {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
        }
        assert_eq!(headers.get("retry-after").unwrap(), "1", "probe {i}");
        assert_eq!(headers.get("x-should-retry").unwrap(), "true", "probe {i}");
        // One attempt, on the first route: the second would have failed alike. Charged 0.
        let id = headers.get("x-request-id").unwrap().to_str().unwrap();
        let until = Instant::now() + BOUND;
        let row = loop {
            let rows: Vec<(i64, i64, Option<String>, i64)> = sql_rows(
                &db,
                &format!(
                    "SELECT status, attempts, error_code, cost_micros FROM requests WHERE id = '{id}'"
                ),
            )
            .await;
            if let Some(row) = rows.into_iter().next() {
                break row;
            }
            assert!(Instant::now() < until, "probe {i} has no request-log row");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            row,
            (503, 1, Some("service_degraded".into()), 0),
            "probe {i}"
        );
    }
    if let Some(head) = early {
        assert!(head.starts_with("HTTP/1.1 503"), "a holder: {head}");
        assert!(head.contains("service_degraded"), "a holder: {head}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("local_resources") && logged.contains("EMFILE"),
        "the shortage is logged as the gateway's own, with its cause"
    );
    assert!(
        !logged.contains("breaker_open"),
        "no breaker opened: {}",
        logged
            .lines()
            .filter(|l| l.contains("breaker"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The money is right: nothing left reserved, the invariant holds.
    let until = Instant::now() + BOUND;
    loop {
        let open = scalar_on(&db, "SELECT COUNT(*) FROM reservations").await;
        if open == 0 {
            break;
        }
        assert!(Instant::now() < until, "{open} reservations left open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_invariant_on(&db).await;
}
