//! Someone with the database, the backup folder and the gateway's log — on the same host
//! the log usually is (`docker logs`, journald) — but not the key. Every head is in the log
//! with its signature: if a log line could be written back as `audit.head`, deleting the
//! newest rows and restoring the head of that time from the log would verify as intact.
//! The log line is signed in a domain of its own, so it cannot stand in for the file.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::audit_tamper::{logged_gateway, logged_heads, Attacker, Tamper};

/// Waits (bounded) for the log line of the head with `rows` rows.
async fn logged_head(log: &Path, rows: i64) -> Value {
    for _ in 0..200 {
        if let Some(h) = logged_heads(log)
            .into_iter()
            .find(|h| h["rows"] == json!(rows))
        {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no logged head with {rows} rows");
}

#[tokio::test]
async fn a_head_rebuilt_from_the_log_does_not_hide_deleted_rows() {
    let lg = logged_gateway().await;
    let (dir, log) = (lg.dir.path(), &lg.log);
    let config = dir.join(format!("sluice-{}.toml", lg.port));
    // The first head follows the token's rows (its team's, its user's and its own: the CLI
    // made them on the way) and the `audit.head_started` row.
    let early = logged_head(log, 4).await;
    // A later audited action: the upstream refuses the key and the gateway disables it.
    lg.refuse_the_key().await;
    logged_head(log, 5).await;
    drop(lg.gw);

    // The attacker deletes the newest row and writes the head of that time, from the log.
    let mut c = Attacker::of_dir(dir).await;
    c.lift_delete_guard().await;
    c.exec("DELETE FROM audit_log WHERE id = (SELECT MAX(id) FROM audit_log)")
        .await;
    c.close().await;
    let rebuilt: serde_json::Map<String, Value> = ["rows", "last_id", "last_hash", "at", "mac"]
        .iter()
        .map(|f| (f.to_string(), early[*f].clone()))
        .collect();
    std::fs::write(
        dir.join("backup/audit.head"),
        Value::Object(rebuilt).to_string(),
    )
    .unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", config.to_str().unwrap(), "audit", "verify"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the truncation verified: {err}");
    assert!(err.contains("audit head forged"), "{err}");
}
