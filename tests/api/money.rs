//! The money promise under attack (issue 14): every field that multiplies output is in the
//! reservation, a client that leaves while its reservation waits for the writer is charged
//! nothing and leaves nothing reserved (over HTTP); a settlement the store refuses is
//! retried until it lands, and the owner's sweep releases what nobody holds and renews
//! what someone does (on `Quota` and the store directly).

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;
use serde_json::json;
use sluice::clock::{Clock, ManualClock};
use sluice::config::ModelSettings;
use sluice::ops::housekeeping;
use sluice::quota::reservation::Quota;
use sluice::quota::{estimate, pricing};
use sluice::store::ledger::{self, Orphans, Owner};
use sluice::store::{processes, Db};
use sluice::usage::Usage;

use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, Engine};
use crate::pg_money::{master_key, pg_owner};

const PRICES: pricing::Prices = pricing::Prices::plain(150_000, 600_000);

/// The worst case of a `/v1/completions` request for `prompt` with `max_tokens` × `copies`.
fn completion_worst(prompt: &str, max_tokens: i64, copies: i64) -> i64 {
    let input = pricing::input_with_margin(estimate::count_text(prompt), 1.10, 16);
    pricing::cost(
        Usage {
            input,
            output: max_tokens * copies,
            ..Default::default()
        },
        PRICES,
    )
}

