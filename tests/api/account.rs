//! The signed-in person's own credentials: a password change is throttled like a sign-in
//! (a wrong current password is a guess), it revokes the admin's API keys and ends their
//! other sessions, an admin's reset of someone's password does the same to theirs, and an
//! API key never mints another API key.

use futures_util::future::join_all;
use serde_json::json;

use crate::admin_helpers::*;
use crate::helpers::*;

const NEW_PASSWORD: &str = "an entirely new passphrase";

/// A gateway with the admin `root` signed in and an API key of theirs, `ci`.
async fn root_with_a_key() -> (TestApp, Session, String) {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let key = key_of(&s, "ci").await;
    (app, s, key)
}

/// The account page's password change, from `PASSWORD` to `NEW_PASSWORD`.
async fn change_password(s: &Session) -> reqwest::Response {
    s.htmx_form(
        "/admin/account/password",
        &[
            ("current_password", PASSWORD),
            ("new_password", NEW_PASSWORD),
        ],
    )
    .await
}

/// A 403 whose message says an API key may not do this, only a signed-in session; the body.
async fn refused_to_a_key(r: reqwest::Response, what: &str) -> serde_json::Value {
    assert_eq!(r.status(), 403, "{what}");
    let v: serde_json::Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("API key") && msg.contains("signed-in"),
        "the reason is named: {v}"
    );
    v
}

/// S6 for the account page: ten wrong current passwords at once are at most five guesses
/// (the sign-in throttle's per-user limit, shared with the sign-in form), and then even the
/// right one is refused with `Retry-After` until the window has passed.
#[tokio::test]
async fn wrong_current_passwords_throttle_a_password_change() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let wrong: Vec<_> = (0..10)
        .map(|i| {
            let current = format!("not my password {i}");
            let s = &s;
            async move {
                let r = s
                    .htmx_form(
                        "/admin/account/password",
                        &[
                            ("current_password", current.as_str()),
                            ("new_password", NEW_PASSWORD),
                        ],
                    )
                    .await;
                (r.status().as_u16(), r.text().await.unwrap())
            }
        })
        .collect();
    let answers = join_all(wrong).await;
    let guessed = answers.iter().filter(|(s, _)| *s == 403).count();
    assert!((1..=5).contains(&guessed), "{answers:?}");
    assert!(
        answers.iter().all(|(s, _)| *s == 403 || *s == 429),
        "{answers:?}"
    );
    let r = change_password(&s).await;
    assert_eq!(r.status(), 429, "the right password is throttled too");
    let retry = retry_after(r.headers());
    assert!((1..=900).contains(&retry), "{retry}");
    assert!(r.text().await.unwrap().contains("Try again in"));
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.password_change'")
            .await,
        0,
        "the password did not change"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.password_change_failed'")
            .await,
        guessed as i64
    );
}

/// A password change ends what the old password opened: the admin's API keys are revoked
/// (one audit row says how many), their other sessions end, this browser gets a new one.
#[tokio::test]
async fn a_password_change_revokes_the_admins_api_keys() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    make_login(&app, "ops", "admin", None).await;
    let s = login(&app, "root").await;
    let other = login(&app, "root").await;
    let (k1, k2) = (key_of(&s, "ci").await, key_of(&s, "cron").await);
    let ops = login(&app, "ops").await;
    let ops_key = key_of(&ops, "ops-ci").await;
    assert_eq!(me_with_key(&app, &k1).await, 200);

    let r = change_password(&s).await;
    assert_eq!(r.status(), 200);
    assert_eq!(me_with_key(&app, &k1).await, 401, "key revoked");
    assert_eq!(me_with_key(&app, &k2).await, 401, "key revoked");
    assert_eq!(
        me_with_key(&app, &ops_key).await,
        200,
        "another admin's key stays"
    );
    assert_eq!(other.get_json("/admin/api/v1/me").await.0, 401);
    assert_eq!(
        app.scalar(
            "SELECT COUNT(*) FROM admin_api_keys k JOIN admins a ON a.id = k.admin_id
             WHERE a.username = 'root' AND k.revoked_at IS NULL"
        )
        .await,
        0
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.password_change'")
            .await,
        1,
        "one audit row"
    );
    let after = audit_after(&app, "admin.password_change").await;
    assert_eq!(after["api_keys_revoked"], 2, "it names what ended: {after}");
    assert_eq!(after["sessions_ended"], 2, "it names what ended: {after}");
}

