//! The admin surface against input it cannot read (s32 edge attack F1–F3): a body that
//! never arrives, a body in another type than the API reads, a field it does not know, a
//! flag it cannot read, a query or path value it cannot parse — each refused in the
//! caller's format, naming the problem, with nothing changed.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::admin_helpers::*;
use crate::helpers::*;

/// Sends `head` (a request head declaring a long body, and the start of that body) on a
/// raw connection, then holds the connection open sending nothing: (what came back within
/// 5 s, how long it took).
async fn held_body(app: &TestApp, head: String) -> (String, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got);
                    if let Some((_, body)) = text.split_once("\r\n\r\n") {
                        if !body.is_empty() {
                            break;
                        }
                    }
                }
            }
        }
    })
    .await;
    drop(wr);
    (String::from_utf8_lossy(&got).to_string(), started.elapsed())
}

/// A body that stops short is dropped once the body's time is up, on the sign-in form
/// (anyone can reach it, before any check), a signed-in form and an API key's JSON: the
/// admin read every body without a deadline, so a client could hold sockets and up to
/// 256 KiB each for ever (s32 edge attack F1).
#[tokio::test]
async fn admin_bodies_that_stop_short_are_dropped_within_the_body_timeout() {
    let app = spawn_app_with(|s, _| s.server.body_timeout_seconds = 1).await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let key = key_of(&s, "edge").await;
    let heads = [
        "POST /admin/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 10000\r\n\r\nusername=a".to_string(),
        format!(
            "POST /admin/teams HTTP/1.1\r\nhost: x\r\ncookie: {}\r\nhx-request: true\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 100000\r\n\r\nname=a",
            s.cookie()
        ),
        format!(
            "POST /admin/api/v1/teams HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"name\":"
        ),
    ];
    for head in heads {
        let path = head.split_whitespace().nth(1).unwrap().to_string();
        let (answer, took) = held_body(&app, head).await;
        assert!(
            answer.starts_with("HTTP/1.1 4"),
            "{path}: a 4xx within 5 s, got {answer:?} after {took:?}"
        );
        assert!(answer.contains("in time"), "{path}: {answer}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{path}: {took:?}"
        );
    }
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM teams WHERE name = 'a'")
            .await,
        0
    );
}