async fn best_of_is_priced_as_the_completions_the_upstream_bills(engine: Engine) {
    let app = spawn_app_on(engine, |_, _| {}).await;
    let prompt = "Write a haiku about budgets.";
    // Enough for three single completions, not for one request with best_of = 4.
    let budget = 3 * completion_worst(prompt, 100, 1);
    let (id, token) = app.token("carol", Some(&pricing::usd(budget))).await;
    let body = |extra: serde_json::Value| {
        let mut b = json!({"model": "gpt-4o-mini", "prompt": prompt, "max_tokens": 100});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let resp = app
        .post("/v1/completions", &token, &body(json!({"best_of": 4})))
        .await;
    assert_eq!(
        resp.status(),
        429,
        "best_of = 4 must reserve four completions"
    );
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert_eq!(app.mock.state.stats(KEY_A).count, 0);

    let resp = app
        .post("/v1/completions", &token, &body(json!({"best_of": 2})))
        .await;
    assert_eq!(resp.status(), 200);
    // Out of range, below n, or on a route that has no best_of: refused, naming it.
    for (path, extra) in [
        ("/v1/completions", json!({"best_of": 20})),
        ("/v1/completions", json!({"best_of": 1, "n": 2})),
        ("/v1/completions", json!({"best_of": "many"})),
        (
            "/v1/chat/completions",
            json!({"best_of": 2, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        let resp = app.post(path, &token, &body(extra.clone())).await;
        assert_eq!(resp.status(), 400, "{path} {extra}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], "best_of", "{path} {extra}");
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
    app.assert_invariant().await;
    assert!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await
            > 0
    );
}
on_both_engines!(best_of_is_priced_as_the_completions_the_upstream_bills);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_reservation_waits_is_charged_nothing() {
    let app = Arc::new(spawn_app().await);
    let (id, token) = app.token("dave", Some("1.00")).await;
    // Another connection holds the database's writes: the reservation waits in the writer.
    let blocker = hold_the_store(&app.settings.database.url).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .json(&chat_body(100))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up before an answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocker.release().await;
    // Released (or never written) within seconds, without any restart.
    app.wait_settled().await;
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        0,
        "the upstream was never called"
    );
    let charged = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros + reserved_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(charged, 0, "nothing reserved, nothing charged");
    app.assert_invariant().await;
}

/// A token with a daily budget of `limit`, its user and team unlimited, and a `Quota` over
/// a fresh database (on `engine`) at a fixed time.
async fn quota_rig(
    engine: Engine,
    limit: i64,
) -> (tempfile::TempDir, Db, Arc<ManualClock>, Arc<Quota>, Owner) {
    let dir = tempfile::tempdir().unwrap();
    let unlimited = Budget {
        limit: None,
        reset: "never",
    };
    let levels = [
        Budget {
            limit: Some(limit),
            reset: "daily",
        },
        unlimited.clone(),
        unlimited,
    ];
    let (db, owner) = match engine {
        Engine::Sqlite => {
            let db = Db::open(&dir.path().join("q.db"), false).await.unwrap();
            let owner = budget_owner(&db, &levels).await;
            (db, owner)
        }
        Engine::Postgres => {
            let db = Db::open_postgres(&crate::pg_server::database(), &master_key())
                .await
                .unwrap();
            let owner = pg_owner(db.postgres().unwrap(), &levels).await;
            (db, owner)
        }
    };
    let clock = Arc::new(ManualClock::new(
        chrono::Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap(),
    ));
    let quota = Quota::new(&db, clock.clone(), "me".into());
    (dir, db, clock, quota, owner)
}

/// Makes the store refuse (or accept again) every settlement: a trigger on the
/// reservation's delete, switched by a flag table.
async fn refuse_settlements(db: &Db, refuse: bool) {
    let statements: &[&str] = match (refuse, db.postgres().is_some()) {
        (false, _) => &["DELETE FROM disk_on_fire"],
        (true, false) => &[
            "CREATE TABLE IF NOT EXISTS disk_on_fire (x)",
            "INSERT INTO disk_on_fire VALUES (1)",
            "CREATE TRIGGER IF NOT EXISTS no_settle BEFORE DELETE ON reservations
             WHEN (SELECT COUNT(*) FROM disk_on_fire) > 0 BEGIN SELECT RAISE(ABORT, 'disk on fire'); END",
        ],
        (true, true) => &[
            "CREATE TABLE IF NOT EXISTS disk_on_fire (x INT)",
            "INSERT INTO disk_on_fire VALUES (1)",
            "CREATE OR REPLACE FUNCTION no_settle() RETURNS trigger AS $$ BEGIN
                 IF (SELECT COUNT(*) FROM disk_on_fire) > 0 THEN RAISE EXCEPTION 'disk on fire'; END IF;
                 RETURN OLD; END $$ LANGUAGE plpgsql",
            "DROP TRIGGER IF EXISTS no_settle ON reservations",
            "CREATE TRIGGER no_settle BEFORE DELETE ON reservations FOR EACH ROW EXECUTE FUNCTION no_settle()",
        ],
    };
    for sql in statements {
        sql_exec(db, sql).await;
    }
}

/// Waits (bounded) until every settlement of `quota` has landed.
async fn settlements_landed(quota: &Quota) {
    for _ in 0..500 {
        if quota.live_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("settlements still under way after 5 s");
}

async fn token_row(db: &Db, id: i64) -> (i64, i64, i64) {
    let used = sql_int(
        db,
        &format!("SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"),
    )
    .await;
    let reserved = sql_int(
        db,
        &format!("SELECT reserved_micros FROM tokens WHERE id = {id}"),
    )
    .await;
    let open = sql_int(db, "SELECT COUNT(*) FROM reservations").await;
    (used, reserved, open)
}

/// Item 5: a settlement that fails on a store error answers at once with the decided
/// amounts and is retried in the background until it lands.
async fn a_settlement_that_fails_is_retried_until_it_lands(engine: Engine) {
    let (_dir, db, _clock, quota, owner) = quota_rig(engine, 10_000).await;
    let held = quota.reserve("req-1", &owner, 1_000).await.unwrap();
    refuse_settlements(&db, true).await;
    let s = held.settle(300).await;
    assert_eq!(
        (s.charged, s.absorbed),
        (300, 0),
        "the amounts are decided at once"
    );
    // Still reserved: the store refused, and the retry keeps it held meanwhile.
    assert_eq!(token_row(&db, owner.token_id).await, (1_000, 1_000, 1));
    assert_eq!(quota.live_count(), 1);
    refuse_settlements(&db, false).await;
    settlements_landed(&quota).await;
    assert_eq!(
        token_row(&db, owner.token_id).await,
        (300, 0, 0),
        "landed: charged 300"
    );
    assert_invariant_on(&db).await;
}
on_both_engines!(a_settlement_that_fails_is_retried_until_it_lands);

/// A reservation `held` (1 000) a live request holds and one `stray` (2 000) of this process
/// no request holds (its holder vanished), on a $0.01 token.
async fn held_and_stray(
    engine: Engine,
) -> (
    (tempfile::TempDir, Db, Arc<ManualClock>, Arc<Quota>, Owner),
    sluice::quota::reservation::Held,
) {
    let (dir, db, clock, quota, owner) = quota_rig(engine, 10_000).await;
    let held = quota.reserve("held", &owner, 1_000).await.unwrap();
    let stray = ledger::ReserveRequest {
        request_id: "stray",
        owner: &owner,
        amount: 2_000,
        process: quota.process_id(),
        lease: chrono::Duration::minutes(10),
    };
    ledger::reserve(&db, &stray, clock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(token_row(&db, owner.token_id).await, (3_000, 3_000, 2));
    ((dir, db, clock, quota, owner), held)
}

/// The lease deadline of the reservation `held`.
async fn held_deadline(db: &Db) -> String {
    sql_text(
        db,
        "SELECT deadline FROM reservations WHERE request_id = 'held'",
    )
    .await
}

/// Item 2's sweep: a reservation of this process that no live request holds is released
/// (nothing charged); one a live request holds keeps it, and its lease is renewed.
async fn the_sweep_releases_what_nobody_holds_and_renews_what_someone_does(engine: Engine) {
    let ((_dir, db, clock, quota, owner), held) = held_and_stray(engine).await;
    let deadline = || held_deadline(&db);
    let before = deadline().await;
    // Six minutes on: the held lease has less than half its length left.
    clock.advance(chrono::Duration::minutes(6));
    housekeeping::sweep_own(&quota, &db, clock.now())
        .await
        .unwrap();
    assert_eq!(
        token_row(&db, owner.token_id).await,
        (1_000, 1_000, 1),
        "the stray was released at 0"
    );
    assert!(deadline().await > before, "the held lease was renewed");
    // An owner that beats but lets a lease run out by its own clock: anyone settles it as
    // an orphan.
    let me = processes::Me::new(quota.process_id().to_string(), "here".into());
    processes::heartbeat(&db, &me, clock.now()).await.unwrap();
    assert_eq!(
        ledger::settle_orphans(&db, Orphans::LeaseExpired, clock.now())
            .await
            .unwrap(),
        0,
        "a renewed lease is not expired"
    );
    clock.advance(chrono::Duration::minutes(11));
    processes::heartbeat(&db, &me, clock.now()).await.unwrap();
    let n = ledger::settle_orphans(&db, Orphans::LeaseExpired, clock.now())
        .await
        .unwrap();
    assert_eq!(n, 1, "an unrenewed lease is settled as an orphan");
    let s = held.settle(400).await;
    assert_eq!(s.charged, 400);
    assert_eq!(
        token_row(&db, owner.token_id).await,
        (400, 0, 0),
        "the late settlement corrected it"
    );
    assert_invariant_on(&db).await;
}
on_both_engines!(the_sweep_releases_what_nobody_holds_and_renews_what_someone_does);

/// A release the store refuses does not stop the sweep renewing live leases: it stopped at
/// the first failed release and renewed nothing, while the heartbeat went on, so about
/// five minutes later the live requests' reservations were taken as orphans and charged
/// in full mid-request (s29 money attack F3; on PostgreSQL a release goes through the
/// writer's connection, renewals through the pool).
async fn a_failing_release_does_not_stop_lease_renewals(engine: Engine) {
    let ((_dir, db, clock, quota, owner), held) = held_and_stray(engine).await;
    let deadline = || held_deadline(&db);
    let before = deadline().await;
    refuse_settlements(&db, true).await;
    clock.advance(chrono::Duration::minutes(6));
    assert!(
        housekeeping::sweep_own(&quota, &db, clock.now())
            .await
            .is_err(),
        "the failed release is reported"
    );
    assert!(
        deadline().await > before,
        "the held lease was renewed all the same"
    );
    refuse_settlements(&db, false).await;
    housekeeping::sweep_own(&quota, &db, clock.now())
        .await
        .unwrap();
    assert_eq!(token_row(&db, owner.token_id).await, (1_000, 1_000, 1));
    held.settle(1_000).await;
    settlements_landed(&quota).await;
    assert_invariant_on(&db).await;
}
on_both_engines!(a_failing_release_does_not_stop_lease_renewals);

/// Attack finding: a client whose own deadline (`x-sluice-request-deadline-ms`) cuts an
/// attempt off after the upstream had it pays its input, as when it disconnects — a short
/// deadline is not a way to have the provider read a prompt for free.
async fn a_deadline_that_cuts_the_upstream_off_charges_the_input(engine: Engine) {
    let app = spawn_app_on(engine, |_, _| {}).await;
    let (id, token) = app.token("fran", Some("1.00")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(sluice::mock::Script {
            delay_ms: 3_000,
            ..Default::default()
        }),
    );
    let resp = app.chat_with_deadline(&token, &chat_body(100), 300).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "the upstream had the request"
    );
    let counted = estimate::chat_input(
        &[json!({"role": "user", "content": "Why does the engine light blink?"})],
        None,
    );
    let input_cost = pricing::cost(
        Usage {
            input: counted,
            ..Default::default()
        },
        PRICES,
    );
    app.wait_for_log_rows(1).await;
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        input_cost
    );
    assert_eq!(
        app.scalar("SELECT cost_micros FROM requests").await,
        input_cost
    );
}
on_both_engines!(a_deadline_that_cuts_the_upstream_off_charges_the_input);

/// Attack finding: a client that leaves while its answer's settlement waits for the writer
/// (the handler's future is dropped) — and the store then refuses that settlement — is
/// still charged what it was served: the settlement goes on in the background, and the
/// sweep never takes the reservation meanwhile.
async fn a_settlement_abandoned_mid_await_still_lands(engine: Engine) {
    let (_dir, db, clock, quota, owner) = quota_rig(engine, 10_000).await;
    let held = quota.reserve("req-1", &owner, 1_000).await.unwrap();
    refuse_settlements(&db, true).await;
    // The settlement cannot land while we hold the store: on SQLite the writer's one
    // connection, on PostgreSQL every table (EXCLUSIVE: writes wait, plain reads pass).
    let hold = match db.postgres() {
        None => Ok(db.sqlite().write.acquire().await.unwrap()),
        Some(pg) => {
            let mut tx = pg.pool.begin().await.unwrap();
            sqlx::query(
                "LOCK TABLE tokens, users, teams, reservations, ledger, requests IN EXCLUSIVE MODE",
            )
            .execute(&mut *tx)
            .await
            .unwrap();
            Err(tx)
        }
    };
    let settling = tokio::spawn(async move { held.settle(300).await });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // On PostgreSQL: until the settlement's statement waits on the lock (bounded).
    if db.postgres().is_some() {
        let waiting = "SELECT COUNT(*) FROM pg_locks WHERE NOT granted
                       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
        let mut polls = 0;
        while sql_int(&db, waiting).await == 0 {
            polls += 1;
            assert!(polls < 500, "the settlement never waited on the store");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    settling.abort();
    let _ = settling.await;
    match hold {
        Ok(conn) => drop(conn),
        Err(tx) => tx.commit().await.unwrap(),
    }
    // The store refuses the settlement once; the owner's sweep must not take the
    // reservation for unheld meanwhile.
    tokio::time::sleep(Duration::from_millis(30)).await;
    housekeeping::sweep_own(&quota, &db, clock.now())
        .await
        .unwrap();
    refuse_settlements(&db, false).await;
    settlements_landed(&quota).await;
    assert_eq!(
        token_row(&db, owner.token_id).await,
        (300, 0, 0),
        "charged what was served"
    );
    assert_invariant_on(&db).await;
}
// One body, two stores, on a current-thread runtime (not `on_both_engines!`): the yields
// above then run the settlement up to its wait before it is abandoned.
mod a_settlement_abandoned_mid_await_still_lands {
    use crate::pg_gateway_app::Engine;

    #[tokio::test]
    async fn sqlite() {
        super::a_settlement_abandoned_mid_await_still_lands(Engine::Sqlite).await
    }
    #[tokio::test]
    async fn postgres() {
        super::a_settlement_abandoned_mid_await_still_lands(Engine::Postgres).await
    }
}

/// Attack finding: a process whose clock is days ahead must neither expire another
/// owner's live leases nor forget the orphan records a live (or stalled) owner may still
/// settle — leases are judged by their owner's own clock, and orphan records of a
/// registered owner are kept.
async fn a_clock_days_ahead_neither_expires_leases_nor_forgets_orphans(engine: Engine) {
    let (_dir, db, clock, quota, owner) = quota_rig(engine, 10_000).await;
    let me = processes::Me::new(quota.process_id().to_string(), "here".into());
    processes::heartbeat(&db, &me, clock.now()).await.unwrap();
    let held = quota.reserve("live", &owner, 1_000).await.unwrap();
    let ahead = clock.now() + chrono::Duration::days(2);
    let n = ledger::settle_orphans(&db, Orphans::LeaseExpired, ahead)
        .await
        .unwrap();
    assert_eq!(n, 0, "a live lease expired by another process's clock");
    // Taken for gone across hosts (a stall), then a clock days ahead prunes orphan records.
    let n = ledger::settle_orphans(&db, Orphans::OfOwner(quota.process_id()), clock.now())
        .await
        .unwrap();
    assert_eq!(n, 1);
    ledger::prune_orphaned(&db, ahead - chrono::Duration::days(1))
        .await
        .unwrap();
    let s = held.settle(250).await;
    assert_eq!(s.charged, 250);
    assert_eq!(
        token_row(&db, owner.token_id).await,
        (250, 0, 0),
        "the stalled owner's late settlement found its orphan record"
    );
    assert_invariant_on(&db).await;
}
on_both_engines!(a_clock_days_ahead_neither_expires_leases_nor_forgets_orphans);

/// Review finding (s18): a `/v1/completions` prompt array makes the upstream generate `n`
/// completions for each prompt, and the reservation held one prompt's: four prompts of
/// 100 tokens each were reserved as 100 tokens of output, the rest absorbed. A stream
/// whose choices (`n` × prompts) pass the 32 the stream reader tells apart is refused,
/// naming `prompt`.
#[tokio::test]
async fn a_prompt_array_is_priced_as_the_completions_the_upstream_bills() {
    let app = spawn_app().await;
    let prompt = "Write a haiku about budgets.";
    let budget = 3 * completion_worst(prompt, 100, 1);
    let (_, token) = app.token("erin", Some(&pricing::usd(budget))).await;
    let prompts = |k: usize| json!(vec![prompt; k]);
    let resp = app
        .post(
            "/v1/completions",
            &token,
            &json!({"model": "gpt-4o-mini", "prompt": prompts(4), "max_tokens": 100}),
        )
        .await;
    assert_eq!(resp.status(), 429, "four prompts reserve four completions");
    let resp = app
        .post(
            "/v1/completions",
            &token,
            &json!({"model": "gpt-4o-mini", "prompt": prompts(2), "max_tokens": 100}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let resp = app
        .post(
            "/v1/completions",
            &token,
            &json!({"model": "gpt-4o-mini", "prompt": prompts(17), "n": 2,
                "max_tokens": 1, "stream": true}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    app.assert_invariant().await;
}

/// Definitions the provider bills as input outside `messages`: legacy `functions`, a
/// `response_format` JSON schema (both injected into the prompt by OpenAI), a Responses
/// `text.format` schema and an Anthropic `output_format` schema. Each is counted as input
/// in the reservation, so a token whose budget fits the short request but not the counted
/// definitions is refused before any upstream call, and nothing is absorbed.
async fn billed_definitions_outside_messages_are_reserved_as_input(engine: Engine) {
    let app = spawn_app_on(engine, add_claude).await;
    let hi = [json!({"role": "user", "content": "hi"})];
    let short_input = pricing::input_with_margin(estimate::chat_input(&hi, None), 1.10, 16);
    let short = pricing::cost(
        Usage {
            input: short_input,
            output: 1,
            ..Default::default()
        },
        PRICES,
    );
    let (_, token) = app.token("fred", Some(&pricing::usd(3 * short))).await;
    let long = "word ".repeat(20_000);
    let chat = |extra: serde_json::Value| {
        let mut b = json!({"model": "gpt-4o-mini", "max_tokens": 1, "messages": hi});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    // The text in a description, then in a property name (s26 final attack #1: an object
    // key counted at most 2 tokens).
    let mut named = serde_json::Map::new();
    named.insert(long.clone(), json!({"type": "string"}));
    let schemas = [
        json!({"type": "object", "description": long}),
        json!({"type": "object", "properties": named}),
    ];
    let cases = schemas.iter().flat_map(|schema| {
        [
            (
                "/v1/chat/completions",
                chat(json!({"functions": [{"name": "f", "parameters": schema}]})),
            ),
            (
                "/v1/chat/completions",
                chat(json!({"tools": [{"type": "function",
                    "function": {"name": "f", "parameters": schema}}]})),
            ),
            (
                "/v1/chat/completions",
                chat(json!({"response_format": {"type": "json_schema",
                    "json_schema": {"name": "s", "schema": schema}}})),
            ),
            (
                "/v1/responses",
                json!({"model": "gpt-4o-mini", "max_output_tokens": 16, "input": "hi",
                    "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}}),
            ),
            (
                "/v1/messages",
                json!({"model": "claude", "max_tokens": 1, "messages": hi,
                    "output_format": {"type": "json_schema", "schema": schema}}),
            ),
        ]
    });
    for (path, body) in cases {
        app.mock.state.sticky(
            "*",
            Some(sluice::mock::Script {
                prompt_tokens: Some(20_012),
                completion_tokens: Some(1),
                ..sluice::mock::Script::default()
            }),
        );
        let resp = app.send(path, &token, &body).await;
        let status = resp.status();
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        assert_eq!(status, 429, "{path}: {v}");
        assert_eq!(v["error"]["code"], "insufficient_quota", "{path}: {v}");
    }
    app.wait_settled().await;
    assert_eq!(app.mock.state.total_count(), 0, "no upstream call");
    let absorbed = app
        .scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'absorbed'")
        .await;
    assert_eq!(absorbed, 0, "absorbed rows");
    // Rejected predicted tokens are billed as output beyond any cap the reservation
    // knows: refused, naming the field.
    let predicted = chat(json!({"prediction": {"type": "content", "content": long}}));
    let resp = app.chat(&token, &predicted).await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "prediction", "{v}");
    assert_eq!(app.mock.state.total_count(), 0, "no upstream call");
    // The short request itself fits the budget.
    app.mock.state.sticky("*", None);
    assert_eq!(app.chat(&token, &chat(json!({}))).await.status(), 200);
    app.assert_invariant().await;
}
on_both_engines!(billed_definitions_outside_messages_are_reserved_as_input);

/// Claude adds a tool-use system prompt to every request with tools (Anthropic's "tool use
/// pricing": 159 to 530 input tokens by model and tool choice), billed as input though the
/// client never sent it: the reservation counts the largest, so a short request with one
/// tool is not absorbed in part.
async fn claudes_tool_use_system_prompt_is_reserved_as_input(engine: Engine) {
    let app = spawn_app_on(engine, add_claude).await;
    let (_, token) = app.token("gina", Some("1.00")).await;
    let hi = [json!({"role": "user", "content": "hi"})];
    let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
    let counted = estimate::chat_input(&hi, Some(&tools));
    app.mock.state.sticky(
        KEY_B,
        Some(sluice::mock::Script {
            prompt_tokens: Some(counted + sluice::pipeline::request::TOOL_USE_PROMPT),
            completion_tokens: Some(1),
            ..sluice::mock::Script::default()
        }),
    );
    let body = json!({"model": "claude", "max_tokens": 1, "messages": hi, "tools": tools});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    app.wait_settled().await;
    let absorbed = app.absorbed().await;
    assert_eq!(absorbed, 0, "the gateway absorbed {absorbed} micro-USD");
    app.assert_invariant().await;
}
on_both_engines!(claudes_tool_use_system_prompt_is_reserved_as_input);

/// s26 final attack #5: a Claude served in OpenAI's format (an OpenAI-compatible proxy,
/// Anthropic's compatibility endpoint) takes legacy `functions` as tools and bills its
/// tool-use prompt for them too: reserved as for `tools`.
async fn claudes_tool_use_prompt_is_reserved_for_legacy_functions(engine: Engine) {
    let app = spawn_app_on(engine, |s, _| {
        s.models.push(ModelSettings {
            routes: vec![route("a", "claude-sonnet-4-20250514")],
            ..model("claude-compat", &[])
        });
    })
    .await;
    let (_, token) = app.token("gina", Some("1.00")).await;
    let hi = [json!({"role": "user", "content": "hi"})];
    let functions = json!([{"name": "f", "parameters": {"type": "object"}}]);
    let counted = estimate::chat_input(&hi, None) + estimate::count_value(&functions);
    app.mock.state.sticky(
        KEY_A,
        Some(sluice::mock::Script {
            prompt_tokens: Some(counted + sluice::pipeline::request::TOOL_USE_PROMPT),
            completion_tokens: Some(1),
            ..sluice::mock::Script::default()
        }),
    );
    let body = json!({"model": "claude-compat", "max_tokens": 1, "messages": hi,
        "functions": functions});
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    app.wait_settled().await;
    let absorbed = app.absorbed().await;
    assert_eq!(absorbed, 0, "the gateway absorbed {absorbed} micro-USD");
    app.assert_invariant().await;
}
on_both_engines!(claudes_tool_use_prompt_is_reserved_for_legacy_functions);

/// Anthropic-defined client tools (`bash_…`, `text_editor_…`, `computer_…`) are sent as a
/// type and a name, yet Anthropic bills their whole definitions as input (245, 700 and
/// 735 + 499 tokens): reserved, so a request with all three is not absorbed in part (s26
/// streams attack: they were reserved as their JSON only).
async fn anthropic_defined_tools_are_reserved_as_their_definitions(engine: Engine) {
    use sluice::pipeline::request::{DEFINED_TOOLS, TOOL_USE_PROMPT};
    let app = spawn_app_on(engine, add_claude).await;
    let (_, token) = app.token("gina", Some("1.00")).await;
    let hi = [json!({"role": "user", "content": "hi"})];
    let tools = json!([
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
            "display_height_px": 768}
    ]);
    let defined: i64 = DEFINED_TOOLS.iter().map(|(_, n)| n).sum();
    let billed = estimate::chat_input(&hi, Some(&tools)) + TOOL_USE_PROMPT + defined;
    app.mock.state.sticky(
        KEY_B,
        Some(sluice::mock::Script {
            prompt_tokens: Some(billed),
            completion_tokens: Some(1),
            ..sluice::mock::Script::default()
        }),
    );
    let body = json!({"model": "claude", "max_tokens": 1, "messages": hi, "tools": tools});
    let resp = app.messages(&token, &body).await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    app.wait_settled().await;
    let absorbed = app.absorbed().await;
    assert_eq!(absorbed, 0, "the gateway absorbed {absorbed} micro-USD");
    app.assert_invariant().await;
}
on_both_engines!(anthropic_defined_tools_are_reserved_as_their_definitions);