/// The `after` of the one audit row of `action`, as JSON (read the same on both engines).
async fn audit_after(app: &TestApp, action: &str) -> serde_json::Value {
    let sql = format!("SELECT after FROM audit_log WHERE action = '{action}'");
    serde_json::from_str(&sql_text(app.db(), &sql).await).expect("the row's after is JSON")
}

/// An admin resetting another login's password revokes that login's keys and sessions too.
#[tokio::test]
async fn a_password_reset_by_an_admin_revokes_the_targets_api_keys() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let ops_id = make_login(&app, "ops", "admin", None).await;
    let root = login(&app, "root").await;
    let ops = login(&app, "ops").await;
    let ops_key = key_of(&ops, "ops-ci").await;
    let root_key = key_of(&root, "ci").await;
    let (status, v) = root
        .patch(
            &format!("/admin/api/v1/logins/{ops_id}"),
            &json!({ "password": NEW_PASSWORD }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(me_with_key(&app, &ops_key).await, 401);
    assert_eq!(ops.get_json("/admin/api/v1/me").await.0, 401);
    assert_eq!(me_with_key(&app, &root_key).await, 200);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.update'")
            .await,
        1
    );
    let after = audit_after(&app, "admin.update").await;
    assert_eq!(after["api_keys_revoked"], 1, "{after}");
}

/// A login's keys act as the login does now: promoting a lead made every key it had minted
/// (perhaps leaked) an admin key, and moving it moved its keys to the new team, none of
/// them ever confirmed in a session — a role or team change ends them as a password reset
/// does (s29 admin attack F1).
#[tokio::test]
async fn a_role_or_team_change_ends_the_logins_api_keys() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let lead_id = make_login(&app, "lead", "lead", Some("core")).await;
    let root = login(&app, "root").await;
    let (status, other) = root
        .post("/admin/api/v1/teams", &json!({"name": "other"}))
        .await;
    assert_eq!(status, 201, "{other}");
    for (change, revoked) in [
        (json!({"role": "admin"}), 1),
        (json!({"role": "lead", "team_id": other["id"]}), 1),
        (json!({"disabled": false}), 0),
    ] {
        let lead = login(&app, "lead").await;
        let key = key_of(&lead, "script").await;
        assert_eq!(me_with_key(&app, &key).await, 200);
        let (status, v) = root
            .patch(&format!("/admin/api/v1/logins/{lead_id}"), &change)
            .await;
        assert_eq!(status, 200, "{change}: {v}");
        let sql =
            "SELECT after FROM audit_log WHERE action = 'admin.update' ORDER BY id DESC LIMIT 1";
        let after: serde_json::Value =
            serde_json::from_str(&sql_text(app.db(), sql).await).unwrap();
        if revoked > 0 {
            assert_eq!(me_with_key(&app, &key).await, 401, "{change}");
            assert_eq!(after["api_keys_revoked"], revoked, "{change}: {after}");
        } else {
            assert_eq!(
                me_with_key(&app, &key).await,
                200,
                "{change}: nothing changed"
            );
        }
    }
}

/// An API key acts for its owner but cannot mint more keys: a leaked key cannot make
/// itself permanent. Only a signed-in browser session creates keys.
#[tokio::test]
async fn an_api_key_cannot_mint_api_keys() {
    let (app, _, key) = root_with_a_key().await;
    let r = client()
        .post(format!("{}/admin/api/v1/keys", app.address))
        .bearer_auth(&key)
        .json(&json!({"name": "persistence"}))
        .send()
        .await
        .unwrap();
    let v = refused_to_a_key(r, "a key minting a key").await;
    assert_eq!(v["error"]["code"], "forbidden", "{v}");
    assert_eq!(app.scalar("SELECT COUNT(*) FROM admin_api_keys").await, 1);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'apikey.create'")
            .await,
        1
    );
}

