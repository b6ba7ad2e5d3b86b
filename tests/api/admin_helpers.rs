//! Signing in to the admin surface from tests: a cookie-less reqwest client that carries the
//! session cookie and CSRF token by hand (so tests can also leave them out or swap them).

use reqwest::header::{HeaderMap, SET_COOKIE};
use reqwest::redirect::Policy;
use serde_json::Value;

use crate::helpers::TestApp;

pub const PASSWORD: &str = "correct horse battery staple";

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Creates a login through the CLI path; returns its id.
pub async fn make_login(app: &TestApp, username: &str, role: &str, team: Option<&str>) -> i64 {
    sluice::cli::admin_create(
        app.db(),
        username,
        role,
        team,
        PASSWORD.into(),
        chrono::Utc::now(),
    )
    .await
    .expect("admin created")
}

/// `name=value` of every cookie a response sets, with its attributes.
pub fn set_cookies(h: &HeaderMap) -> Vec<String> {
    h.get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect()
}

pub fn cookie_value(set_cookie: &[String], name: &str) -> Option<String> {
    set_cookie.iter().find_map(|c| {
        let first = c.split(';').next()?;
        let (n, v) = first.split_once('=')?;
        (n.trim() == name && !v.is_empty()).then(|| v.to_string())
    })
}

pub fn find_between(text: &str, start: &str, end: &str) -> Option<String> {
    let i = text.find(start)? + start.len();
    let j = text[i..].find(end)? + i;
    Some(text[i..j].to_string())
}

/// The login form: (pre-session cookie value, CSRF token of the form).
pub async fn login_form(app: &TestApp, http: &reqwest::Client) -> (String, String) {
    login_form_at(http, &app.address).await
}

/// The login form of the gateway at `url` (a process of its own, say).
pub async fn login_form_at(http: &reqwest::Client, url: &str) -> (String, String) {
    let resp = http.get(format!("{url}/admin/login")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let pre = cookie_value(&set_cookies(resp.headers()), "sluice_login").expect("login cookie");
    let body = resp.text().await.unwrap();
    let csrf = find_between(&body, "name=\"csrf_token\" value=\"", "\"").expect("csrf field");
    (pre, csrf)
}

pub async fn post_login(
    app: &TestApp,
    http: &reqwest::Client,
    pre: &str,
    csrf: &str,
    user: &str,
    password: &str,
    extra_cookie: Option<&str>,
) -> reqwest::Response {
    let mut cookie = format!("sluice_login={pre}");
    if let Some(c) = extra_cookie {
        cookie.push_str("; ");
        cookie.push_str(c);
    }
    post_login_at(http, &app.address, &cookie, csrf, user, password).await
}

/// The sign-in form posted to the gateway at `url` with `cookie` (the pre-session's, and
/// any other).
pub async fn post_login_at(
    http: &reqwest::Client,
    url: &str,
    cookie: &str,
    csrf: &str,
    user: &str,
    password: &str,
) -> reqwest::Response {
    http.post(format!("{url}/admin/login"))
        .header("cookie", cookie)
        .form(&[
            ("username", user),
            ("password", password),
            ("csrf_token", csrf),
        ])
        .send()
        .await
        .expect("the gateway answers every sign-in")
}

pub struct Session {
    pub address: String,
    pub id: String,
    pub csrf: String,
    pub http: reqwest::Client,
}

pub async fn login(app: &TestApp, user: &str) -> Session {
    login_with(app, user, PASSWORD).await
}

pub async fn login_with(app: &TestApp, user: &str, password: &str) -> Session {
    let http = client();
    let (pre, csrf) = login_form(app, &http).await;
    let resp = post_login(app, &http, &pre, &csrf, user, password, None).await;
    assert_eq!(resp.status(), 303, "login of {user} succeeds");
    let id = cookie_value(&set_cookies(resp.headers()), "sluice_session").expect("session cookie");
    let mut s = Session {
        address: app.address.clone(),
        id,
        csrf: String::new(),
        http,
    };
    let page = s.get("/admin/").await;
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    s.csrf = find_between(&body, "\"x-csrf-token\": \"", "\"").expect("csrf in page");
    s
}

impl Session {
    pub fn cookie(&self) -> String {
        format!("sluice_session={}", self.id)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.address))
            .header("cookie", self.cookie())
            .send()
            .await
            .unwrap()
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A JSON write with the session's CSRF header.
    pub async fn send(&self, method: reqwest::Method, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .request(method, format!("{}{path}", self.address))
            .header("cookie", self.cookie())
            .header("x-csrf-token", &self.csrf)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, body).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(reqwest::Method::PATCH, path, body).await
    }

    /// An htmx form post, as the pages send it.
    pub async fn htmx_form(&self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.address))
            .header("cookie", self.cookie())
            .header("x-csrf-token", &self.csrf)
            .header("hx-request", "true")
            .form(form)
            .send()
            .await
            .unwrap()
    }
}

/// Counts of every table an admin action may change (not the session table, which a read
/// may touch to keep the session alive).
pub async fn state_counts(app: &TestApp) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for (name, sql) in [
        ("teams", "SELECT COUNT(*) FROM teams"),
        ("users", "SELECT COUNT(*) FROM users"),
        (
            "disabled users",
            "SELECT COUNT(*) FROM users WHERE disabled = TRUE",
        ),
        ("tokens", "SELECT COUNT(*) FROM tokens"),
        (
            "revoked tokens",
            "SELECT COUNT(*) FROM tokens WHERE revoked_at IS NOT NULL",
        ),
        (
            "token limits",
            "SELECT COALESCE(SUM(COALESCE(limit_micros, 0)), 0) FROM tokens",
        ),
        (
            "token expiries",
            "SELECT COUNT(*) FROM tokens WHERE expires_at IS NOT NULL",
        ),
        (
            "team limits",
            "SELECT COALESCE(SUM(COALESCE(limit_micros, 0)), 0) FROM teams",
        ),
        ("admins", "SELECT COUNT(*) FROM admins"),
        (
            "admin roles",
            "SELECT COUNT(*) FROM admins WHERE role = 'admin'",
        ),
        ("api keys", "SELECT COUNT(*) FROM admin_api_keys"),
        ("audit", "SELECT COUNT(*) FROM audit_log"),
        ("ledger", "SELECT COUNT(*) FROM ledger"),
        ("epoch", "SELECT value FROM meta WHERE key = 'token_epoch'"),
    ] {
        out.push((name.to_string(), app.scalar(sql).await));
    }
    out
}

/// One raw HTTP/1.1 request, exactly as written (no URL normalisation): (status, body).
pub async fn raw(app: &TestApp, request: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.address.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// A new admin API key of the signed-in `s`, named `name`.
pub async fn key_of(s: &Session, name: &str) -> String {
    let (status, v) = s
        .post("/admin/api/v1/keys", &serde_json::json!({ "name": name }))
        .await;
    assert_eq!(status, 201, "{v}");
    v["key"].as_str().unwrap().to_string()
}

/// The status of `GET /admin/api/v1/me` with `key` as the bearer: is the key alive?
pub async fn me_with_key(app: &TestApp, key: &str) -> u16 {
    client()
        .get(format!("{}/admin/api/v1/me", app.address))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}
