//! Free-text names an admin gives (a token's name, an admin API key's name) holding a NUL
//! character, on both engines. PostgreSQL's `text` cannot hold NUL; SQLite can. Today
//! SQLite stores the name (201) and PostgreSQL refuses it with a 409 `conflict` (store/pg/text.rs):
//! the same request answers differently by engine, and the NUL kept in SQLite then stops
//! `sluice migrate-store` with "invalid byte sequence for encoding \"UTF8\": 0x00".
//! The product should answer alike: a 400 naming the field, nothing stored, on both.
//! Found by the SDK/browser PostgreSQL pass's probing (part D); the fix is in the admin
//! files (part A), so the test is ignored until then.

use serde_json::json;

use crate::admin_helpers::{login, make_login};
use crate::pg_admin::{spawn_on, ENGINES};

#[tokio::test]
#[ignore = "finding: a NUL in a token or API key name is stored on SQLite (201) and refused on PostgreSQL (409); both should refuse it with 400 (admin files)"]
async fn a_nul_in_a_token_or_key_name_is_refused_alike_on_both_engines() {
    for engine in ENGINES {
        let app = spawn_on(engine).await;
        make_login(&app, "root", "admin", None).await;
        let admin = login(&app, "root").await;
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
