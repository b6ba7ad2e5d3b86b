//! The per-name sign-in limit locks a name for the window, whoever guesses: anyone who can
//! reach `/admin/login` can keep the real admin's name locked with five wrong passwords
//! every fifteen minutes. The operator's way back in is the CLI on the host, which needs
//! no password and no sign-in: `sluice admin unlock` lifts the lock on one name, and
//! `sluice admin reset-password` sets a new password, ends the login's sessions, revokes
//! its API keys and lifts the lock too. Both are audit rows.

use std::process::{Output, Stdio};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use serde_json::json;

use crate::admin_helpers::*;
use crate::helpers::*;

const NEW_PASSWORD: &str = "a fresh passphrase for root";

/// The CLI as a child the runtime awaits: a blocking wait would stall the in-process
/// gateway's tasks (its audit-head exporter holds the lock the CLI's own export waits for).
async fn sluice(app: &TestApp, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(cli_config(app))
        .args(args)
        .env_remove("SLUICE_SECRET_KEY")
        .env_remove("SLUICE_ADMIN_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).await.unwrap();
    }
    drop(input);
    child.wait_with_output().await.unwrap()
}

/// Five wrong passwords at `user` (what an attacker does); then the right one is 429.
async fn lock_out(app: &TestApp, user: &str) {
    let http = client();
    let (pre, csrf) = login_form(app, &http).await;
    for i in 0..5 {
        let r = post_login(app, &http, &pre, &csrf, user, &format!("guess {i}"), None).await;
        assert_eq!(r.status(), 401);
    }
    let r = post_login(app, &http, &pre, &csrf, user, PASSWORD, None).await;
    assert_eq!(r.status(), 429, "the name is locked, even for its owner");
    assert!(r.text().await.unwrap().contains("Try again in"));
}

/// `sluice admin reset-password` of root, the new password (and its newline) on stdin.
async fn reset_root_password(app: &TestApp, stdin: &str) -> Output {
    let args = [
        "admin",
        "reset-password",
        "--username",
        "root",
        "--password-stdin",
    ];
    sluice(app, &args, Some(stdin)).await
}

async fn sign_in_status(app: &TestApp, user: &str, password: &str) -> u16 {
    let http = client();
    let (pre, csrf) = login_form(app, &http).await;
    post_login(app, &http, &pre, &csrf, user, password, None)
        .await
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_cli_unlocks_a_name_an_attacker_keeps_locked() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    lock_out(&app, "root").await;

    let out = sluice(&app, &["admin", "unlock", "--username", "root"], None).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sign_in_status(&app, "root", PASSWORD).await, 303);
    let rows: i64 = app
        .scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.unlock' AND actor = 'cli' AND target LIKE 'admin:%'")
        .await;
    assert_eq!(rows, 1);

    // An unknown name is an error that names it, and changes nothing.
    let out = sluice(&app, &["admin", "unlock", "--username", "nobody"], None).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nobody"));
}

#[tokio::test]
async fn the_cli_resets_a_password_ends_sessions_revokes_keys_and_unlocks() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let key = key_of(&s, "ci").await;
    lock_out(&app, "root").await;

    // Too short a password is refused before anything changes.
    let out = reset_root_password(&app, "short\n").await;
    assert!(!out.status.success());
    assert_eq!(sign_in_status(&app, "root", PASSWORD).await, 429);

    let out = reset_root_password(&app, &format!("{NEW_PASSWORD}\n")).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The old session and the key are dead; the old password no longer opens anything.
    assert_eq!(s.get("/admin/api/v1/me").await.status(), 401);
    assert_eq!(me_with_key(&app, &key).await, 401);
    assert_eq!(sign_in_status(&app, "root", PASSWORD).await, 401);
    assert_eq!(sign_in_status(&app, "root", NEW_PASSWORD).await, 303);
    let after = sql_text(
        app.db(),
        "SELECT after FROM audit_log WHERE action = 'admin.password_reset' AND actor = 'cli'",
    )
    .await;
    let after: serde_json::Value = serde_json::from_str(&after).unwrap();
    assert_eq!(after["sessions_ended"], json!(1), "{after}");
    assert_eq!(after["api_keys_revoked"], json!(1), "{after}");
    assert!(
        !after.to_string().contains("argon2"),
        "no hash in the audit row"
    );
}

/// Forwarded headers are not trusted: twenty names guessed from one socket while every
/// request claims another client address are still one address's twenty; the next is 429.
#[tokio::test]
async fn forwarded_headers_do_not_escape_the_per_address_limit() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    let attempt = |i: usize| {
        let fake = format!("198.51.100.{i}");
        http.post(format!("{}/admin/login", app.address))
            .header("cookie", format!("sluice_login={pre}"))
            .header("x-forwarded-for", &fake)
            .header("x-real-ip", &fake)
            .header("forwarded", format!("for={fake}"))
            .form(&[
                ("username", format!("name{i}").as_str()),
                ("password", "a guess of some length"),
                ("csrf_token", csrf.as_str()),
            ])
            .send()
    };
    for i in 0..20 {
        assert_eq!(attempt(i).await.unwrap().status(), 401, "attempt {i}");
    }
    let r = attempt(20).await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.text().await.unwrap().contains("Try again in"));
}

/// Names match exactly: `ADMIN`, `root ` or a full-width `ｒoot` are other names (they
/// open nothing, even with root's password), and guessing at them does not lock `root`.
#[tokio::test]
async fn lookalike_names_neither_open_nor_lock_the_real_one() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    for name in ["ROOT", "root ", " root", "ｒoot", "root\u{200b}"] {
        assert_eq!(sign_in_status(&app, name, PASSWORD).await, 401, "{name:?}");
    }
    for i in 0..5 {
        assert_eq!(
            sign_in_status(&app, "Root", &format!("guess {i}")).await,
            401
        );
    }
    assert_eq!(sign_in_status(&app, "Root", PASSWORD).await, 429);
    assert_eq!(sign_in_status(&app, "root", PASSWORD).await, 303);
}
