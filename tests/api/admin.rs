//! The admin surface's front door: sessions and their cookie, login throttling, CSRF and
//! cross-site refusal, GETs that never write, and routes that all need a session.

use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::json;
use sluice::clock::{Clock, ManualClock};

use crate::admin_helpers::*;
use crate::helpers::*;
use crate::signin_attack::sign_in;

#[tokio::test]
async fn login_sets_a_strict_cookie_with_a_fresh_id_and_logout_kills_it() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    // An id planted before login (session fixation) is not what the login hands out.
    let planted = "ab".repeat(32);
    let resp = post_login(
        &app,
        &http,
        &pre,
        &csrf,
        "root",
        PASSWORD,
        Some(&format!("sluice_session={planted}")),
    )
    .await;
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/admin/");
    let cookies = set_cookies(resp.headers());
    let c = cookies
        .iter()
        .find(|c| c.starts_with("sluice_session="))
        .expect("session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(c.contains(flag), "{flag} missing in {c}");
    }
    assert!(!c.contains("Secure"), "plain http: no Secure flag");
    let id = cookie_value(&cookies, "sluice_session").unwrap();
    assert_ne!(id, planted);
    assert_eq!(id.len(), 64);
    // The database keeps only a hash of the id.
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM admin_sessions WHERE id_hash = '{id}'"
        ))
        .await,
        0
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM admin_sessions").await, 1);

    let s = login(&app, "root").await;
    assert_ne!(s.id, id, "every login gets a new id");
    let (status, me) = s.get_json("/admin/api/v1/me").await;
    assert_eq!(status, 200);
    assert_eq!(me["role"], "admin");

    let r = s
        .http
        .post(format!("{}/admin/logout", app.address))
        .header("cookie", s.cookie())
        .header("x-csrf-token", &s.csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cleared = set_cookies(r.headers());
    assert!(
        cleared
            .iter()
            .any(|c| c.starts_with("sluice_session=;") || c.contains("Max-Age=0")),
        "{cleared:?}"
    );
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        401,
        "the old cookie is dead after logout"
    );
    let page = s.get("/admin/teams").await;
    assert_eq!(page.status(), 303);
    assert_eq!(page.headers()["location"], "/admin/login");
}

#[tokio::test]
async fn behind_https_the_cookie_is_secure_with_the_host_prefix() {
    let app = spawn_app_with(|s, _| s.server.public_url = "https://gw.example".into()).await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let resp = http
        .get(format!("{}/admin/login", app.address))
        .send()
        .await
        .unwrap();
    let cookies = set_cookies(resp.headers());
    let pre = cookie_value(&cookies, "__Host-sluice_login").expect("__Host- login cookie");
    assert!(cookies[0].contains("Secure"));
    let body = resp.text().await.unwrap();
    let csrf = find_between(&body, "name=\"csrf_token\" value=\"", "\"").unwrap();
    let resp = http
        .post(format!("{}/admin/login", app.address))
        .header("cookie", format!("__Host-sluice_login={pre}"))
        .header("origin", "https://gw.example")
        .form(&[
            ("username", "root"),
            ("password", PASSWORD),
            ("csrf_token", csrf.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303);
    let cookies = set_cookies(resp.headers());
    let c = cookies
        .iter()
        .find(|c| c.starts_with("__Host-sluice_session="))
        .expect("__Host- session cookie");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Secure"] {
        assert!(c.contains(flag), "{flag} missing in {c}");
    }
    assert!(!c.contains("Domain"), "a __Host- cookie has no Domain");
}

#[tokio::test]
async fn a_password_change_ends_every_other_session() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let a = login(&app, "root").await;
    let b = login(&app, "root").await;
    let r = a
        .htmx_form(
            "/admin/account/password",
            &[
                ("current_password", PASSWORD),
                ("new_password", "an entirely new passphrase"),
            ],
        )
        .await;
    assert_eq!(r.status(), 200);
    let fresh = cookie_value(&set_cookies(r.headers()), "sluice_session")
        .expect("a new session for this browser");
    assert_eq!(
        b.get_json("/admin/api/v1/me").await.0,
        401,
        "other sessions end"
    );
    assert_eq!(
        a.get_json("/admin/api/v1/me").await.0,
        401,
        "the old id of this browser ends too"
    );
    let a2 = Session { id: fresh, ..a };
    assert_eq!(a2.get_json("/admin/api/v1/me").await.0, 200);
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    assert_eq!(
        post_login(&app, &http, &pre, &csrf, "root", PASSWORD, None)
            .await
            .status(),
        401
    );
    login_with(&app, "root", "an entirely new passphrase").await;
}

