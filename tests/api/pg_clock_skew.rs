//! Hosts whose clocks disagree on one PostgreSQL database (issue 17): liveness is judged by
//! the database's clock, so a host whose clock runs ahead does not take every other live
//! host for dead and settle their live reservations as orphans; a host that really stopped
//! beating is still found gone. Expiry is judged by the database's clock too: a host whose
//! clock lags does not serve a token that has expired (s25 attack #1).

use std::sync::Arc;

use chrono::{Duration, Utc};
use sluice::clock::db_time;
use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::{self, Orphans, Refusal, ReserveRequest};
use sluice::store::processes::{self, Me};

use crate::pg_liveness::budgets;
use crate::pg_money::Store;

const R: i64 = 1_000;

/// What a host's orphan recovery does (`ops::housekeeping::recover_orphans`), at its clock.
async fn recover(store: &Store, me: &Me, now: chrono::DateTime<Utc>) -> u64 {
    let mut settled = 0;
    for owner in processes::dead_owners(&store.db, me, now).await.unwrap() {
        settled += ledger::settle_orphans(&store.db, Orphans::OfOwner(&owner), now)
            .await
            .unwrap();
    }
    settled
        + ledger::settle_orphans(&store.db, Orphans::LeaseExpired, now)
            .await
            .unwrap()
}

/// Host A (true clock) beats and holds three live reservations; host B's clock runs a
/// minute — then a day — ahead: B beats and recovers orphans, and settles none of A's.
/// Host C, which beat once and then stopped, is found gone once its beat is older than the
/// stale window by the database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_ahead_does_not_orphan_live_reservations() {
    let a = Store::postgres().await;
    let b = a.another().await;
    let owner = a.owner(&budgets()).await;
    let host_a = Me::new("host-a".into(), "a".into());
    let host_b = Me::new("host-b".into(), "b".into());
    let clock_a: Arc<dyn Clock> = Arc::new(ManualClock::new(Utc::now()));
    assert!(processes::heartbeat(&a.db, &host_a, clock_a.now())
        .await
        .unwrap());
    for i in 0..3 {
        a.reserve(&owner, &format!("live-{i}"), R, "host-a", clock_a.clone())
            .await
            .unwrap()
            .unwrap();
    }
    for ahead in [Duration::seconds(60), Duration::days(1)] {
        let now_b = Utc::now() + ahead;
        processes::heartbeat(&b.db, &host_b, now_b).await.unwrap();
        assert_eq!(
            processes::dead_owners(&b.db, &host_b, now_b).await.unwrap(),
            Vec::<String>::new(),
            "a host {ahead} ahead took a live host for dead"
        );
        assert_eq!(recover(&b, &host_b, now_b).await, 0, "{ahead} ahead");
    }
    assert_eq!(
        a.level("tokens", owner.token_id).await,
        (10 * R, 7 * R, 3 * R)
    );
    for i in 0..3 {
        a.settle(&format!("live-{i}"), R / 2, clock_a.clone())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        a.level("tokens", owner.token_id).await,
        (10 * R, 10 * R - 3 * R / 2, 0),
        "charged what was served, nothing as an orphan"
    );
    a.assert_settled().await;

    // A host that stopped beating is still found gone — once its beat is older than the
    // stale window by the database's clock, whatever the others' clocks say — and its
    // reservation is settled as an orphan.
    let host_c = Me::new("host-c".into(), "c".into());
    processes::heartbeat(&a.db, &host_c, clock_a.now())
        .await
        .unwrap();
    a.reserve(&owner, "held-by-c", R, "host-c", clock_a.clone())
        .await
        .unwrap()
        .unwrap();
    let behind = Utc::now() - Duration::days(1);
    assert_eq!(recover(&b, &host_b, behind).await, 0, "c beat just now");
    a.age_heartbeat("host-c", 16.0).await;
    assert_eq!(
        processes::dead_owners(&b.db, &host_b, behind)
            .await
            .unwrap(),
        ["host-c"],
        "a host silent past the stale window, seen by a host a day behind"
    );
    assert_eq!(recover(&b, &host_b, behind).await, 1);
    a.assert_settled().await;

    // A host still running the previous version (a rolling upgrade) beats with the old
    // statement, which names only `heartbeat_at`: it is stamped as seen all the same.
    let host_d = Me::new("host-d".into(), "d".into());
    processes::heartbeat(&a.db, &host_d, clock_a.now())
        .await
        .unwrap();
    a.reserve(&owner, "held-by-d", R, "host-d", clock_a.clone())
        .await
        .unwrap()
        .unwrap();
    a.age_heartbeat("host-d", 60.0).await;
    sqlx::query(
        "INSERT INTO processes (id, host, pid, pid_start, started_at, heartbeat_at) VALUES ('host-d', 'd', 1, NULL, $1, $1)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
    )
    .bind(sluice::clock::db_time(Utc::now() - Duration::days(3)))
    .execute(&a.pg().pool)
    .await
    .unwrap();
    assert_eq!(
        processes::dead_owners(&b.db, &host_b, Utc::now())
            .await
            .unwrap(),
        Vec::<String>::new(),
        "a host beating with the previous version's statement taken for dead"
    );
    a.settle("held-by-d", R, clock_a.clone())
        .await
        .unwrap()
        .unwrap();
    a.assert_settled().await;
}

