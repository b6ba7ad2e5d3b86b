//! The signed-in person's own credentials: an API key never mints another API key.

use serde_json::json;

use crate::admin_helpers::*;
use crate::helpers::*;

async fn key_of(s: &Session, name: &str) -> String {
    let (status, v) = s.post("/admin/api/v1/keys", &json!({ "name": name })).await;
    assert_eq!(status, 201, "{v}");
    v["key"].as_str().unwrap().to_string()
}

/// An API key acts for its owner but cannot mint more keys: a leaked key cannot make
/// itself permanent. Only a signed-in browser session creates keys.
#[tokio::test]
async fn an_api_key_cannot_mint_api_keys() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let key = key_of(&s, "ci").await;
    let r = client()
        .post(format!("{}/admin/api/v1/keys", app.address))
        .bearer_auth(&key)
        .json(&json!({"name": "persistence"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "forbidden", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("API key") && msg.contains("signed-in"),
        "the reason is named: {msg}"
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM admin_api_keys").await, 1);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'apikey.create'")
            .await,
        1
    );
}
