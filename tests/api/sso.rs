//! Single sign-on against a provider the test controls (`oidc_issuer`): the gateway's own
//! checks of the callback and the ID token, the role mapping at every sign-in, and password
//! sign-in switched off with a break-glass login. (`tests/ui/sso.spec.mjs` signs in through
//! the real `oidc-provider` in Chromium.)

use secrecy::SecretString;
use serde_json::{json, Value};
use sluice::config::{OidcRole, OidcSettings, Secret};

use crate::admin_helpers::{
    client, cookie_value, find_between, key_of, login_form, make_login, me_with_key, post_login,
    set_cookies, Session, PASSWORD,
};
use crate::helpers::{spawn_app_with, sql_text, TestApp};
use crate::oidc_issuer::{sign, sign_as, sign_hs256, Issuer};

const CLIENT: &str = "sluice-test";

fn role(value: &str, role: &str, team: Option<&str>) -> OidcRole {
    OidcRole {
        claim: "groups".into(),
        value: value.into(),
        role: role.into(),
        team: team.map(str::to_string),
    }
}

async fn gateway(issuer: &Issuer, password_login: bool) -> TestApp {
    let app = gateway_at(issuer.url.clone(), password_login).await;
    // Discovery runs beside the start: wait for the sign-in link to lead to the provider.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let r = sso_login(&app).await;
        if r.status() == 303 {
            break;
        }
        assert_eq!(r.status(), 503, "SSO not yet discovered answers 503");
        assert!(
            std::time::Instant::now() < deadline,
            "discovery never finished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    app
}

/// A begun sign-in: the flow cookie, and the `state` and `nonce` sent to the provider.
struct Begun {
    cookie: String,
    state: String,
    nonce: String,
    location: String,
}

async fn begin(app: &TestApp) -> Begun {
    let r = client()
        .get(format!("{}/admin/oidc/login", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let location = r.headers()["location"].to_str().unwrap().to_string();
    let cookies = set_cookies(r.headers());
    let flow = cookie_value(&cookies, "sluice_oidc").expect("flow cookie");
    let flow_attrs = cookies
        .iter()
        .find(|c| c.starts_with("sluice_oidc="))
        .unwrap();
    assert!(flow_attrs.contains("HttpOnly"), "{flow_attrs}");
    let url = url::Url::parse(&location).unwrap();
    let q = |k: &str| {
        url.query_pairs()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| panic!("no {k} in {location}"))
    };
    assert_eq!(q("code_challenge_method"), "S256");
    assert_eq!(q("client_id"), CLIENT);
    Begun {
        cookie: format!("sluice_oidc={flow}"),
        state: q("state"),
        nonce: q("nonce"),
        location,
    }
}

async fn callback(app: &TestApp, cookie: Option<&str>, state: &str) -> reqwest::Response {
    let mut req = client().get(format!(
        "{}/admin/oidc/callback?code=code-1&state={state}",
        app.address
    ));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    req.send().await.unwrap()
}

/// Signs in with the claims `edit` makes of the standard ones; the response.
async fn sign_in_with(
    app: &TestApp,
    issuer: &Issuer,
    sub: &str,
    edit: impl FnOnce(&mut Value),
) -> reqwest::Response {
    let b = begin(app).await;
    let mut claims = issuer.claims(CLIENT, sub, &b.nonce);
    edit(&mut claims);
    issuer.answer_with(sign(&claims));
    callback(app, Some(&b.cookie), &b.state).await
}

fn session_of(r: &reqwest::Response) -> Option<String> {
    cookie_value(&set_cookies(r.headers()), "sluice_session")
}

async fn me(app: &TestApp, session: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{}/admin/api/v1/me", app.address))
        .header("cookie", format!("sluice_session={session}"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The browser holding SSO session `id`, as the admin helpers drive one.
fn browser(app: &TestApp, id: &str) -> Session {
    Session {
        address: app.address.clone(),
        id: id.to_string(),
        csrf: sluice::auth::csrf::token_for(id),
        http: client(),
    }
}

async fn refused(r: reqwest::Response, status: u16, says: &str) {
    assert_eq!(r.status(), status);
    assert!(
        session_of(&r).is_none(),
        "a refused sign-in gets no session"
    );
    let body = r.text().await.unwrap();
    assert!(body.contains(says), "{says:?} not in {body}");
}

#[tokio::test]
async fn a_person_in_the_admin_group_lands_as_admin_and_the_audit_log_names_the_subject_and_issuer()
{
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let r = sign_in_with(&app, &issuer, "u-1001", |c| {
        c["groups"] = json!(["staff", "llm-admins"]);
    })
    .await;
    assert_eq!(r.status(), 200);
    let session = session_of(&r).expect("a session");
    let body = r.text().await.unwrap();
    assert!(body.contains("url=/admin/"), "{body}");
    let (status, me_) = me(&app, &session).await;
    assert_eq!(status, 200);
    assert_eq!(me_["role"], "admin");
    assert_eq!(me_["username"], "u-1001@example.com");
    // The token request carried the PKCE verifier and the client's credentials.
    let sent = issuer.token_requests.lock().unwrap().join("\n");
    assert!(sent.contains("code_verifier="), "{sent}");
    // Every action of the SSO admin names the provider's subject and issuer.
    let http = client();
    let page = http
        .get(format!("{}/admin/", app.address))
        .header("cookie", format!("sluice_session={session}"))
        .send()
        .await
        .unwrap();
    let csrf = find_between(&page.text().await.unwrap(), "\"x-csrf-token\": \"", "\"").unwrap();
    let r = http
        .post(format!("{}/admin/api/v1/teams", app.address))
        .header("cookie", format!("sluice_session={session}"))
        .header("x-csrf-token", csrf)
        .json(&json!({"name": "search"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let actor = sql_text(
        app.db(),
        "SELECT actor FROM audit_log WHERE action = 'team.create'",
    )
    .await;
    let expected = format!("u-1001@example.com (oidc sub=u-1001 iss={})", issuer.url);
    assert_eq!(actor, expected);
    let signed_in = sql_text(
        app.db(),
        "SELECT actor FROM audit_log WHERE action = 'login.sso'",
    )
    .await;
    assert_eq!(signed_in, expected);
}

#[tokio::test]
async fn a_tampered_token_a_wrong_nonce_a_wrong_issuer_and_an_expired_token_are_refused() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let admins = |c: &mut Value| c["groups"] = json!(["llm-admins"]);

    // Tampered: the payload changed after signing (now claims another subject).
    let b = begin(&app).await;
    let mut claims = issuer.claims(CLIENT, "u-1", &b.nonce);
    admins(&mut claims);
    let token = sign(&claims);
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    claims["sub"] = json!("u-root");
    parts[1] = base64_url(&serde_json::to_vec(&claims).unwrap());
    issuer.answer_with(parts.join("."));
    refused(
        callback(&app, Some(&b.cookie), &b.state).await,
        401,
        "refused",
    )
    .await;

    // The nonce of another sign-in.
    let other = begin(&app).await;
    let b = begin(&app).await;
    let r = sign_in_with_nonce(&app, &issuer, &b, &other.nonce).await;
    refused(r, 401, "nonce").await;

    // Another issuer in `iss`.
    let r = sign_in_with(&app, &issuer, "u-1", |c| {
        admins(c);
        c["iss"] = json!("https://evil.example.com");
    })
    .await;
    refused(r, 401, "refused").await;

    // Another audience.
    let r = sign_in_with(&app, &issuer, "u-1", |c| {
        admins(c);
        c["aud"] = json!("another-client");
    })
    .await;
    refused(r, 401, "refused").await;

    // Expired past the allowed clock skew (60 s)...
    let r = sign_in_with(&app, &issuer, "u-1", |c| {
        admins(c);
        let now = chrono::Utc::now().timestamp();
        c["iat"] = json!(now - 600);
        c["exp"] = json!(now - 120);
    })
    .await;
    refused(r, 401, "expired").await;
    // ...and issued well in the future.
    let r = sign_in_with(&app, &issuer, "u-1", |c| {
        admins(c);
        let now = chrono::Utc::now().timestamp();
        c["iat"] = json!(now + 600);
        c["exp"] = json!(now + 900);
    })
    .await;
    refused(r, 401, "future").await;

    // HS256 under the client secret, an algorithm the provider lists: whoever holds the
    // secret could mint any identity (s30 identity attack F5).
    let b = begin(&app).await;
    let mut claims = issuer.claims(CLIENT, "u-1", &b.nonce);
    admins(&mut claims);
    issuer.answer_with(sign_hs256(&claims, "client-secret-for-tests"));
    refused(
        callback(&app, Some(&b.cookie), &b.state).await,
        401,
        "refused",
    )
    .await;

    // Unsigned (`alg: none`).
    let b = begin(&app).await;
    let mut claims = issuer.claims(CLIENT, "u-1", &b.nonce);
    admins(&mut claims);
    let none = format!(
        "{}.{}.",
        base64_url(br#"{"alg":"none","typ":"JWT"}"#),
        base64_url(&serde_json::to_vec(&claims).unwrap())
    );
    issuer.answer_with(none);
    refused(
        callback(&app, Some(&b.cookie), &b.state).await,
        401,
        "refused",
    )
    .await;

    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM admins WHERE oidc_subject IS NOT NULL")
            .await,
        0
    );
    assert!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'login.sso_refused'")
            .await
            >= 8
    );

    // Within the skew, an expired token still passes (the provider's clock may lag ours).
    let r = sign_in_with(&app, &issuer, "u-1", |c| {
        admins(c);
        let now = chrono::Utc::now().timestamp();
        c["iat"] = json!(now - 300);
        c["exp"] = json!(now - 20);
    })
    .await;
    assert_eq!(r.status(), 200);
}

async fn sign_in_with_nonce(
    app: &TestApp,
    issuer: &Issuer,
    b: &Begun,
    nonce: &str,
) -> reqwest::Response {
    let mut claims = issuer.claims(CLIENT, "u-1", nonce);
    claims["groups"] = json!(["llm-admins"]);
    issuer.answer_with(sign(&claims));
    callback(app, Some(&b.cookie), &b.state).await
}

#[tokio::test]
async fn a_callback_from_another_browser_or_with_a_forged_flow_cookie_is_refused() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let mine = begin(&app).await;
    let theirs = begin(&app).await;
    let claims = |nonce: &str| {
        let mut c = issuer.claims(CLIENT, "u-2", nonce);
        c["groups"] = json!(["llm-admins"]);
        sign(&c)
    };
    // No flow cookie (another browser), or another sign-in's cookie for this state.
    issuer.answer_with(claims(&mine.nonce));
    refused(
        callback(&app, None, &mine.state).await,
        400,
        "not started in this browser",
    )
    .await;
    refused(
        callback(&app, Some(&theirs.cookie), &mine.state).await,
        400,
        "not started in this browser",
    )
    .await;
    // A flow cookie whose MAC does not hold (its nonce swapped for another).
    let forged = mine.cookie.replace(&mine.nonce, &theirs.nonce);
    refused(
        callback(&app, Some(&forged), &mine.state).await,
        400,
        "not started in this browser",
    )
    .await;
    // The provider's own refusal is shown, not followed.
    let r = client()
        .get(format!(
            "{}/admin/oidc/callback?error=access_denied&error_description=User%20cancelled&state={}",
            app.address, mine.state
        ))
        .header("cookie", &mine.cookie)
        .send()
        .await
        .unwrap();
    refused(r, 401, "access_denied").await;
    // Anyone can call the callback: what no verified flow vouches for — a provider's error,
    // a missing or forged flow cookie — writes no audit row, and the caller's text is not
    // shown on the gateway's page.
    let audited = "SELECT COUNT(*) FROM audit_log WHERE action = 'login.sso_refused'";
    let before = app.scalar(audited).await;
    for _ in 0..5 {
        let r = client()
            .get(format!(
                "{}/admin/oidc/callback?error=access_denied&error_description=Call%20+1-555-PHISH",
                app.address
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
        assert!(!r.text().await.unwrap().contains("PHISH"));
        let r = client()
            .get(format!("{}/admin/oidc/callback", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }
    assert_eq!(
        app.scalar(audited).await,
        before,
        "no audit row from anyone's query"
    );
    // Nothing was asked of the token endpoint for any of them.
    assert!(issuer.token_requests.lock().unwrap().is_empty());
    assert!(mine.location.starts_with(&format!("{}/auth?", issuer.url)));
    // A flow cookie is anyone's for the asking: a good flow with a code the provider will
    // not exchange (junk) is refused and logged, not audited (it was: one signed row per
    // anonymous try, for ever).
    issuer.answer_nothing();
    for _ in 0..3 {
        let b = begin(&app).await;
        let r = callback(&app, Some(&b.cookie), &b.state).await;
        assert_eq!(r.status(), 401);
    }
    assert_eq!(issuer.token_requests.lock().unwrap().len(), 3);
    assert_eq!(
        app.scalar(audited).await,
        before,
        "no audit row from a junk code"
    );
}

#[tokio::test]
async fn the_role_is_derived_again_at_every_sign_in_and_no_matching_group_is_refused_without_an_account(
) {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let r = sign_in_with(&app, &issuer, "u-3", |c| {
        c["groups"] = json!(["llm-lead-search"])
    })
    .await;
    refused(r, 403, "team `search`, which does not exist").await;

    let admin = make_login(&app, "root", "admin", None).await;
    assert!(admin > 0);
    let mut tx = app.db().begin().await.unwrap();
    let budget = sluice::store::tenants::NewBudget {
        limit_micros: None,
        reset: sluice::quota::period::Reset::Monthly,
    };
    sluice::store::tenants::create_team(&mut tx, "search", &budget, chrono::Utc::now())
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // A first value naming a team Sluice does not have does not hide a later one that
    // does (it refused the person, and revoked their keys).
    let r = sign_in_with(&app, &issuer, "u-3", |c| {
        c["groups"] = json!(["llm-lead-old", "llm-lead-search"])
    })
    .await;
    assert_eq!(r.status(), 200);
    let lead_session = session_of(&r).unwrap();
    let (_, me_) = me(&app, &lead_session).await;
    assert_eq!(me_["role"], "lead");
    assert!(me_["team_id"].is_i64());
    // An API key made while lead (perhaps leaked later).
    let lead_key = key_of(&browser(&app, &lead_session), "lead-ci").await;
    assert_eq!(me_with_key(&app, &lead_key).await, 200);

    // Moved to the admin group at the provider: admin at the next sign-in, same login.
    let r = sign_in_with(&app, &issuer, "u-3", |c| {
        c["groups"] = json!(["llm-admins"])
    })
    .await;
    let s2 = session_of(&r).unwrap();
    let (_, me_) = me(&app, &s2).await;
    assert_eq!(me_["role"], "admin");
    // The grant changed: the sessions opened under the old one end, as when an admin
    // changes a login's role (s25 attack, identity #6: they went on under the new role).
    assert_eq!(
        me(&app, &lead_session).await.0,
        401,
        "the lead's session ended"
    );
    // So does the lead's key: it would act as an admin, never confirmed in a session under
    // that role, as an admin's edit of the login revokes it (s30 identity attack F1).
    assert_eq!(
        me_with_key(&app, &lead_key).await,
        401,
        "the lead's API key ended"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'login.sso' AND after LIKE '%\"api_keys_revoked\":1%'")
            .await,
        1
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM admins WHERE oidc_subject = 'u-3'")
            .await,
        1
    );

    // An API key made while admin: it must not outlive the grant.
    let key = key_of(&browser(&app, &s2), "ci").await;
    assert_eq!(me_with_key(&app, &key).await, 200);

    // Removed from every mapped group: refused, and the login's sessions and keys end.
    let r = sign_in_with(&app, &issuer, "u-3", |c| c["groups"] = json!(["staff"])).await;
    refused(r, 403, "none of your groups").await;
    assert_eq!(me(&app, &s2).await.0, 401);
    assert_eq!(me(&app, &lead_session).await.0, 401);
    assert_eq!(
        me_with_key(&app, &key).await,
        401,
        "the admin API key ended"
    );

    // Moved to a group whose team Sluice lacks: the new grant cannot be given, and the old
    // one ends with everything it opened.
    let r = sign_in_with(&app, &issuer, "u-3", |c| {
        c["groups"] = json!(["llm-admins"])
    })
    .await;
    let s3 = session_of(&r).unwrap();
    let key = key_of(&browser(&app, &s3), "ci-2").await;
    let r = sign_in_with(&app, &issuer, "u-3", |c| {
        c["groups"] = json!(["llm-lead-nowhere"])
    })
    .await;
    refused(r, 403, "team `nowhere`, which does not exist").await;
    assert_eq!(me(&app, &s3).await.0, 401);
    assert_eq!(
        me_with_key(&app, &key).await,
        401,
        "the admin API key ended"
    );

    // Someone never mapped gets no login at all.
    let r = sign_in_with(&app, &issuer, "u-4", |c| c["groups"] = json!(["staff"])).await;
    refused(r, 403, "none of your groups").await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM admins WHERE oidc_subject = 'u-4'")
            .await,
        0
    );

    // An SSO login has no password: password sign-in under its name is refused.
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    let r = post_login(&app, &http, &pre, &csrf, "u-3@example.com", "", None).await;
    assert_eq!(r.status(), 401);
}

/// Break-glass login `glass` (password `PASSWORD`), made by the CLI.
async fn break_glass(app: &TestApp) -> sluice::store::sessions::AdminRow {
    let who = ("glass", "admin", None);
    sluice::cli::admin_create_with(app.db(), who, PASSWORD.into(), true, chrono::Utc::now())
        .await
        .unwrap();
    sluice::store::sessions::admin_by_name(app.db(), "glass")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn with_password_sign_in_switched_off_only_a_break_glass_login_may_use_a_password() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, false).await;
    let id = make_login(&app, "ops", "admin", None).await;
    let glass = break_glass(&app).await;
    assert!(id > 0);

    // The sign-in page offers single sign-on only.
    let http = client();
    let page = http
        .get(format!("{}/admin/login", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(body.contains("Sign in with Test ID"));
    assert!(!body.contains("id=\"password-login\""), "{body}");

    // The break-glass form is at ?break-glass; an ordinary login's right password is refused.
    let r = http
        .get(format!("{}/admin/login?break-glass", app.address))
        .send()
        .await
        .unwrap();
    let pre = cookie_value(&set_cookies(r.headers()), "sluice_login").unwrap();
    let csrf = find_between(
        &r.text().await.unwrap(),
        "name=\"csrf_token\" value=\"",
        "\"",
    )
    .unwrap();
    let r = post_login(&app, &http, &pre, &csrf, "ops", PASSWORD, None).await;
    refused(r, 403, "Password sign-in is switched off").await;
    let r = post_login(&app, &http, &pre, &csrf, "glass", "wrong password", None).await;
    refused(r, 403, "Password sign-in is switched off").await;
    let r = post_login(&app, &http, &pre, &csrf, "glass", PASSWORD, None).await;
    assert_eq!(r.status(), 303);
    assert!(session_of(&r).is_some());
    assert_eq!(
        app.scalar(
            "SELECT COUNT(*) FROM audit_log WHERE action = 'login.break_glass' AND actor = 'glass'"
        )
        .await,
        1
    );
    // Its password is the CLI's to set: an admin in the browser cannot give it one that
    // would outlive their own removal at the provider.
    let r = sign_in_with(&app, &issuer, "u-50", |c| {
        c["groups"] = json!(["llm-admins"])
    })
    .await;
    let sso_admin = browser(&app, &session_of(&r).expect("an SSO admin"));
    let path = format!("/admin/api/v1/logins/{}", glass.id);
    let (status, body) = sso_admin
        .send(
            reqwest::Method::PATCH,
            &path,
            &json!({"password": "a-new-password-of-mine"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.to_string().contains("sluice admin reset-password"),
        "{body}"
    );
    let r = post_login(&app, &http, &pre, &csrf, "glass", PASSWORD, None).await;
    assert_eq!(r.status(), 303, "the CLI's password still opens it");
}

#[tokio::test]
async fn an_issuer_whose_discovery_names_another_issuer_is_never_used() {
    let issuer = Issuer::start_claiming(Some("https://id.example.com")).await;
    let app = gateway_at(issuer.url.clone(), true).await;
    // The gateway serves on; SSO says it is unavailable, and the password form still works.
    for _ in 0..3 {
        refused(sso_login(&app).await, 503, "not available yet").await;
    }
    let http = client();
    let (pre, csrf) = login_form(&app, &http).await;
    make_login(&app, "root", "admin", None).await;
    let r = post_login(&app, &http, &pre, &csrf, "root", PASSWORD, None).await;
    assert_eq!(r.status(), 303);
}

/// A gateway whose `[oidc]` issuer is `issuer_url`, its discovery not waited for.
async fn gateway_at(issuer_url: String, password_login: bool) -> TestApp {
    spawn_app_with(move |s, _| {
        s.oidc = Some(OidcSettings {
            issuer: issuer_url,
            client_id: CLIENT.into(),
            client_secret: Secret(SecretString::from("client-secret-for-tests")),
            redirect_url: "http://127.0.0.1:9/admin/oidc/callback".into(),
            password_login,
            scopes: vec!["email".into()],
            clock_skew_seconds: 60,
            label: "Sign in with Test ID".into(),
            roles: vec![
                role("llm-admins", "admin", None),
                role("llm-lead-*", "lead", Some("*")),
                role("finance", "finance", None),
                OidcRole {
                    claim: "email".into(),
                    value: "*@finance.example".into(),
                    role: "finance".into(),
                    team: None,
                },
            ],
        });
    })
    .await
}

async fn sso_login(app: &TestApp) -> reqwest::Response {
    client()
        .get(format!("{}/admin/oidc/login", app.address))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_provider_that_comes_up_after_the_gateway_is_used_at_the_next_sign_in() {
    // The provider's port, held bound but not listening (connections are refused) until it
    // comes up: the gateway's discovery at start is refused, and no other test takes it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let issuer_url = format!("http://{}", socket.local_addr().unwrap());
    let app = gateway_at(issuer_url, true).await;
    refused(sso_login(&app).await, 503, "not available yet").await;
    // The provider comes up; the person clicks again a second later, well before the
    // background retry (3 s after the start's failure): the click finds the provider.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let _issuer = Issuer::start_on(socket.listen(64).unwrap(), None);
    let r = sso_login(&app).await;
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_provider_that_never_answers_holds_one_click_briefly_and_the_others_not_at_all() {
    // Takes every connection and answers none.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer_url = format!("http://{}", listener.local_addr().unwrap());
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = taken.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(sock);
        }
    });
    let app = std::sync::Arc::new(gateway_at(issuer_url, true).await);
    let clicked = std::time::Instant::now();
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            let r = sso_login(&app).await;
            (r.status().as_u16(), clicked.elapsed())
        }
    });
    // A second click while the first one's discovery waits, past the 1 s spacing.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let again = std::time::Instant::now();
    refused(sso_login(&app).await, 503, "not available yet").await;
    assert!(
        again.elapsed() < std::time::Duration::from_millis(500),
        "a click while a discovery runs answers at once: {:?}",
        again.elapsed()
    );
    let (status, waited) = first.await.unwrap();
    assert_eq!(status, 503);
    assert!(
        waited < std::time::Duration::from_secs(5),
        "the click that asked waits at most its 3 s, not the client's 10: {waited:?}"
    );
    // The background discovery at start and the first click's: the second started none.
    assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Base64url without padding (JWT segments).
fn base64_url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A standard claim can be mapped — `email`, the usual way for Google Workspace, which sends
/// no groups — but only when the provider verified it: an unverified address of the mapped
/// domain grants nothing.
#[tokio::test]
async fn a_verified_email_can_be_mapped_and_an_unverified_one_grants_nothing() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let r = sign_in_with(&app, &issuer, "u-9", |c| {
        c["email"] = json!("mallory@finance.example");
        c["email_verified"] = json!(false);
    })
    .await;
    refused(r, 403, "none of your groups").await;
    let r = sign_in_with(&app, &issuer, "u-8", |c| {
        c["email"] = json!("bob@finance.example");
        c["email_verified"] = json!(true);
    })
    .await;
    assert_eq!(r.status(), 200);
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    assert_eq!(me_["role"], "finance", "{me_}");
}

/// The provider's name claims are the user's to set. An unverified email does not name the
/// login (an insider could take a colleague's address first); a name with a NUL, a line
/// break, a right-to-left override or the audit name's own parentheses is stored and
/// audited cleaned (a NUL failed the sign-in on PostgreSQL — a 500 — and the rest forged
/// or garbled audit rows); a subject that is not one (control characters, too long) is
/// refused.
#[tokio::test]
async fn the_providers_name_claims_are_cleaned_and_an_unverified_email_names_no_one() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let r = sign_in_with(&app, &issuer, "u-20", |c| {
        c["groups"] = json!(["llm-admins"]);
        c["email"] = json!("root@example.com");
        c["email_verified"] = json!(false);
        c["preferred_username"] = json!("mallory");
    })
    .await;
    assert_eq!(r.status(), 200);
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    assert_eq!(me_["username"], "mallory", "{me_}");
    // A name the audit log gives actors that are not logins is taken: tagged.
    let r = sign_in_with(&app, &issuer, "u-24", |c| {
        c["groups"] = json!(["llm-admins"]);
        c.as_object_mut().unwrap().remove("email");
        c["preferred_username"] = json!("system");
    })
    .await;
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    assert!(
        me_["username"].as_str().unwrap().starts_with("system~"),
        "{me_}"
    );
    let r = sign_in_with(&app, &issuer, "u-21", |c| {
        c["groups"] = json!(["llm-admins"]);
        c.as_object_mut().unwrap().remove("email");
        c["preferred_username"] = json!("eve\u{0}\n\u{202E}x (oidc sub=alice iss=x)");
    })
    .await;
    assert_eq!(r.status(), 200);
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    let name = me_["username"].as_str().unwrap().to_string();
    assert!(
        !name
            .chars()
            .any(|c| c.is_control() || c == '\u{202E}' || c == '('),
        "{name:?}"
    );
    let actor = sql_text(
        app.db(),
        "SELECT actor FROM audit_log WHERE action = 'login.sso' AND actor LIKE '%sub=u-21 %'",
    )
    .await;
    assert_eq!(actor.matches("(oidc sub=").count(), 1, "{actor:?}");
    // No name claim at all: the subject names the login, cut to 100 characters too.
    let long = "s".repeat(200);
    let r = sign_in_with(&app, &issuer, &long, |c| {
        c["groups"] = json!(["llm-admins"]);
        c.as_object_mut().unwrap().remove("email");
    })
    .await;
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    assert_eq!(
        me_["username"].as_str().unwrap().chars().count(),
        100,
        "{me_}"
    );
    // A chosen username shaped like an address does not pass for one (it took the name a
    // colleague's verified email would get), and invisible characters are shown as such.
    let r = sign_in_with(&app, &issuer, "u-22", |c| {
        c["groups"] = json!(["llm-admins"]);
        c.as_object_mut().unwrap().remove("email");
        c["preferred_username"] = json!("bob@example.com");
    })
    .await;
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    let name = me_["username"].as_str().unwrap();
    assert!(name.starts_with("bob@example.com~"), "{me_}");
    let r = sign_in_with(&app, &issuer, "u-23", |c| {
        c["groups"] = json!(["llm-admins"]);
        c.as_object_mut().unwrap().remove("email");
        c["preferred_username"] = json!("ro\u{200B}ot\u{FEFF}\u{2028}");
    })
    .await;
    let (_, me_) = me(&app, &session_of(&r).unwrap()).await;
    let name = me_["username"].as_str().unwrap();
    assert!(
        !name.contains(['\u{200B}', '\u{FEFF}', '\u{2028}']),
        "{name:?}"
    );
    for sub in ["bad\u{1}sub".to_string(), "s".repeat(256)] {
        let r = sign_in_with(&app, &issuer, &sub, |c| c["groups"] = json!(["llm-admins"])).await;
        refused(r, 401, "not a valid subject").await;
    }
}

/// The provider rotates its signing key and uses the new one at once (Keycloak does): the
/// first ID token under it makes the gateway read the keys again, and the sign-in passes —
/// not refused until the next scheduled re-read, 15 minutes later. A second unknown key
/// within the re-read interval is refused without another call.
#[tokio::test]
async fn a_token_signed_by_a_key_rotated_in_since_discovery_is_checked_against_the_new_keys() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    issuer.rotate_to("test-2");
    let b = begin(&app).await;
    let mut claims = issuer.claims(CLIENT, "u-60", &b.nonce);
    claims["groups"] = json!(["llm-admins"]);
    issuer.answer_with(sign_as(&claims, "test-2"));
    let r = callback(&app, Some(&b.cookie), &b.state).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let b = begin(&app).await;
    let mut claims = issuer.claims(CLIENT, "u-61", &b.nonce);
    claims["groups"] = json!(["llm-admins"]);
    issuer.answer_with(sign_as(&claims, "test-3"));
    refused(
        callback(&app, Some(&b.cookie), &b.state).await,
        401,
        "refused",
    )
    .await;
}

/// A session and an API key of local login `id`, made in the store (as they were made
/// before passwords were switched off): the session's id and the key's text.
async fn local_credentials(app: &TestApp, id: i64) -> (String, String) {
    use sluice::auth::{session, token};
    let now = chrono::Utc::now();
    let sid = session::new_secret();
    let key = token::generate_admin_key();
    let mut tx = app.db().begin().await.unwrap();
    sluice::store::sessions::create_session(&mut tx, &session::id_hash(&sid), id, "127.0.0.1", now)
        .await
        .unwrap();
    sluice::store::sessions::create_api_key(&mut tx, id, &key.hash, &key.display_prefix, "ci", now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (sid, key.text)
}

/// With password sign-in switched off, a local login that is not break-glass has no way
/// in: its API keys and sessions, made while passwords were on, are refused, for they
/// cannot be ended at the provider (s30 identity attack F4: they went on for ever, and a
/// session could mint more keys). A break-glass login's still work.
#[tokio::test]
async fn with_password_sign_in_switched_off_local_logins_keys_and_sessions_end() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, false).await;
    let ops = make_login(&app, "ops", "admin", None).await;
    let (sid, key) = local_credentials(&app, ops).await;
    assert_eq!(me(&app, &sid).await.0, 401, "the local login's session");
    assert_eq!(me_with_key(&app, &key).await, 401, "the local login's key");
    let glass = break_glass(&app).await;
    let (sid, key) = local_credentials(&app, glass.id).await;
    assert_eq!(me(&app, &sid).await.0, 200, "break-glass's session");
    assert_eq!(me_with_key(&app, &key).await, 200, "break-glass's key");
    // With passwords on, a local login's credentials work as ever.
    let app = gateway(&issuer, true).await;
    let ops = make_login(&app, "ops", "admin", None).await;
    let (sid, key) = local_credentials(&app, ops).await;
    assert_eq!(me(&app, &sid).await.0, 200);
    assert_eq!(me_with_key(&app, &key).await, 200);
}

/// A proxy's basic auth in front of the admin UI (`Authorization: Basic …` on every
/// request) is not an API key: the session cookie is read (it answered 401 on every page,
/// and the sign-in looped; s30 identity attack, minor note).
#[tokio::test]
async fn an_authorization_header_that_is_not_a_bearer_key_leaves_the_session_in_charge() {
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    let ops = make_login(&app, "ops", "admin", None).await;
    let (sid, _) = local_credentials(&app, ops).await;
    let r = client()
        .get(format!("{}/admin/api/v1/me", app.address))
        .header("authorization", "Basic b3BzOnNlY3JldA==")
        .header("cookie", format!("sluice_session={sid}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A bearer that is not a valid key is still refused outright.
    let r = client()
        .get(format!("{}/admin/api/v1/me", app.address))
        .header("authorization", "Bearer sk-sl-admin-nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// Sign-ins the provider vouches for but Sluice refuses are counted per address: past
/// `SSO_REFUSALS` within the window the callback answers 429 with `Retry-After`, before the
/// provider is asked anything and with nothing written (s30 identity attack F3: each was a
/// permanent audit row and a take of the write lock, without bound, for anyone with an
/// account at a provider anyone may join).
#[tokio::test]
async fn refused_sign_ins_from_one_address_are_throttled() {
    use sluice::auth::throttle::SSO_REFUSALS;
    let issuer = Issuer::start().await;
    let app = gateway(&issuer, true).await;
    for i in 0..SSO_REFUSALS {
        let r = sign_in_with(&app, &issuer, &format!("outsider-{i}"), |c| {
            c["groups"] = json!(["staff"])
        })
        .await;
        refused(r, 403, "none of your groups").await;
    }
    let rows = "SELECT COUNT(*) FROM audit_log WHERE action = 'login.sso_refused'";
    assert_eq!(app.scalar(rows).await, SSO_REFUSALS as i64);
    let before = issuer.token_requests.lock().unwrap().len();
    let r = sign_in_with(&app, &issuer, "outsider-x", |c| {
        c["groups"] = json!(["staff"])
    })
    .await;
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=15 * 60).contains(&wait), "{wait}");
    assert_eq!(
        issuer.token_requests.lock().unwrap().len(),
        before,
        "the provider was not asked"
    );
    assert_eq!(
        app.scalar(rows).await,
        SSO_REFUSALS as i64,
        "nothing audited"
    );
}