/// The same through real gateway processes: host B's whole clock runs two minutes ahead
/// (libfaketime, as `clocks.rs` skews them) while host A holds a reservation for a request
/// the upstream answers after 12 s. B's orphan recovery (at its start and every 5 s) must
/// not take A for dead: no reservation of A's is settled as an orphan, and the request is
/// charged once, at its actual cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_two_minutes_ahead_leaves_a_live_hosts_reservation_alone() {
    use sluice::mock::{MockConfig, MockServer, Script};

    use crate::gateway_proc::start_gateway_full;
    use crate::helpers::{chat_body, chat_worst_case, issue_args, sql_int, KEY_A};
    use crate::pg_admin::MASTER_HEX;

    let url = crate::pg_server::database();
    let key = sluice::secrets::MasterKey::from_hex(MASTER_HEX).unwrap();
    let db = sluice::store::Db::open_postgres(&url, &key).await.unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let (input, _) = chat_worst_case(100);
    mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(input),
            completion_tokens: Some(10),
            delay_ms: 12_000,
            ..Default::default()
        }),
    );
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let env = [
        ("SLUICE_DATABASE_URL", url.clone()),
        ("SLUICE_SECRET_KEY", MASTER_HEX.to_string()),
    ];
    let env_a: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = start_gateway_full(dirs[0].path(), &mock, &env_a, "").await;
    let args = sluice::cli::IssueArgs {
        budget_usd: Some("5"),
        ..issue_args("skew")
    };
    let token = sluice::cli::token_issue(&db, &args, Utc::now())
        .await
        .unwrap()
        .text;
    let request = {
        let (url, token) = (a.url.clone(), token.clone());
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(&token)
                .json(&chat_body(100))
                .timeout(Duration::seconds(60).to_std().unwrap())
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        })
    };
    // A's reservation is open before B starts.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sql_int(&db, "SELECT COUNT(*) FROM reservations").await == 0 {
        assert!(std::time::Instant::now() < until, "A never reserved");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut env_b: Vec<(&str, String)> = env.to_vec();
    env_b.extend(crate::clocks::skewed(Duration::minutes(2)));
    let env_b: Vec<(&str, &str)> = env_b.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _b = start_gateway_full(dirs[1].path(), &mock, &env_b, "").await;
    assert_eq!(request.await.unwrap(), 200);
    let orphans = sql_int(&db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await;
    assert_eq!(
        orphans, 0,
        "host B (2 min ahead) settled A's live reservation as an orphan"
    );
    assert_eq!(sql_int(&db, "SELECT COUNT(*) FROM orphaned").await, 0);
    drop(a);
    crate::helpers::assert_invariant_on(&db).await;
}