/// The two-step way round the rule above: a leaked key that could create a login, or set
/// a login's password or role, could sign in with it in a browser and mint keys there. So
/// credentials and privileges change only in a signed-in session; a key may still create
/// members (no login), edit them and disable a login (a kill switch).
#[tokio::test]
async fn an_api_key_cannot_make_or_arm_a_login() {
    let (app, s, key) = root_with_a_key().await;
    let ops_id = make_login(&app, "ops", "finance", None).await;
    let team = s
        .post("/admin/api/v1/teams", &json!({"name": "core"}))
        .await
        .1["id"]
        .as_i64()
        .unwrap();
    let with_key = |method: reqwest::Method, path: String, body: serde_json::Value| {
        client()
            .request(method, format!("{}{path}", app.address))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    let refused = [
        (
            reqwest::Method::POST,
            "/admin/api/v1/users".to_string(),
            json!({"username": "mallory", "role": "admin", "password": NEW_PASSWORD}),
        ),
        (
            reqwest::Method::PATCH,
            format!("/admin/api/v1/logins/{ops_id}"),
            json!({"password": NEW_PASSWORD}),
        ),
        (
            reqwest::Method::PATCH,
            format!("/admin/api/v1/logins/{ops_id}"),
            json!({"role": "admin"}),
        ),
        (
            reqwest::Method::PATCH,
            format!("/admin/api/v1/logins/{ops_id}"),
            json!({"team_id": team}),
        ),
    ];
    for (method, path, body) in refused {
        let r = with_key(method, path.clone(), body.clone()).await.unwrap();
        refused_to_a_key(r, &format!("{path} {body}")).await;
    }
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM admins WHERE username = 'mallory'")
            .await,
        0
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'admin.update'")
            .await,
        0,
        "nothing changed"
    );
    // What stays open to automation: members, and disabling a login.
    let r = with_key(
        reqwest::Method::POST,
        "/admin/api/v1/users".into(),
        json!({"username": "bob", "team_id": team}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let r = with_key(
        reqwest::Method::PATCH,
        format!("/admin/api/v1/logins/{ops_id}"),
        json!({"disabled": true}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
}

/// Re-enabling is arming too: a login an admin disabled (its password leaked, its owner
/// left) would let whoever knows that password sign in and mint keys, and its API keys
/// would work again. A key may disable a login (an incident script), never enable one.
#[tokio::test]
async fn an_api_key_cannot_enable_a_disabled_login() {
    let (app, s, key) = root_with_a_key().await;
    let old_id = make_login(&app, "old-admin", "admin", None).await;
    let patch = |body: serde_json::Value| {
        client()
            .patch(format!("{}/admin/api/v1/logins/{old_id}", app.address))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };
    let r = patch(json!({"disabled": true})).await.unwrap();
    assert_eq!(r.status(), 200);
    let r = patch(json!({"disabled": false})).await.unwrap();
    refused_to_a_key(r, "a key enabling a login").await;
    let disabled = app
        .scalar(&format!(
            "SELECT CASE WHEN disabled THEN 1 ELSE 0 END FROM admins WHERE id = {old_id}"
        ))
        .await;
    assert_eq!(disabled, 1, "the login stays disabled");
    // Disabling again with a key is still fine (nothing to arm), and a session may enable.
    let r = patch(json!({"disabled": true})).await.unwrap();
    assert_eq!(r.status(), 200);
    let (status, v) = s
        .patch(
            &format!("/admin/api/v1/logins/{old_id}"),
            &json!({"disabled": false}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["disabled"], json!(false));
}

/// The HTML form routes take an API key too (the gate accepts one anywhere under /admin):
/// every credential change refused there as on the JSON API, with the reason, and nothing
/// changed.
#[tokio::test]
async fn the_form_routes_refuse_credential_changes_to_an_api_key() {
    let (app, s, key) = root_with_a_key().await;
    let ops_id = make_login(&app, "ops", "finance", None).await;
    let (status, _) = s
        .patch(
            &format!("/admin/api/v1/logins/{ops_id}"),
            &json!({"disabled": true}),
        )
        .await;
    assert_eq!(status, 200);
    let before = state_counts(&app).await;
    let new = NEW_PASSWORD;
    let ops = format!("/admin/logins/{ops_id}");
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "/admin/account/password",
            vec![("current_password", PASSWORD), ("new_password", new)],
        ),
        ("/admin/account/keys", vec![("name", "successor")]),
        (
            "/admin/users",
            vec![
                ("username", "mallory"),
                ("role", "admin"),
                ("password", new),
            ],
        ),
        (&ops, vec![("password", new)]),
        (&ops, vec![("role", "admin")]),
        (&ops, vec![("disabled", "false")]),
    ];
    for (path, form) in cases {
        let r = client()
            .post(format!("{}{path}", app.address))
            .bearer_auth(&key)
            .header("hx-request", "true")
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path} {form:?}");
        let body = r.text().await.unwrap();
        assert!(
            body.contains("API key"),
            "{path}: the reason is named: {body}"
        );
    }
    assert_eq!(state_counts(&app).await, before, "nothing changed");
    assert_eq!(
        app.scalar(&format!(
            "SELECT CASE WHEN disabled THEN 1 ELSE 0 END FROM admins WHERE id = {ops_id}"
        ))
        .await,
        1
    );
}

/// Review s21 #3: a key asked for while the owner's password change was ending every
/// session and key was written after it, and outlived the change (the gate checks the
/// session before the request's transaction; nothing checked it inside). The request
/// waits on another writer holding the store; that writer ends root's sessions and keys
/// as a password change does; the key request is then refused as an ended session, and no
/// live key of root's exists.
#[tokio::test]
async fn a_key_asked_for_while_the_session_ends_does_not_survive() {
    let app = spawn_app().await;
    let id = make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let mut held = hold_the_store(&app.settings.database.url).await;
    let body = json!({"name": "k"});
    let ask = s.post("/admin/api/v1/keys", &body);
    let end = async {
        // No signal says the request now waits on the store: it had time to get there.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        held.exec(&format!("DELETE FROM admin_sessions WHERE admin_id = {id}"))
            .await;
        held.exec(&format!(
            "UPDATE admin_api_keys SET revoked_at = '2026-01-01T00:00:00.000Z'
             WHERE admin_id = {id} AND revoked_at IS NULL"
        ))
        .await;
        held.release().await;
    };
    let ((status, v), ()) = tokio::join!(ask, end);
    if status == 201 {
        let key = v["key"].as_str().unwrap_or_default();
        assert_eq!(
            me_with_key(&app, key).await,
            401,
            "the key outlived the change"
        );
    }
    assert_eq!(status, 401, "{v}");
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM admin_api_keys WHERE admin_id = {id} AND revoked_at IS NULL"
        ))
        .await,
        0
    );
}