#[tokio::test]
async fn sessions_end_when_idle_and_after_the_absolute_limit() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone() as Arc<dyn Clock>)).await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    clock.advance(Duration::minutes(29));
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        200,
        "used within the idle limit"
    );
    clock.advance(Duration::minutes(31));
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        401,
        "idle for 31 minutes"
    );

    let s = login(&app, "root").await;
    for _ in 0..24 {
        clock.advance(Duration::minutes(29));
        assert_eq!(s.get_json("/admin/api/v1/me").await.0, 200);
    }
    clock.advance(Duration::minutes(29));
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        401,
        "past 12 hours, however busy"
    );
}

/// A session stamped while the clock that judges it ran a day ahead — the host's, stepped
/// back since (on PostgreSQL the database's): it ends, where it outlived both its bounds by
/// the step (s30 identity attack F2).
#[tokio::test]
async fn a_session_stamped_ahead_of_the_clock_does_not_outlive_its_bounds() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    assert_eq!(s.get_json("/admin/api/v1/me").await.0, 200);
    let ahead = sluice::clock::db_time(Utc::now() + Duration::days(1));
    sql_exec(
        app.db(),
        &format!("UPDATE admin_sessions SET created_at = '{ahead}', last_seen_at = '{ahead}'"),
    )
    .await;
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        401,
        "a session stamped a day ahead"
    );
}

#[tokio::test]
async fn wrong_passwords_are_throttled_even_for_the_right_one() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(
            post_login(
                &app,
                &http,
                &pre,
                &csrf,
                "root",
                "not the password at all",
                None,
            )
            .await
            .status()
            .as_u16(),
        );
    }
    assert_eq!(&statuses[..5], &[401; 5]);
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    let r = post_login(&app, &http, &pre, &csrf, "root", PASSWORD, None).await;
    assert_eq!(r.status(), 429, "the right password is throttled too");
    let retry = retry_after(r.headers());
    assert!((1..=900).contains(&retry), "{retry}");
    assert!(set_cookies(r.headers())
        .iter()
        .all(|c| !c.starts_with("sluice_session=")));
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'login.failed'")
            .await,
        5
    );
}

#[tokio::test]
async fn spraying_one_password_over_many_users_is_throttled_by_address() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    for i in 0..20 {
        let r = post_login(
            &app,
            &http,
            &pre,
            &csrf,
            &format!("user{i}"),
            "Summer2026!Summer",
            None,
        )
        .await;
        assert_eq!(r.status(), 401);
    }
    let r = post_login(&app, &http, &pre, &csrf, "root", PASSWORD, None).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
}

/// An unknown user and a wrong password answer alike, and an unknown user still costs one
/// full argon2id verification (against a dummy hash): the gateway's verification counter
/// rises by exactly one per attempt, whichever it was. Counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_user_and_wrong_password_answer_alike_and_cost_one_verification_each() {
    let rig = crate::signin_attack::Rig::start().await;
    let form = rig.form().await;
    let form = (form.0.as_str(), form.1.as_str());
    let mut answers = Vec::new();
    for i in 0..3 {
        let before = rig.verifications().await;
        let a = sign_in(
            &rig.http,
            rig.url(),
            form,
            "root",
            "not the password at all",
        )
        .await;
        assert_eq!(rig.verifications().await, before + 1, "a wrong password");
        answers.push((a.status, a.body));
        let before = rig.verifications().await;
        let user = format!("nobody{i}");
        let a = sign_in(&rig.http, rig.url(), form, &user, "not the password at all").await;
        assert_eq!(rig.verifications().await, before + 1, "an unknown user");
        answers.push((a.status, a.body));
    }
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "one status and body for every failure"
    );
    assert_eq!(answers[0].0, 401);
}