/// Expiry on the database's clock, at the store (s25 attack #1): a host whose clock lags
/// 2 min does not reserve on a token that expired 5 s ago — neither through its writer's
/// grouped statement nor the CAS on its own (one-statement and step-by-step paths) — and a
/// host 2 min ahead still serves a token that expires in a minute. Before, both followed
/// the host's clock: the lagging host reserved, the one ahead refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_lags_does_not_reserve_on_an_expired_token() {
    let a = Store::postgres().await;
    let owner = a.owner(&budgets()).await;
    let expire_at = |at: chrono::DateTime<Utc>| {
        let pool = a.pg().pool.clone();
        async move {
            sqlx::query("UPDATE tokens SET expires_at = $1 WHERE id = $2")
                .bind(db_time(at))
                .bind(owner.token_id)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    expire_at(Utc::now() - Duration::seconds(5)).await;
    let behind: Arc<dyn Clock> = Arc::new(ManualClock::new(Utc::now() - Duration::seconds(120)));
    let grouped = a
        .reserve(&owner, "lagging-1", R, "host-b", behind.clone())
        .await
        .unwrap();
    assert!(
        matches!(grouped, Err(Refusal::TokenGone)),
        "a host 2 min behind reserved on a token expired 5 s ago: {grouped:?}"
    );
    let alone = ledger::reserve(
        &a.db,
        &ReserveRequest {
            request_id: "lagging-2",
            owner: &owner,
            amount: R,
            process: "host-b",
            lease: Duration::seconds(60),
        },
        behind.now(),
    )
    .await
    .unwrap();
    assert!(
        matches!(alone, Err(Refusal::TokenGone)),
        "the CAS on its own, 2 min behind, reserved on an expired token: {alone:?}"
    );
    assert_eq!(a.level("tokens", owner.token_id).await, (10 * R, 10 * R, 0));

    // The other way round: a host 2 min ahead serves a token with a minute left.
    expire_at(Utc::now() + Duration::seconds(60)).await;
    let ahead: Arc<dyn Clock> = Arc::new(ManualClock::new(Utc::now() + Duration::seconds(120)));
    a.reserve(&owner, "ahead-1", R, "host-c", ahead.clone())
        .await
        .unwrap()
        .expect("a host 2 min ahead refused a token with a minute left");
    a.settle("ahead-1", R / 2, ahead.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        a.level("tokens", owner.token_id).await,
        (10 * R, 10 * R - R / 2, 0)
    );
    a.assert_settled().await;
}

/// The same through a real gateway whose whole clock lags 2 min (libfaketime), its response
/// cache on: a token that expires 3 s after it is issued is served once (its token row and
/// the answer cached), then refused with 401 five seconds later — the same request, which
/// the response cache would answer without reaching the CAS, so only authentication (the
/// token cache's expiry check, on the database's clock) can refuse it. Before, the lagging
/// host served it from its cache for two more minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused_by_a_host_whose_clock_lags() {
    use sluice::mock::{MockConfig, MockServer};

    use crate::gateway_proc::start_gateway_full;
    use crate::helpers::{chat_body, issue_args, sql_int};
    use crate::pg_admin::MASTER_HEX;

    let url = crate::pg_server::database();
    let key = sluice::secrets::MasterKey::from_hex(MASTER_HEX).unwrap();
    let db = sluice::store::Db::open_postgres(&url, &key).await.unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut env: Vec<(&str, String)> = vec![
        ("SLUICE_DATABASE_URL", url.clone()),
        ("SLUICE_SECRET_KEY", MASTER_HEX.to_string()),
    ];
    env.extend(crate::clocks::skewed(Duration::minutes(-2)));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let b = start_gateway_full(dir.path(), &mock, &env, "[cache]\nmode = \"all\"\n").await;
    let expires = db_time(Utc::now() + Duration::seconds(3));
    let args = sluice::cli::IssueArgs {
        budget_usd: Some("5"),
        expires: Some(&expires),
        ..issue_args("lag")
    };
    let issued = sluice::cli::token_issue(&db, &args, Utc::now())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let post = |token: String| {
        let (http, url) = (http.clone(), b.url.clone());
        async move {
            http.post(format!("{url}/v1/chat/completions"))
                .bearer_auth(&token)
                .json(&chat_body(100))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post(issued.text.clone()).await, 200, "before it expires");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while sql_int(&db, "SELECT COUNT(*) FROM cache_entries").await == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the answer was never cached"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let ledger_rows = format!("SELECT COUNT(*) FROM ledger WHERE token_id = {}", issued.id);
    let before = sql_int(&db, &ledger_rows).await;
    assert_eq!(
        post(issued.text.clone()).await,
        401,
        "a host 2 min behind served a token 2 s after it expired"
    );
    assert_eq!(sql_int(&db, &ledger_rows).await, before, "nothing reserved");
    drop(b);
    crate::helpers::assert_invariant_on(&db).await;
}

/// Admin sessions on PostgreSQL are stamped, judged and pruned by the database's clock:
/// a host whose clock runs an hour ahead neither takes another host's fresh session for
/// idle nor, at a sign-in's prune, deletes it; one an hour behind does not keep an idle
/// session past its bound (s30 identity attack F2: by each host's own clock, the host ahead
/// logged every admin out, fleet-wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_judged_by_the_databases_clock() {
    use sluice::auth::session;
    use sluice::store::sessions;
    let a = Store::postgres().await;
    let b = a.another().await;
    let who = ("root", "admin", None);
    let id =
        sluice::cli::admin_create_with(&a.db, who, "a long passphrase".into(), false, Utc::now())
            .await
            .unwrap();
    let open = || async {
        let sid = session::new_secret();
        let mut tx = a.db.begin().await.unwrap();
        sessions::create_session(&mut tx, &session::id_hash(&sid), id, "10.0.0.1", Utc::now())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        sid
    };
    let sid = open().await;
    let ahead = Utc::now() + Duration::hours(1);
    assert!(
        session::load(&b.db, &sid, ahead).await.unwrap().is_some(),
        "not idle"
    );
    let mut tx = b.db.begin().await.unwrap();
    sessions::prune_sessions(&mut tx, ahead, (session::IDLE, session::ABSOLUTE))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        session::load(&a.db, &sid, Utc::now())
            .await
            .unwrap()
            .is_some(),
        "not pruned by the host ahead"
    );
    // Idle for 31 minutes by the database's clock: ended, on a host an hour behind too.
    let idle = db_time(Utc::now() - Duration::minutes(31));
    sqlx::query("UPDATE admin_sessions SET last_seen_at = $1")
        .bind(&idle)
        .execute(&a.pg().pool)
        .await
        .unwrap();
    let behind = Utc::now() - Duration::hours(1);
    assert!(
        session::load(&b.db, &sid, behind).await.unwrap().is_none(),
        "idle"
    );
    // And pruned at a sign-in by a host an hour behind.
    let sid = open().await;
    let old = db_time(Utc::now() - Duration::hours(13));
    sqlx::query("UPDATE admin_sessions SET created_at = $1")
        .bind(&old)
        .execute(&a.pg().pool)
        .await
        .unwrap();
    let mut tx = b.db.begin().await.unwrap();
    sessions::prune_sessions(&mut tx, behind, (session::IDLE, session::ABSOLUTE))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        sessions::find_session(&a.db, &session::id_hash(&sid))
            .await
            .unwrap()
            .map(|s| s.admin.id),
        None,
        "past 12 hours by the database's clock"
    );
}

