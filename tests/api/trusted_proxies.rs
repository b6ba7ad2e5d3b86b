//! `[server] trusted_proxies`: behind a reverse proxy every client's socket peer is the
//! proxy, so without it one per-address sign-in limit (20 per 15 minutes) is shared by every
//! user. From a trusted peer the client is the rightmost untrusted `X-Forwarded-For` entry;
//! from any other peer the header is ignored. The test's own socket plays the proxy (its
//! address is 127.0.0.1).

use serde_json::json;

use crate::admin_helpers::*;
use crate::helpers::*;

/// One wrong-password sign-in at `name`, with `X-Forwarded-For: xff` when given.
async fn guess(
    app: &TestApp,
    http: &reqwest::Client,
    form: &(String, String),
    name: &str,
    xff: Option<&str>,
) -> reqwest::Response {
    let mut req = http
        .post(format!("{}/admin/login", app.address))
        .header("cookie", format!("sluice_login={}", form.0));
    if let Some(xff) = xff {
        req = req.header("x-forwarded-for", xff);
    }
    req.form(&[
        ("username", name),
        ("password", "a guess of some length"),
        ("csrf_token", form.1.as_str()),
    ])
    .send()
    .await
    .unwrap()
}

/// Logins named `{prefix}0` … `{prefix}{n-1}` (no password opens them), made without
/// hashing: a failed sign-in is audited under its name only at a login that exists.
async fn logins(app: &TestApp, prefix: &str, n: usize) {
    for i in 0..n {
        sql_exec(
            app.db(),
            &format!(
                "INSERT INTO admins (username, password_hash, role, created_at)
                 VALUES ('{prefix}{i}', 'no password', 'finance', '2026-01-01T00:00:00.000Z')"
            ),
        )
        .await;
    }
}