/// The sign-in form is small: a body past 16 KiB is refused before it is read.
#[tokio::test]
async fn a_sign_in_body_past_its_size_is_refused() {
    let app = spawn_app().await;
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    let long = "p".repeat(20_000);
    let resp = post_login(&app, &http, &pre, &csrf, "root", &long, None).await;
    assert_eq!(resp.status(), 413);
    // Nor is a compressed one inflated: a chunk is inflated whole before any limit.
    let resp = http
        .post(format!("{}/admin/login", app.address))
        .header("cookie", format!("sluice_login={pre}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 0x08, 0x00])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
}

/// A member of a team, and an admin API key: (member id, key).
async fn member_and_key(app: &TestApp) -> (i64, String) {
    make_login(app, "root", "admin", None).await;
    let s = login(app, "root").await;
    let key = key_of(&s, "edge").await;
    app.token("bob", None).await;
    let id = app
        .scalar("SELECT id FROM users WHERE username = 'bob'")
        .await;
    (id, key)
}

/// Member `id`'s `disabled`, 0 or 1 on either engine (PostgreSQL's is a boolean).
async fn disabled(app: &TestApp, id: i64) -> i64 {
    app.scalar(&format!(
        "SELECT CASE WHEN disabled THEN 1 ELSE 0 END FROM users WHERE id = {id}"
    ))
    .await
}

async fn send(
    app: &TestApp,
    key: &str,
    method: Method,
    path: &str,
    ct: &str,
    body: &str,
) -> (u16, Value) {
    let r = client()
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(key)
        .header("content-type", ct)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// A JSON body sent as a form (`curl -d`), a field the API does not know, a flag it cannot
/// read: each refused naming it, the member as it was. Before, the body was read as a form
/// of no known field, the misspelt field was dropped, and `"True"`, `null` or `2` read as
/// `false` — a 200 that changed nothing, or enabled a member being disabled (s32 edge
/// attack F2).
#[tokio::test]
async fn admin_writes_refuse_what_they_cannot_read() {
    let app = spawn_app().await;
    let (id, key) = member_and_key(&app).await;
    let path = format!("/admin/api/v1/users/{id}");
    let disabled = || disabled(&app, id);
    let (status, v) = send(
        &app,
        &key,
        Method::PATCH,
        &path,
        "Application/JSON",
        r#"{"disabled": true}"#,
    )
    .await;
    assert_eq!(status, 200, "a media type is read whatever its case: {v}");
    assert_eq!(disabled().await, 1);
    let refused = [
        (
            "application/x-www-form-urlencoded",
            r#"{"disabled": false}"#,
            "application/json",
        ),
        ("text/plain", r#"{"disabled": false}"#, "application/json"),
        ("application/json", r#"{"disable": false}"#, "disable"),
        (
            "application/json",
            r#"{"disabled": "maybe", "rpm": 5}"#,
            "disabled",
        ),
        ("application/json", r#"{"disabled": 2}"#, "disabled"),
    ];
    for (ct, body, names) in refused {
        let (status, v) = send(&app, &key, Method::PATCH, &path, ct, body).await;
        let said = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            matches!(status, 400 | 415) && said.contains(names),
            "{ct} {body}: {status} {v}"
        );
        assert_eq!(disabled().await, 1, "{ct} {body}: nothing changed");
    }
    // What is readable still is, in every spelling a client sends; `null` leaves it as
    // it is (a generated client writes every unset field so).
    for (body, want) in [
        (r#"{"disabled": null, "rpm": 5}"#, 1),
        (r#"{"disabled": "True"}"#, 1),
        (r#"{"disabled": "false"}"#, 0),
        (r#"{"disabled": "TRUE"}"#, 1),
        (r#"{"disabled": 0}"#, 0),
    ] {
        let (status, v) = send(&app, &key, Method::PATCH, &path, "application/json", body).await;
        assert_eq!(status, 200, "{body}: {v}");
        assert_eq!(disabled().await, want, "{body}");
    }
}

/// A query or path value the admin cannot parse is answered in the caller's format,
/// naming what it could not read: actix answered it in plain text (s32 edge attack F3).
#[tokio::test]
async fn unparseable_query_and_path_values_answer_in_the_admin_format() {
    let app = spawn_app().await;
    let (_, key) = member_and_key(&app).await;
    for (method, path, names) in [
        (Method::GET, "/admin/api/v1/requests?page=abc", "abc"),
        (
            Method::GET,
            "/admin/api/v1/tokens?user=99999999999999999999",
            "user",
        ),
        (Method::GET, "/admin/api/v1/audit?page=1&page=2", "page"),
        (Method::PATCH, "/admin/api/v1/teams/abc", "abc"),
        (Method::POST, "/admin/api/v1/tokens/1e3/revoke", "1e3"),
    ] {
        let r = client()
            .request(method.clone(), format!("{}{path}", app.address))
            .bearer_auth(&key)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(matches!(status, 400 | 404), "{method} {path}: {status}");
        assert!(ct.starts_with("application/json"), "{method} {path}: {ct}");
        let said = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            v["error"]["code"].is_string() && said.contains(names),
            "{method} {path}: {v}"
        );
    }
}

/// An empty flag or a list of flags in JSON is refused, not read as `false` — a script
/// with an unset variable (`{"disabled": "$DISABLE"}`) re-enabled the member it meant to
/// keep disabled (s32 diff2 attack F1).
#[tokio::test]
async fn an_empty_or_list_flag_on_an_edit_is_refused() {
    let app = spawn_app().await;
    let (id, key) = member_and_key(&app).await;
    let path = format!("/admin/api/v1/users/{id}");
    let json = "application/json";
    let (status, _) = send(
        &app,
        &key,
        Method::PATCH,
        &path,
        json,
        r#"{"disabled": true}"#,
    )
    .await;
    assert_eq!(status, 200);
    for body in [
        r#"{"disabled": ""}"#,
        r#"{"disabled": " "}"#,
        r#"{"disabled": []}"#,
        r#"{"disabled": ["maybe", false]}"#,
    ] {
        let (status, v) = send(&app, &key, Method::PATCH, &path, json, body).await;
        let said = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            status == 400 && said.contains("disabled"),
            "{body}: {status} {v}"
        );
        assert_eq!(disabled(&app, id).await, 1, "{body}");
    }
}

/// The API is told by the path actix routes, percent-decoded: `/admin/%61pi/v1/…` reached
/// the API's handler but was judged by its raw path — a JSON body sent as a form read as
/// one of no field (200, nothing changed) and its errors answered as pages (s32 diff2
/// attack F2). A gzip body is read as actix's extractor read it, and a field's name is
/// said once (F3, F4).
#[tokio::test]
async fn the_api_is_told_by_its_routed_path_and_a_gzip_body_is_read() {
    use std::io::Write;
    let app = spawn_app().await;
    let (id, key) = member_and_key(&app).await;
    let encoded = format!("/admin/%61pi/v1/users/{id}");
    let form = "application/x-www-form-urlencoded";
    let (status, v) = send(
        &app,
        &key,
        Method::PATCH,
        &encoded,
        form,
        r#"{"disabled": true}"#,
    )
    .await;
    assert_eq!(status, 415, "{v}");
    assert!(v["error"]["message"].is_string(), "answered in JSON: {v}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(br#"{"disabled": true}"#).unwrap();
    let r = client()
        .patch(format!("{}/admin/api/v1/users/{id}", app.address))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gz.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(disabled(&app, id).await, 1);
    let r = client()
        .patch(format!("{}/admin/api/v1/users/{id}", app.address))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .header("content-encoding", "br")
        .body(r#"{"disabled": false}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("br"),
        "{v}"
    );
    let (token_id, _) = app.token("carol", None).await;
    let (status, v) = send(
        &app,
        &key,
        Method::PATCH,
        &format!("/admin/api/v1/tokens/{token_id}"),
        "application/json",
        r#"{"models": []}"#,
    )
    .await;
    let said = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        status == 400 && said.starts_with("models: ") && !said.contains("models: models"),
        "{v}"
    );
}

/// `data` compressed as `coding` names it: `gzip`, or `deflate` (zlib-wrapped, RFC 9110
/// §8.4.1.2).
fn compressed(coding: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let level = flate2::Compression::best();
    if coding == "deflate" {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), level);
        z.write_all(data).unwrap();
        return z.finish().unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), level);
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// A compressed body is held to the limit as it is inflated: a gzip body of 64 KiB on the
/// wire that inflates to 64 MiB (a write the API would obey, its tail JSON whitespace) is
/// refused 413 with nothing changed, from an API key and on a signed-in form whose CSRF
/// field the gate reads. actix's `Decompress` inflated each chunk whole before the limit
/// saw it — tens of megabytes per request (s33 gzip). A gzip form within the limit is read
/// by the gate and put back for the handler. A zlib `deflate` body and an `x-gzip` one are
/// read (`x-gzip` was passed through undecoded: actix knows no such coding); a cut or
/// corrupt gzip body is a 400.
#[tokio::test]
async fn a_compressed_admin_body_is_held_to_the_limit_as_it_is_inflated() {
    let app = spawn_app().await;
    let (id, key) = member_and_key(&app).await;
    let path = format!("{}/admin/api/v1/users/{id}", app.address);
    let patch = |coding: &'static str, body: Vec<u8>| {
        client()
            .patch(&path)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .header("content-encoding", coding)
            .body(body)
            .send()
    };
    let mut bomb = br#"{"disabled": true}"#.to_vec();
    bomb.resize(64 << 20, b' ');
    let bomb = compressed("gzip", &bomb);
    assert!(bomb.len() < 256 * 1024, "{} bytes on the wire", bomb.len());
    let r = patch("gzip", bomb).await.unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    assert_eq!(disabled(&app, id).await, 0);

    // The gate reads a signed-in form's CSRF field from the body before any handler.
    let s = login(&app, "root").await;
    let mut form = format!("name=bomb&csrf_token={}&", s.csrf).into_bytes();
    form.resize(64 << 20, b'&');
    let r = client()
        .post(format!("{}/admin/teams", app.address))
        .header("cookie", s.cookie())
        .header("content-type", "application/x-www-form-urlencoded")
        .header("content-encoding", "gzip")
        .body(compressed("gzip", &form))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM teams WHERE name = 'bomb'")
            .await,
        0
    );
    // One within the limit is read by the gate and put back, decoded, for the handler.
    let form = format!("name=gz&csrf_token={}", s.csrf);
    let r = client()
        .post(format!("{}/admin/teams", app.address))
        .header("cookie", s.cookie())
        .header("content-type", "application/x-www-form-urlencoded")
        .header("content-encoding", "gzip")
        .body(compressed("gzip", form.as_bytes()))
        .send()
        .await
        .unwrap();
    assert!(r.status().as_u16() < 400, "{}", r.status());
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM teams WHERE name = 'gz'")
            .await,
        1
    );

    let r = patch("deflate", compressed("deflate", br#"{"disabled": true}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(disabled(&app, id).await, 1);
    let r = patch("x-gzip", compressed("gzip", br#"{"disabled": false}"#))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(disabled(&app, id).await, 0);

    let whole = compressed("gzip", br#"{"disabled": true}"#);
    let cut = whole[..whole.len() - 6].to_vec();
    let mut corrupt = whole.clone();
    let crc = corrupt.len() - 8;
    corrupt[crc] ^= 0xff;
    for (what, body) in [("cut", cut), ("corrupt", corrupt)] {
        let r = patch("gzip", body).await.unwrap();
        assert_eq!(r.status(), 400, "{what}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be read")),
            "{what}: {v}"
        );
    }
    assert_eq!(disabled(&app, id).await, 0);
}