/// A cache entry's expiry is judged by the database's clock: a host whose clock runs 2 h
/// ahead evicts no entry another host stored that the database still reads as live.
/// Before, its minute's eviction compared `expires_at` with its own time and deleted every
/// entry with less than 2 h left — every host's default-TTL (1 h) entries, each minute
/// (s31 cache attack F3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_ahead_does_not_evict_other_hosts_live_entries() {
    let url = crate::pg_server::database();
    let open = || async {
        sluice::store::Db::open_postgres(&url, &crate::pg_gateway_app::shared_key())
            .await
            .unwrap()
    };
    let (right, ahead) = (open().await, open().await);
    let (right, ahead) = (
        crate::cache::cache_on(&right),
        crate::cache::cache_on(&ahead),
    );
    let now = Utc::now();
    let body = serde_json::json!({"model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": "Why does the engine warning light blink?"}]});
    let answer = serde_json::json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Check the EGR valve."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}});
    let plan = crate::cache::plan_of(&right, &body, None);
    right.put(&plan, &answer, (12, 24), now).await;
    // One the right host stored two hours ago has expired by the database's clock: it goes,
    // whichever host evicts.
    let mut stale = body.clone();
    stale["messages"][0]["content"] = serde_json::json!("Why does the oil light blink?");
    let stale = crate::cache::plan_of(&right, &stale, None);
    right
        .put(&stale, &answer, (12, 24), now - Duration::hours(2))
        .await;
    right.flush().await;
    assert_eq!(
        ahead.evict(now + Duration::hours(2)).await.unwrap(),
        1,
        "the live entry has an hour left by the database's clock; the stale one goes"
    );
    let fresh = crate::cache::cache_on(&open().await);
    fresh.rebuild(now).await.unwrap();
    let hit = fresh
        .get(
            &crate::cache::plan_of(&fresh, &body, None),
            now,
            std::time::Instant::now() + std::time::Duration::from_secs(5),
        )
        .await
        .expect("still stored");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&hit.entry.answer).unwrap(),
        answer
    );
}