/// Review s21 #3, for a key: a write by an API key revoked while the write waited is
/// refused as an ended session would be.
#[tokio::test]
async fn a_write_by_a_key_revoked_meanwhile_is_refused() {
    // Final review (s21, F1): a key whose owner was disabled meanwhile (keys are not
    // revoked by disabling) still wrote, as its row alone was read; so did one whose owner
    // was made finance meanwhile (a role change ends sessions, not keys).
    for ended in [
        "UPDATE admin_api_keys SET revoked_at = '2026-01-01T00:00:00.000Z'",
        "UPDATE admins SET disabled = TRUE",
        "UPDATE admins SET role = 'finance'",
    ] {
        let (app, _s, key) = root_with_a_key().await;
        let mut held = hold_the_store(&app.settings.database.url).await;
        let write = client()
            .post(format!("{}/admin/api/v1/teams", app.address))
            .bearer_auth(&key)
            .json(&json!({"name": "late"}))
            .send();
        let revoke = async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            held.exec(ended).await;
            held.release().await;
        };
        let (r, ()) = tokio::join!(write, revoke);
        let r = r.unwrap();
        assert_eq!(r.status(), 401, "{ended}: {}", r.text().await.unwrap());
        assert_eq!(
            app.scalar("SELECT COUNT(*) FROM teams WHERE name = 'late'")
                .await,
            0,
            "{ended}"
        );
    }
}

/// Review s21 #1 for the Account page: a password change whose current password was
/// checked against a hash that was replaced meanwhile (an admin's reset, say) changes
/// nothing and says why; the reset's password stands.
#[tokio::test]
async fn a_password_change_checked_against_a_replaced_password_fails() {
    let app = spawn_app().await;
    let id = make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let reset = sluice::auth::password::hash("the password an admin set").unwrap();
    let held = app.state.passwords.occupy().await.expect("permits");
    let replace = async {
        crate::signin_attack::until_one_waits_for_a_permit(&app).await;
        sql_exec(
            app.db(),
            &format!("UPDATE admins SET password_hash = '{reset}' WHERE id = {id}"),
        )
        .await;
        drop(held);
    };
    let (r, ()) = tokio::join!(change_password(&s), replace);
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("changed meanwhile"), "{body}");
    assert_eq!(
        sql_text(
            app.db(),
            &format!("SELECT password_hash FROM admins WHERE id = {id}")
        )
        .await,
        reset
    );
}

/// Final review F6: a password change whose session ended while its current password was
/// checked (a sign-out elsewhere, an admin's disabling) changes nothing (401) — and the
/// right password it typed was counted as a failed guess: the withdrawal of its attempt
/// rolled back with the refused change. It counts as nothing.
#[tokio::test]
async fn a_password_change_whose_session_ended_meanwhile_counts_no_failure() {
    let app = spawn_app().await;
    let id = make_login(&app, "root", "admin", None).await;
    let s = login(&app, "root").await;
    let held = app.state.passwords.occupy().await.expect("permits");
    let end = async {
        crate::signin_attack::until_one_waits_for_a_permit(&app).await;
        sql_exec(
            app.db(),
            &format!("DELETE FROM admin_sessions WHERE admin_id = {id}"),
        )
        .await;
        drop(held);
    };
    let (r, ()) = tokio::join!(change_password(&s), end);
    assert_eq!(r.status(), 401, "{}", r.text().await.unwrap());
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM login_failures").await,
        0,
        "the right password counted as a failure"
    );
    login(&app, "root").await;
}