#[tokio::test]
async fn state_changes_need_the_sessions_csrf_token_and_the_same_origin() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let a = login(&app, "root").await;
    let b = login(&app, "root").await;
    let url = format!("{}/admin/teams", app.address);
    let post = |name: &'static str| {
        a.http
            .post(&url)
            .header("cookie", a.cookie())
            .header("hx-request", "true")
            .form(&[("name", name)])
    };
    let before = app.scalar("SELECT COUNT(*) FROM teams").await;

    assert_eq!(post("t1").send().await.unwrap().status(), 403, "no token");
    assert_eq!(
        post("t2")
            .header("x-csrf-token", &b.csrf)
            .send()
            .await
            .unwrap()
            .status(),
        403,
        "another session's token"
    );
    assert_eq!(
        post("t3")
            .header("x-csrf-token", "0".repeat(64))
            .send()
            .await
            .unwrap()
            .status(),
        403,
        "a made-up token"
    );
    let cross = post("t4")
        .header("x-csrf-token", &a.csrf)
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403, "foreign Origin");
    let site = post("t5")
        .header("x-csrf-token", &a.csrf)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(site.status(), 403, "Sec-Fetch-Site: cross-site");
    let json_no_token = a
        .http
        .post(format!("{}/admin/api/v1/teams", app.address))
        .header("cookie", a.cookie())
        .json(&json!({"name": "t6"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_no_token.status(),
        403,
        "the JSON API on a session needs it too"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM teams").await,
        before,
        "nothing refused was written"
    );

    assert_eq!(
        post("ok1")
            .header("x-csrf-token", &a.csrf)
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "header"
    );
    let form = a
        .http
        .post(&url)
        .header("cookie", a.cookie())
        .form(&[("name", "ok2"), ("csrf_token", a.csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 200, "form field");
    let same = post("ok3")
        .header("x-csrf-token", &a.csrf)
        .header("origin", app.address.as_str())
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(same.status(), 200, "same origin");
    assert_eq!(app.scalar("SELECT COUNT(*) FROM teams").await, before + 3);

    // The login form has its own token: without it, no login.
    let http = client();
    let (pre, _) = login_form(&app, &http).await;
    let r = post_login(&app, &http, &pre, "forged", "root", PASSWORD, None).await;
    assert_eq!(r.status(), 403);
    let (pre, csrf) = login_form(&app, &http).await;
    let r = http
        .post(format!("{}/admin/login", app.address))
        .header("cookie", format!("sluice_login={pre}"))
        .header("origin", "https://evil.example")
        .form(&[
            ("username", "root"),
            ("password", PASSWORD),
            ("csrf_token", csrf.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a cross-site login is refused");
}

#[tokio::test]
async fn no_get_changes_anything() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let (id, _) = app.token("alice", Some("5")).await;
    let before = state_counts(&app).await;
    for path in [
        "/admin/",
        "/admin/dashboard/stats",
        "/admin/teams",
        "/admin/users",
        "/admin/tokens",
        "/admin/requests",
        "/admin/reports",
        "/admin/reports.csv",
        "/admin/audit",
        "/admin/audit/verify",
        "/admin/upstreams",
        "/admin/account",
        "/admin/logout",
        &format!("/admin/tokens/{id}/revoke"),
        &format!("/admin/tokens/{id}/rotate"),
        &format!("/admin/tokens/{id}/top-up?amount_usd=5"),
        "/admin/upstreams/a/disable",
        "/admin/account/keys",
        "/admin/api/v1/me",
        "/admin/api/v1/teams",
        "/admin/api/v1/users",
        "/admin/api/v1/tokens",
        &format!("/admin/api/v1/tokens/{id}/revoke"),
        &format!("/admin/api/v1/tokens/{id}/rotate"),
        "/admin/api/v1/reports/spend",
        "/admin/api/v1/requests",
        "/admin/api/v1/audit",
        "/admin/api/v1/upstreams",
        "/admin/api/v1/upstreams/a/disable",
        "/admin/api/v1/keys",
        "/admin/login",
    ] {
        let status = s.get(path).await.status().as_u16();
        assert!(status < 500, "{path}: {status}");
    }
    assert_eq!(state_counts(&app).await, before);
    assert_eq!(
        s.get_json("/admin/api/v1/me").await.0,
        200,
        "still signed in: GET /admin/logout did nothing"
    );
    let r = app
        .chat(&app.token("bob", None).await.1, &chat_body(5))
        .await;
    assert_eq!(r.status(), 200, "the upstream is still enabled");
}

#[tokio::test]
async fn every_admin_route_needs_a_session_and_sub_tokens_never_pass() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let (_, sub_token) = app.token("alice", None).await;
    let s = login(&app, "root").await;
    assert_eq!(
        s.post("/admin/api/v1/teams", &json!({"name": "secret-team"}))
            .await
            .0,
        201
    );
    let http = client();
    let routes = [
        ("GET", "/admin"),
        ("GET", "/admin/"),
        ("GET", "/admin/teams"),
        ("GET", "/admin/users"),
        ("GET", "/admin/tokens"),
        ("GET", "/admin/requests"),
        ("GET", "/admin/reports"),
        ("GET", "/admin/reports.csv"),
        ("GET", "/admin/audit"),
        ("GET", "/admin/upstreams"),
        ("GET", "/admin/account"),
        ("GET", "/admin/nonexistent"),
        ("GET", "/admin/teams/"),
        ("POST", "/admin/teams"),
        ("POST", "/admin/tokens/1/revoke"),
        ("POST", "/admin/logout"),
        ("GET", "/admin/api/v1/teams"),
        ("POST", "/admin/api/v1/teams"),
        ("GET", "/admin/api/v1/tokens"),
        ("POST", "/admin/api/v1/tokens/1/revoke"),
        ("GET", "/admin/api/v1/audit"),
        ("GET", "/admin/api/v1/upstreams"),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", app.address);
        let m: reqwest::Method = method.parse().unwrap();
        for (what, req) in [
            ("nothing", http.request(m.clone(), &url)),
            (
                "a sub-token",
                http.request(m.clone(), &url).bearer_auth(&sub_token),
            ),
            (
                "a sub-token as x-api-key",
                http.request(m.clone(), &url)
                    .header("x-api-key", &sub_token),
            ),
            (
                "a sub-token as the cookie",
                http.request(m.clone(), &url)
                    .header("cookie", format!("sluice_session={sub_token}")),
            ),
            (
                "a forged admin key",
                http.request(m.clone(), &url)
                    .bearer_auth("sk-sl-admin-' OR 1=1 --"),
            ),
        ] {
            let r = req.form(&[("name", "x")]).send().await.unwrap();
            let status = r.status().as_u16();
            let location = r
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap().to_string());
            let body = r.text().await.unwrap();
            let redirected = status == 303 && location.as_deref() == Some("/admin/login");
            assert!(
                status == 401 || redirected || (status == 403 && method == "POST"),
                "{method} {path} with {what}: {status}"
            );
            assert!(!body.contains("secret-team"));
        }
    }
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM teams WHERE name = 'x'")
            .await,
        0
    );

    // Path and Host tricks reach nothing either.
    for target in [
        "//admin/teams",
        "/admin/%2e%2e/admin/teams",
        "/v1/../admin/teams",
        "/admin/static/../teams",
        "/admin/static/%2e%2e/teams",
        "/ADMIN/teams",
        "/Admin/api/v1/teams",
        "/admin//teams",
        "/admin/teams/",
        "/admin/api/v1/teams/",
        "http://127.0.0.1/admin/teams",
        "/admin/./teams",
        "/admin;/teams",
        "/admin/teams%00",
    ] {
        for host in ["127.0.0.1", "gw/#@x", "localhost:1"] {
            let (status, text) = raw(
                &app,
                &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
            )
            .await;
            assert!(
                matches!(status, 303 | 400 | 401 | 404),
                "{target} Host {host}: {status}"
            );
            assert!(!text.contains("secret-team"), "{target} leaked a page");
            if status == 303 {
                assert!(
                    text.contains("location: /admin/login")
                        || text.contains("Location: /admin/login"),
                    "{target}: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn admin_api_keys_act_for_their_owner_and_are_refused_once_revoked() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let (status, v) = s.post("/admin/api/v1/keys", &json!({"name": "ci"})).await;
    assert_eq!(status, 201);
    let key = v["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("sk-sl-admin-"));
    let api = client();
    let r = api
        .post(format!("{}/admin/api/v1/teams", app.address))
        .bearer_auth(&key)
        .json(&json!({"name": "from-ci"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        201,
        "a key needs no CSRF token: it is not ambient"
    );
    // Audited as the owner acting with that key.
    let prefix = &key["sk-sl-admin-".len()..][..8];
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM audit_log WHERE actor = 'root (api key {prefix})' AND action = 'team.create'"
        ))
        .await,
        1
    );
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM admin_api_keys WHERE key_hash = {}",
            sql_blob(app.db(), &sluice::auth::token::hash(&key))
        ))
        .await,
        1,
        "stored as a hash"
    );
    let id: i64 = v["id"].as_i64().unwrap();
    let r = s
        .htmx_form(&format!("/admin/account/keys/{id}/revoke"), &[])
        .await;
    assert_eq!(r.status(), 200);
    let r = api
        .get(format!("{}/admin/api/v1/me", app.address))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A bad Authorization header never falls back to the session cookie.
    let r = api
        .get(format!("{}/admin/api/v1/me", app.address))
        .bearer_auth("nonsense")
        .header("cookie", s.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn pages_render_with_the_security_headers_and_embedded_assets() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    for (path, heading) in [
        ("/admin/", "Dashboard"),
        ("/admin/teams", "Teams"),
        ("/admin/users", "Users"),
        ("/admin/tokens", "Tokens"),
        ("/admin/requests", "Request log"),
        ("/admin/reports", "Spend reports"),
        ("/admin/audit", "Audit log"),
        ("/admin/upstreams", "Upstream keys"),
        ("/admin/account", "Your account"),
    ] {
        let r = s.get(path).await;
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
        assert_eq!(r.headers()["cache-control"], "no-store");
        let body = r.text().await.unwrap();
        assert!(body.contains(&format!("<h1>{heading}</h1>")), "{path}");
        assert!(!body.contains(KEY_A), "no upstream key on {path}");
    }
    let up = s.get("/admin/upstreams").await.text().await.unwrap();
    assert!(
        up.contains("****3a9c"),
        "keys are masked to their last 4 characters"
    );
    let http = client();
    for (file, kind) in [
        ("htmx.min.js", "javascript"),
        ("admin.css", "css"),
        ("admin.js", "javascript"),
    ] {
        let r = http
            .get(format!("{}/admin/static/{file}", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().contains(kind));
    }
    let htmx = get_text(&http, format!("{}/admin/static/htmx.min.js", app.address)).await;
    assert!(htmx.contains("version:\"2.0.4\""), "htmx pinned at 2.0.4");
}

/// S7: a hash made with older parameters is replaced at the next sign-in; a legacy password
/// shorter than today's minimum still signs in (its rehash is postponed, never a refusal).
#[tokio::test]
async fn older_parameters_are_rehashed_at_sign_in_and_a_short_legacy_password_still_works() {
    use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
    let app = spawn_app().await;
    let id = make_login(&app, "root", "admin", None).await;
    let old = |pw: &str| {
        argon2::Argon2::new(
            argon2::Algorithm::Argon2id,
            argon2::Version::V0x13,
            argon2::Params::new(4096, 1, 1, None).unwrap(),
        )
        .hash_password(pw.as_bytes(), &SaltString::generate(&mut OsRng))
        .unwrap()
        .to_string()
    };
    let set = |h: String| format!("UPDATE admins SET password_hash = '{h}' WHERE id = {id}");
    let stored = format!("SELECT password_hash FROM admins WHERE id = {id}");
    let stored = || sql_text(app.db(), &stored);
    sql_exec(app.db(), &set(old(PASSWORD))).await;
    login(&app, "root").await;
    assert!(
        stored()
            .await
            .starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
        "rehashed with today's parameters"
    );
    let legacy = old("hunter22");
    sql_exec(app.db(), &set(legacy.clone())).await;
    login_with(&app, "root", "hunter22").await;
    assert_eq!(stored().await, legacy, "kept until it can be rehashed");
}

/// A successful sign-in takes back only its own attempt: the failures before it still
/// count, so guessing at a name does not start over each time its owner signs in.
#[tokio::test]
async fn a_success_does_not_reset_the_failures_before_it() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    let guess = || post_login(&app, &http, &pre, &csrf, "root", "a wrong guess here", None);
    for _ in 0..4 {
        assert_eq!(guess().await.status(), 401);
    }
    login(&app, "root").await;
    assert_eq!(guess().await.status(), 401, "the fifth guess of the window");
    assert_eq!(
        guess().await.status(),
        429,
        "no sixth, though root signed in"
    );
}