/// A gateway on PostgreSQL whose clock is `off` from the true time (and the database's).
async fn gateway_off_by(off: Duration) -> crate::helpers::TestApp {
    let clock = Arc::new(ManualClock::new(Utc::now() + off));
    crate::pg_gateway_app::spawn_app_on_full(
        crate::pg_gateway_app::Engine::Postgres,
        |_, _| {},
        Some(clock as Arc<dyn Clock>),
    )
    .await
}

/// A gateway whose clock runs 2 h ahead stamps its entries' expiry on the database's
/// clock (its time plus the offset its token poll learned): an entry it stores with a TTL
/// of an hour expires an hour from the database's now, on every host. Before, it expired
/// 3 h from it, so a host with the right clock served it 2 h past the TTL the client
/// asked for (s31 cache attack F3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_ahead_stamps_cache_expiry_on_the_databases_clock() {
    let app = gateway_off_by(Duration::hours(2)).await;
    let (_, token) = app.token("alice", None).await;
    let body = serde_json::json!({"model": "gpt-4o-mini", "temperature": 0,
        "messages": [{"role": "user", "content": "Why does the engine warning light blink?"}]});
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-cache-ttl", "3600")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    app.wait_for_cache_entries(1).await;
    let stamped: String = sqlx::query_scalar("SELECT expires_at FROM cache_entries")
        .fetch_one(&app.db().postgres().unwrap().pool)
        .await
        .unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(&stamped).unwrap();
    let left = expires.with_timezone(&Utc) - Utc::now();
    assert!(
        left > Duration::minutes(55) && left <= Duration::hours(1),
        "an hour from the database's now, not three: {left}"
    );
}

/// A gateway whose clock lags 10 minutes does not serve an entry past its expiry by the
/// database's clock: it judges expiry at its time plus the offset its token poll learned.
/// Before, it served an entry whose TTL ran out for up to 10 more minutes — the client
/// that chose a short `x-sluice-cache-ttl` got a stale answer (s31 cache attack F3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_host_does_not_serve_an_entry_past_its_ttl() {
    let app = gateway_off_by(-Duration::minutes(10)).await;
    let (_, token) = app.token("alice", None).await;
    let asked = |q: &str| {
        serde_json::json!({"model": "gpt-4o-mini", "temperature": 0,
            "messages": [{"role": "user", "content": q}]})
    };
    let answer = serde_json::json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Check the EGR valve."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}});
    // Another host with the right clock stores one live entry (an hour left) and one whose
    // hour ran out a second ago.
    let other = crate::cache::cache_on(app.db());
    let now = Utc::now();
    let (live, expired) = (asked("Why is it live?"), asked("Why has it expired?"));
    other
        .put(
            &crate::cache::plan_of(&other, &live, None),
            &answer,
            (12, 24),
            now,
        )
        .await;
    let stamped = now - Duration::seconds(3601);
    other
        .put(
            &crate::cache::plan_of(&other, &expired, None),
            &answer,
            (12, 24),
            stamped,
        )
        .await;
    other.flush().await;
    // The gateway's cache poll (each second) learns of the other host's rows.
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let cache_of =
        |r: &reqwest::Response| r.headers()["x-sluice-cache"].to_str().unwrap().to_string();
    let r = app.chat(&token, &live).await;
    assert_eq!(
        (r.status().as_u16(), cache_of(&r)),
        (200, "hit-exact".into())
    );
    let r = app.chat(&token, &expired).await;
    assert_eq!(
        (r.status().as_u16(), cache_of(&r)),
        (200, "miss".into()),
        "expired by the database's clock, whatever this host's says"
    );
}