/// Final review (s21, F2): an API key revoking itself through the form route — a leaked
/// key's clean-up script — was refused once every write re-checked its credential inside
/// its transaction: the revoke came first, the check after found the key revoked, and the
/// whole revoke rolled back (401, the key still live). The check comes before the revoke.
#[tokio::test]
async fn an_api_key_can_revoke_itself() {
    let (app, _s, key) = root_with_a_key().await;
    let id = app.scalar("SELECT id FROM admin_api_keys").await;
    let r = client()
        .post(format!("{}/admin/account/keys/{id}/revoke", app.address))
        .bearer_auth(&key)
        .header("hx-request", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(me_with_key(&app, &key).await, 401, "the key revoked");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'apikey.revoke'")
            .await,
        1
    );
}

/// s26 attack admin #2: a password is taken byte for byte everywhere. The forms and the API
/// trimmed it while the sign-in form did not: a password set with edge spaces (Account page,
/// an admin's reset, a new login) never signed in, and one set by the CLI with an edge space
/// could never be changed in the browser (its current password arrived trimmed: a wrong
/// guess, five of which locked the name).
#[tokio::test]
async fn a_password_with_edge_spaces_is_kept_byte_for_byte() {
    let app = spawn_app().await;
    let spaced = format!("  {PASSWORD} ");
    sluice::cli::admin_create(
        app.db(),
        "root",
        "admin",
        None,
        spaced.clone(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
    let root = login_with(&app, "root", &spaced).await;
    let next = format!(" {NEW_PASSWORD}  ");
    let r = root
        .htmx_form(
            "/admin/account/password",
            &[
                ("current_password", spaced.as_str()),
                ("new_password", &next),
            ],
        )
        .await;
    assert_eq!(r.status(), 200, "the current password as typed is right");
    login_with(&app, "root", &next).await;

    let root = login_with(&app, "root", &next).await;
    let ops_id = make_login(&app, "ops", "admin", None).await;
    let (status, v) = root
        .patch(
            &format!("/admin/api/v1/logins/{ops_id}"),
            &json!({ "password": spaced }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    login_with(&app, "ops", &spaced).await;
}

/// s26 attack admin #4: an action taken with an API key names the key in its audit row
/// (`root (api key <prefix>)`, the prefix its `apikey.create` row shows), so a leaked key's
/// actions can be told from the owner's own and the one key revoked. Before, both rows
/// named `root` alone.
#[tokio::test]
async fn an_action_with_an_api_key_names_the_key_in_the_audit_log() {
    let (app, root, key) = root_with_a_key().await;
    let team = json!({"name": "by-session"});
    assert_eq!(root.post("/admin/api/v1/teams", &team).await.0, 201);
    let resp = client()
        .post(format!("{}/admin/api/v1/teams", app.address))
        .bearer_auth(&key)
        .json(&json!({"name": "by-key"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let actors: Vec<(String,)> = sql_rows(
        app.db(),
        "SELECT actor FROM audit_log WHERE action = 'team.create' ORDER BY id",
    )
    .await;
    let created = sql_text(
        app.db(),
        "SELECT after FROM audit_log WHERE action = 'apikey.create'",
    )
    .await;
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let prefix = created["prefix"].as_str().unwrap();
    assert!(key.contains(prefix));
    assert_eq!(
        actors,
        [("root".to_string(),), (format!("root (api key {prefix})"),)]
    );
    // Filtering the log by the login finds both — and not a row named by a provider's
    // display name that happens to be `root` (a sign-in's `name (oidc …)`).
    sql_exec(
        app.db(),
        "INSERT INTO audit_log (actor, action, target, created_at, prev_hash, hash, chain)
         VALUES ('root (oidc sub=evil iss=https://idp.example)', 'team.create', 'team:9',
                 '2026-01-01T00:00:00.000Z', '', '', 0)",
    )
    .await;
    let (status, v) = root
        .get_json("/admin/api/v1/audit?actor=root&action=team.")
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["audit"].as_array().map(Vec::len), Some(2), "{v}");
}