/// The addresses of the `login.failed` audit rows at names starting with `prefix`.
async fn failed_from(app: &TestApp, prefix: &str) -> Vec<String> {
    assert!(prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-'));
    addresses(
        app,
        &format!("SELECT address FROM audit_log WHERE action = 'login.failed' AND actor LIKE '{prefix}%' ORDER BY id"),
    )
    .await
}

/// The addresses (one text column) `sql` selects from `app`'s database.
async fn addresses(app: &TestApp, sql: &str) -> Vec<String> {
    let rows: Vec<(String,)> = sql_rows(app.db(), sql).await;
    rows.into_iter().map(|(a,)| a).collect()
}

/// Proxies are trusted, but not this socket's address: whatever `X-Forwarded-For` it sends,
/// its twenty guesses are one address's twenty, and each is recorded at its own address.
#[tokio::test]
async fn from_an_untrusted_peer_x_forwarded_for_is_ignored() {
    let app = spawn_app_with(|s, _| {
        s.server.trusted_proxies = vec!["10.0.0.0/8".into(), "192.0.2.0/24".into()];
    })
    .await;
    logins(&app, "spoof", 21).await;
    let http = client();
    let form = login_form(&app, &http).await;
    for i in 0..20 {
        // Claims a new client each time, and claims to come through a trusted proxy too.
        let xff = format!("203.0.113.{i}, 10.0.0.1");
        let r = guess(&app, &http, &form, &format!("spoof{i}"), Some(&xff)).await;
        assert_eq!(r.status(), 401, "guess {i}");
    }
    let r = guess(&app, &http, &form, "spoof20", Some("203.0.113.99")).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let addresses = failed_from(&app, "spoof").await;
    assert_eq!(addresses.len(), 20);
    assert!(addresses.iter().all(|a| a == "127.0.0.1"), "{addresses:?}");
}

/// This socket is a trusted proxy: two clients behind it are throttled apart — one that has
/// used up its twenty guesses (while writing whatever it likes to the left of the proxy's
/// entry) does not lock out the other — and the audit rows carry each client's address.
/// A header the proxy sent that is not an address counts at the proxy's own.
#[tokio::test]
async fn through_a_trusted_proxy_two_clients_are_throttled_apart() {
    let app = spawn_app_with(|s, _| {
        s.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    })
    .await;
    make_login(&app, "root", "admin", None).await;
    for prefix in ["a", "b", "c"] {
        logins(&app, prefix, 21).await;
    }
    let http = client();
    let form = login_form(&app, &http).await;
    for i in 0..20 {
        let xff = format!("198.51.100.{i}, 203.0.113.7");
        let r = guess(&app, &http, &form, &format!("a{i}"), Some(&xff)).await;
        assert_eq!(r.status(), 401, "client A's guess {i}");
    }
    let r = guess(
        &app,
        &http,
        &form,
        "a20",
        Some("198.51.100.200, 203.0.113.7"),
    )
    .await;
    assert_eq!(r.status(), 429, "client A is over its limit");
    let r = guess(&app, &http, &form, "b0", Some("192.0.2.44")).await;
    assert_eq!(r.status(), 401, "client B is throttled apart from A");
    let a = failed_from(&app, "a").await;
    assert_eq!(a.len(), 20);
    assert!(a.iter().all(|x| x == "203.0.113.7"), "{a:?}");
    assert_eq!(failed_from(&app, "b").await, ["192.0.2.44"]);
    // Not an address: the proxy's own.
    let r = guess(&app, &http, &form, "c0", Some("203.0.113.8, unknown")).await;
    assert_eq!(r.status(), 401);
    assert_eq!(failed_from(&app, "c").await, ["127.0.0.1"]);
    // A sign-in through the proxy, and an action the admin's key takes through it (the
    // admin gate's address), carry the client's.
    let resp = http
        .post(format!("{}/admin/login", app.address))
        .header("cookie", format!("sluice_login={}", form.0))
        .header("x-forwarded-for", "192.0.2.45")
        .form(&[
            ("username", "root"),
            ("password", PASSWORD),
            ("csrf_token", form.1.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303);
    let key = key_of(&login(&app, "root").await, "automation").await;
    let resp = client()
        .post(format!("{}/admin/api/v1/teams", app.address))
        .bearer_auth(&key)
        .header("x-forwarded-for", "192.0.2.46")
        .json(&json!({"name": "via-proxy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let newest = sql_text(
        app.db(),
        "SELECT address FROM audit_log WHERE action = 'team.create' ORDER BY id DESC LIMIT 1",
    )
    .await;
    assert_eq!(newest, "192.0.2.46");
    let signed_in = addresses(
        &app,
        "SELECT address FROM audit_log WHERE action = 'login.ok' ORDER BY id",
    )
    .await;
    assert_eq!(signed_in.first().map(String::as_str), Some("192.0.2.45"));
}

/// A bad entry stops `check-config` and the start, naming the key and the entry.
#[tokio::test]
async fn a_bad_trusted_proxy_entry_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ntrusted_proxies = [\"127.0.0.1\", \"10.0.0.0/33\"]\n[database]\nurl = \"sqlite://{}/sluice.db\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    assert_start_refused(&config, &["server.trusted_proxies", "`10.0.0.0/33`"]).await;
}

/// A client behind a trusted proxy writes a byte that is not visible ASCII (obs-text, which
/// HTTP parsers and proxies pass through) into its own part of `X-Forwarded-For`: nginx
/// appends the client's address to the same line, HAProxy adds a line of its own. That byte
/// is left of the proxy's entry, where the walk never goes, so the client is still the
/// address the proxy wrote — not the proxy's own, which would let a client that used up its
/// guesses start over at the proxy's address (shared with everyone whose header is missing)
/// and be recorded there instead of at its own.
#[tokio::test]
async fn a_byte_the_client_wrote_left_of_the_proxys_entry_does_not_make_it_the_proxy() {
    use reqwest::header::HeaderValue;
    let app = spawn_app_with(|s, _| {
        s.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    })
    .await;
    logins(&app, "x", 20).await;
    logins(&app, "y", 2).await;
    let http = client();
    let form = login_form(&app, &http).await;
    for i in 0..20 {
        let r = guess(&app, &http, &form, &format!("x{i}"), Some("203.0.113.7")).await;
        assert_eq!(r.status(), 401, "guess {i}");
    }
    // nginx (`$proxy_add_x_forwarded_for`): one line; HAProxy (`option forwardfor`): two.
    let nginx = [HeaderValue::from_bytes(b"\xff, 203.0.113.7").unwrap()];
    let haproxy = [
        HeaderValue::from_bytes(b"\xff").unwrap(),
        HeaderValue::from_static("203.0.113.7"),
    ];
    for (n, lines) in [&nginx[..], &haproxy[..]].into_iter().enumerate() {
        let mut req = http
            .post(format!("{}/admin/login", app.address))
            .header("cookie", format!("sluice_login={}", form.0));
        for line in lines {
            req = req.header("x-forwarded-for", line.clone());
        }
        let r = req
            .form(&[
                ("username", format!("y{n}").as_str()),
                ("password", "a guess of some length"),
                ("csrf_token", form.1.as_str()),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            429,
            "lines {lines:?}: the client escaped its limit (recorded at {:?})",
            failed_from(&app, "y").await
        );
    }
    assert!(failed_from(&app, "y").await.is_empty());
}
