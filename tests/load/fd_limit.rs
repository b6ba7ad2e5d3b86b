//! The gateway raises its soft open-file limit to the hard one at start (`ops/fd_limit.rs`).
//! Started under a soft limit of 256 — below what 300 concurrent streams need, a client
//! socket and an upstream socket each — it still carries them all.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sluice::mock::{MockConfig, MockServer, Script};

use crate::gateway_proc::{db_and_token, free_port, healthy, write_config};
use crate::helpers::*;
use crate::rig::*;

const SOFT: u64 = 256;
const STREAMS: usize = 300;

/// (soft, hard) "Max open files" of a process.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    (f[0].to_string(), f[1].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_under_a_low_soft_fd_limit_raises_it_and_carries_300_streams() {
    let _serial = one_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    mock.state.sticky(
        "*",
        Some(Script {
            text: Some("word ".repeat(20)),
            chunk_delay_ms: 100,
            ..Default::default()
        }),
    );
    let port = free_port();
    let config = write_config(
        dir.path(),
        &mock,
        port,
        "[queue]\nmax_in_flight = 1000\nmax_depth = 1000\n",
    );
    let log = dir.path().join("gateway.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["--config", config.to_str().unwrap(), "serve"])
        .env("SLUICE_SERVER_WORKERS", "2")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: between fork and exec only getrlimit / setrlimit run (async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            lim.rlim_cur = SOFT.min(lim.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let gateway = healthy(cmd.spawn().unwrap(), port, &log).await;
    let pid = gateway.child.id();
    let (soft, hard) = nofile(pid);
    assert_eq!(
        soft, hard,
        "started with a soft limit of {SOFT}, the gateway runs with soft {soft}, hard {hard}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("open-file limit") && logged.contains(&format!("\"was\":{SOFT}")),
        "the raise is logged with the old value: {logged}"
    );

    let (_db, token) = db_and_token(dir.path(), "fds").await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let streams: Vec<_> = (0..STREAMS)
        .map(|_| {
            let (http, url, token, body) = (
                http.clone(),
                format!("{}/v1/chat/completions", gateway.url),
                token.clone(),
                body.clone(),
            );
            tokio::spawn(async move {
                let bytes = post_for_200(&http, &url, &token, &body).await?;
                let text = String::from_utf8_lossy(&bytes);
                let data: Vec<String> = text
                    .split("\n\n")
                    .filter_map(|e| e.strip_prefix("data: "))
                    .map(str::to_string)
                    .collect();
                if data.last().map(String::as_str) == Some("[DONE]") {
                    Ok(reassemble(&data))
                } else {
                    Err(format!("200 without [DONE]: {text}"))
                }
            })
        })
        .collect();
    let mut failures = Vec::new();
    for s in streams {
        match s.await.unwrap() {
            Ok(text) if text == "word ".repeat(20) => {}
            Ok(text) => failures.push(format!("a different text: {text}")),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {STREAMS} streams failed under the start-up soft limit of {SOFT}; first: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    let stats = mock.state.stats(KEY_A);
    assert!(
        stats.max_concurrency > SOFT,
        "the streams were concurrent: {} at once upstream",
        stats.max_concurrency
    );
}
