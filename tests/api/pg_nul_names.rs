//! Free-text names an admin gives (a token's name, an admin API key's name) holding a NUL
//! character, on both engines. PostgreSQL's `text` cannot hold NUL; SQLite can. SQLite
//! stored the name (201) and PostgreSQL refused it with a 409 `conflict` (store/pg/text.rs):
//! the same request answered differently by engine, and the NUL kept in SQLite then stopped
//! `sluice migrate-store` with "invalid byte sequence for encoding \"UTF8\": 0x00".
//! Fixed where every admin body is read (`admin::input`): a NUL anywhere is a 400 naming
//! the field, on both engines.

use serde_json::json;

use crate::admin_helpers::{login, make_login, Session};
use crate::helpers::TestApp;
use crate::pg_admin::{spawn_on, Engine, ENGINES};

/// A new app on `engine` with `root` signed in.
async fn root_on(engine: Engine) -> (TestApp, Session) {
    let app = spawn_on(engine).await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    (app, admin)
}

/// Each of `paths` fetched as JSON by `admin`: never an engine's error (a 5xx, or the 409
/// of a refused NUL); each path with its status and body.
async fn json_answers<'p>(
    engine: Engine,
    admin: &Session,
    paths: &[&'p str],
) -> Vec<(&'p str, u16, serde_json::Value)> {
    let mut these = Vec::new();
    for &path in paths {
        let (status, body) = admin.get_json(path).await;
        assert!(
            status < 500 && status != 409,
            "{engine:?} {path}: {status} {body}"
        );
        these.push((path, status, body));
    }
    these
}

#[tokio::test]
async fn a_nul_in_a_token_or_key_name_is_refused_alike_on_both_engines() {
    for engine in ENGINES {
        let (app, admin) = root_on(engine).await;
        let (token_id, _) = app.token("nelly", Some("5")).await;
        let user_id = app
            .scalar(&format!("SELECT user_id FROM tokens WHERE id = {token_id}"))
            .await;
        let tokens_before = app.scalar("SELECT COUNT(*) FROM tokens").await;

        let (status, body) = admin
            .post(
                "/admin/api/v1/tokens",
                &json!({"user_id": user_id, "name": "ci\u{0}bot", "budget_usd": "1"}),
            )
            .await;
        assert_eq!(status, 400, "{engine:?}: a token name with a NUL: {body}");
        assert_eq!(
            body["error"]["code"], "invalid_request",
            "{engine:?}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("name"),
            "{engine:?}: the field is named: {body}"
        );
        assert_eq!(
            app.scalar("SELECT COUNT(*) FROM tokens").await,
            tokens_before,
            "{engine:?}: no token was issued"
        );

        let (status, body) = admin
            .post("/admin/api/v1/keys", &json!({"name": "ci\u{0}"}))
            .await;
        assert_eq!(
            status, 400,
            "{engine:?}: an API key name with a NUL: {body}"
        );
        assert_eq!(
            body["error"]["code"], "invalid_request",
            "{engine:?}: {body}"
        );
        assert_eq!(
            app.scalar("SELECT COUNT(*) FROM admin_api_keys").await,
            0,
            "{engine:?}: no key was made"
        );
    }
}

/// A search filter holding a NUL matches nothing on either engine (nothing stored holds
/// one): the same answer on both, never an engine's error.
#[tokio::test]
async fn a_nul_in_a_search_filter_answers_alike_on_both_engines() {
    let paths = [
        "/admin/api/v1/requests?model=gpt%00x",
        "/admin/api/v1/audit?action=token%00",
        "/admin/api/v1/audit?actor=root%00",
        "/admin/api/v1/reports/spend?by=model&model=a%00",
    ];
    let mut answers = Vec::new();
    for engine in ENGINES {
        let (_app, admin) = root_on(engine).await;
        answers.push(json_answers(engine, &admin, &paths).await);
    }
    assert_eq!(
        answers[0], answers[1],
        "SQLite's answers, then PostgreSQL's"
    );
}

/// Admin input that reaches the store outside a body (query strings, path segments), with a
/// NUL or bytes that are not UTF-8: the same status and body on both engines, never an
/// engine's error (s6-attadmin).
#[tokio::test]
async fn nul_and_invalid_utf8_outside_admin_bodies_answer_alike_on_both_engines() {
    let json_paths = [
        "/admin/api/v1/requests?status=2%00x",
        "/admin/api/v1/requests?from=2026-11-01%00&to=2026-11-30",
        "/admin/api/v1/requests?to=2026-11-30%00",
        "/admin/api/v1/requests?model=gpt%FFx",
        "/admin/api/v1/requests?model=%00&page=2",
        "/admin/api/v1/audit?actor=%FF%FE",
        "/admin/api/v1/audit?action=%00&page=1",
        "/admin/api/v1/reports/spend?month=2026-11%00",
        "/admin/api/v1/reports/spend?by=model%00",
        "/admin/api/v1/reports/spend?by=user&format=csv%00",
        "/admin/api/v1/users?team=1%00",
        "/admin/api/v1/tokens?user=%00",
        "/admin/api/v1/teams/1%00",
    ];
    let page_paths = [
        "/admin/requests?model=a%00b",
        "/admin/requests?status=%00",
        "/admin/audit?actor=%00",
        "/admin/reports?month=%00",
        "/admin/reports.csv?month=2026-11&by=model%00",
        "/admin/static/%00",
        "/admin/upstreams/a%00/disable",
    ];
    let mut answers = Vec::new();
    for engine in ENGINES {
        let (_app, admin) = root_on(engine).await;
        let mut these = json_answers(engine, &admin, &json_paths).await;
        for path in page_paths {
            let status = admin.get(path).await.status().as_u16();
            assert!(status < 500 && status != 409, "{engine:?} {path}: {status}");
            these.push((path, status, serde_json::Value::Null));
        }
        let (status, body) = admin
            .post("/admin/api/v1/upstreams/a%00/disable", &json!({}))
            .await;
        assert!(status < 500 && status != 409, "{engine:?}: {status} {body}");
        these.push(("upstreams toggle", status, body));
        answers.push(these);
    }
    for (a, b) in answers[0].iter().zip(&answers[1]) {
        assert_eq!(a, b, "SQLite's answer, then PostgreSQL's");
    }
}
