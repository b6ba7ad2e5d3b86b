//! Two gateway processes on one PostgreSQL database, each with a working directory of its
//! own and no shared file ("two hosts", issue 17 item 3): a revocation made on one is
//! refused on the other within a second, and the sign-in throttle counts guesses made at
//! either.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::mock::{MockConfig, MockServer};
use sluice::secrets::MasterKey;
use sluice::store::Db;

use crate::admin_helpers::{
    client, cookie_value, find_between, login_form_at, post_login_at, set_cookies, Session,
    PASSWORD,
};
use crate::gateway_proc::{start_gateway_full, Gateway};
use crate::pg_admin::{models_status, MASTER_HEX};
use crate::pg_server;

/// Two hosts on a fresh PostgreSQL database, and that database opened beside them.
pub(crate) struct Hosts {
    pub a: Gateway,
    pub b: Gateway,
    pub db: Db,
    _dirs: [tempfile::TempDir; 2],
    _mock: MockServer,
}

pub(crate) async fn two_hosts() -> Hosts {
    two_hosts_with("").await
}

/// `two_hosts` with `extra` appended to both hosts' config.
pub(crate) async fn two_hosts_with(extra: &str) -> Hosts {
    let url = pg_server::database();
    let key = MasterKey::from_hex(MASTER_HEX).unwrap();
    // Migrated before either host starts, so the two never race to create the schema.
    let db = Db::open_postgres(&url, &key).await.unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let env = [
        ("SLUICE_DATABASE_URL", url.as_str()),
        ("SLUICE_SECRET_KEY", MASTER_HEX),
    ];
    let a = start_gateway_full(dirs[0].path(), &mock, &env, extra).await;
    let b = start_gateway_full(dirs[1].path(), &mock, &env, extra).await;
    Hosts {
        a,
        b,
        db,
        _dirs: dirs,
        _mock: mock,
    }
}

/// Signs in to the gateway at `url`.
pub(crate) async fn login_at(url: &str, user: &str) -> Session {
    let http = client();
    let (pre, csrf) = login_form_at(&http, url).await;
    let resp = post_login_at(
        &http,
        url,
        &format!("sluice_login={pre}"),
        &csrf,
        user,
        PASSWORD,
    )
    .await;
    assert_eq!(resp.status(), 303, "login of {user} at {url}");
    let id = cookie_value(&set_cookies(resp.headers()), "sluice_session").expect("session cookie");
    let mut s = Session {
        address: url.to_string(),
        id,
        csrf: String::new(),
        http,
    };
    let body = s.get("/admin/").await.text().await.unwrap();
    s.csrf = find_between(&body, "\"x-csrf-token\": \"", "\"").expect("csrf in page");
    s
}

/// The admin `root` (password `PASSWORD`) both hosts sign in.
pub(crate) async fn create_root(db: &Db) {
    sluice::cli::admin_create(
        db,
        "root",
        "admin",
        None,
        PASSWORD.into(),
        chrono::Utc::now(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_revocation_on_one_host_is_refused_on_the_other_within_a_second() {
    let h = two_hosts().await;
    create_root(&h.db).await;
    let admin = login_at(&h.a.url, "root").await;
    let (s, team) = admin
        .post("/admin/api/v1/teams", &json!({"name": "red"}))
        .await;
    assert_eq!(s, 201, "{team}");
    let (s, u) = admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": team["id"]}),
        )
        .await;
    assert_eq!(s, 201, "{u}");
    let (s, tok) = admin
        .post("/admin/api/v1/tokens", &json!({"user_id": u["id"]}))
        .await;
    assert_eq!(s, 201, "{tok}");
    let (id, text) = (
        tok["id"].as_i64().unwrap(),
        tok["token"].as_str().unwrap().to_string(),
    );
    // Both hosts know the token (and cache it).
    for _ in 0..3 {
        assert_eq!(models_status(&h.a.url, &text).await, 200);
        assert_eq!(models_status(&h.b.url, &text).await, 200);
    }
    // What one authenticated call to B costs on this machine now: the bound allows for it.
    let t = Instant::now();
    assert_eq!(models_status(&h.b.url, &text).await, 200);
    let call = t.elapsed();

    let (s, _) = admin
        .post(&format!("/admin/api/v1/tokens/{id}/revoke"), &json!({}))
        .await;
    assert_eq!(s, 200);
    let revoked_at = Instant::now();
    let refused_after = loop {
        if models_status(&h.b.url, &text).await == 401 {
            break revoked_at.elapsed();
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(10),
            "host B still accepts the revoked token after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("revoked on A, refused on B after {refused_after:?} (one call: {call:?})");
    assert!(
        refused_after <= Duration::from_secs(1) + call * 3,
        "host B refused the revoked token only after {refused_after:?} (one call: {call:?})"
    );
    assert_eq!(models_status(&h.a.url, &text).await, 401);
}

#[tokio::test]
async fn guesses_at_either_host_count_toward_one_sign_in_lock() {
    let h = two_hosts().await;
    create_root(&h.db).await;
    let http = client();
    let forms = [
        login_form_at(&http, &h.a.url).await,
        login_form_at(&http, &h.b.url).await,
    ];
    let urls = [&h.a.url, &h.b.url];
    // Five wrong passwords, alternating hosts: no host saw more than three.
    for i in 0..5 {
        let (pre, csrf) = &forms[i % 2];
        let r = post_login_at(
            &http,
            urls[i % 2],
            &format!("sluice_login={pre}"),
            csrf,
            "root",
            &format!("guess {i}"),
        )
        .await;
        assert_eq!(r.status(), 401, "guess {i}");
    }
    for (n, url) in urls.iter().enumerate() {
        let (pre, csrf) = &forms[n];
        let r = post_login_at(
            &http,
            url,
            &format!("sluice_login={pre}"),
            csrf,
            "root",
            PASSWORD,
        )
        .await;
        assert_eq!(
            r.status(),
            429,
            "{url}: the name is locked on every host, even for its owner"
        );
        assert!(r.headers().contains_key("retry-after"));
        assert!(r.text().await.unwrap().contains("Try again in"));
    }
}
