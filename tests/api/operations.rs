//! Running it for real: metrics, alerts, backups and restore.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice::config::{Secret, WebhookSettings};
use sluice::mock::Script;

use crate::helpers::*;

#[tokio::test]
async fn metrics_carry_the_designed_names_and_bounded_labels() {
    let app = spawn_app().await;
    let (id, token) = app.token("alice", Some("1")).await;
    for _ in 0..3 {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    }
    let mut cached = chat_body(10);
    cached["temperature"] = serde_json::json!(0);
    app.chat(&token, &cached).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(429),
            ..Default::default()
        }],
    );
    app.chat(&token, &chat_body(10)).await;
    app.wait_for_log_rows(5).await;
    let text = app.metrics().await;
    for needle in [
        format!("gateway_requests_total{{token=\"{id}\",model=\"gpt-4o-mini\",status=\"200\"}}"),
        "gateway_request_duration_seconds_bucket".into(),
        "gateway_upstream_latency_seconds_bucket{provider=\"openai\",upstream=\"a\"".into(),
        "gateway_upstream_429_total{upstream=\"a\"}".into(),
        "gateway_breaker_state{upstream=\"a\"} 0".into(),
        "gateway_keypool_available{model=\"gpt-4o-mini\"}".into(),
        "gateway_queue_depth{priority=\"1\"} 0".into(),
        "gateway_cache_requests_total{result=\"miss\"}".into(),
        format!("gateway_quota_remaining_usd{{token=\"{id}\"}}"),
        "# HELP gateway_requests_total".into(),
    ] {
        assert!(text.contains(&needle), "missing {needle} in\n{text}");
    }
    assert!(!text.contains(&token[6..20]), "no token text in metrics");
    assert!(!text.contains(KEY_A));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_alert_reaches_the_webhook_once_per_cooloff() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let app = spawn_app_with(move |s, m| {
        s.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
        s.redis = Some(sluice::config::RedisSettings {
            url: Secret(secrecy::SecretString::from(url)),
            ..Default::default()
        });
        s.breaker.open_seconds = 30;
        s.backup.dir = "/proc/sluice-cannot-write-here".into();
    })
    .await;
    let mut redis = redis;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("0.000100"),
            ..issue_args("bob")
        })
        .await;
    // Budget threshold: five answers of 17 micro-dollars use 85 % of 100.
    for _ in 0..5 {
        app.chat(&token, &chat_body(100)).await;
    }
    // Breaker opens, then the pool has nothing left.
    let (_, rich) = app.token("carol", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(500),
            ..Default::default()
        }),
    );
    for _ in 0..5 {
        app.chat(&rich, &chat_body(10)).await;
    }
    // Redis down.
    redis.kill();
    let (_, limited) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(100),
            ..issue_args("dan")
        })
        .await;
    app.chat(&limited, &chat_body(10)).await;
    // A failed backup: the scheduled one, due at start, cannot write into /proc (the
    // gateway's own task raises it; nothing here does). On PostgreSQL no backup is
    // scheduled (the server backs itself up), so none fails and none may be alerted.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let backup_failed = usize::from(app.db().backs_up_to_file());
    let received: Vec<Value> = app
        .mock
        .state
        .stats("webhook")
        .last_bodies
        .into_iter()
        .collect();
    let kinds: Vec<&str> = received
        .iter()
        .map(|b| b["kind"].as_str().unwrap())
        .collect();
    for (kind, times) in [
        ("budget_threshold", 1),
        ("breaker_open", 1),
        ("pool_empty", 1),
        ("ratelimit_degraded", 1),
        ("backup_failed", backup_failed),
    ] {
        assert_eq!(
            kinds.iter().filter(|k| **k == kind).count(),
            times,
            "{kind} {times} time(s) in {kinds:?}"
        );
    }
    let b = received
        .iter()
        .find(|b| b["kind"] == "breaker_open")
        .unwrap();
    assert_eq!(b["source"], "sluice");
    assert_eq!(b["subject"], "a");
    assert!(b["at"].as_str().is_some());
}

#[test]
fn webhook_bodies_follow_each_receivers_format() {
    let a = sluice::ops::alerts::Alert {
        kind: "breaker_open",
        subject: "openai-a".into(),
        message: "opened".into(),
        at: chrono::Utc::now(),
    };
    assert!(sluice::ops::alerts::body("slack", &a)["text"]
        .as_str()
        .unwrap()
        .contains("breaker_open"));
    for f in ["dingtalk", "wecom"] {
        let b = sluice::ops::alerts::body(f, &a);
        assert_eq!(b["msgtype"], "text");
        assert!(b["text"]["content"].as_str().unwrap().contains("openai-a"));
    }
    assert_eq!(
        sluice::ops::alerts::body("generic", &a)["kind"],
        "breaker_open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_an_empty_folder_and_serves() {
    let app = Arc::new(spawn_app().await);
    let (_, token) = app.token("eve", Some("5")).await;
    let load = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move {
            for _ in 0..150 {
                assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dir = app.dir.path().join("backups");
    let mut last = None;
    for _ in 0..3 {
        last = Some(
            sluice::ops::backup::backup_now(&app.state.db, &dir, 2, chrono::Utc::now())
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    load.await.unwrap();
    let backup = last.unwrap();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "only the newest two are kept"
    );
    assert_eq!(
        std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let fresh = tempfile::tempdir().unwrap();
    let target = fresh.path().join("restored/sluice.db");
    let restored = sluice::ops::backup::restore(&backup, &target, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(restored.integrity, "ok");
    let mut settings = app.settings.clone();
    settings.database.url = format!("sqlite://{}", target.display());
    let gateway = sluice::startup::Application::build(settings.clone())
        .await
        .unwrap();
    let url = format!("http://127.0.0.1:{}/v1/chat/completions", gateway.port());
    tokio::spawn(gateway.run_until_stopped());
    let resp = app
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&chat_body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        200,
        "the restored gateway knows the token and its budget"
    );
    let db = sluice::store::Db::open(&target, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sluice::store::ledger::invariant_violations(&db)
        .await
        .unwrap()
        .is_empty());

    // A restore onto a database a gateway is running on is refused.
    let refused =
        sluice::ops::backup::restore(&backup, &settings.database_path(), chrono::Utc::now()).await;
    assert!(matches!(
        refused,
        Err(sluice::ops::backup::BackupError::InUse(_))
    ));
}

/// `[backup] interval_hours`: a backup is taken at start when the folder has none, then only
/// when the newest is an interval old — also across a restart or another replica sharing
/// the folder, since the newest file's name says when it was taken.
#[tokio::test]
async fn backups_are_taken_on_schedule() {
    let clock = Arc::new(sluice::clock::ManualClock::new(
        chrono::DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc),
    ));
    let app = spawn_app_full(|s, _| s.backup.interval_hours = 1, Some(clock.clone())).await;
    let dir = std::path::PathBuf::from(&app.settings.backup.dir);
    let backups = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("sluice-") && n.ends_with(".db"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let bound = std::time::Instant::now() + Duration::from_secs(10);
    while backups().is_empty() {
        assert!(
            std::time::Instant::now() < bound,
            "no backup taken at start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(backups(), ["sluice-20261201T120000.000Z.db"]);
    let interval = chrono::Duration::hours(1);
    let at =
        |minutes| sluice::clock::Clock::now(clock.as_ref()) + chrono::Duration::minutes(minutes);
    let db = &app.state.db;
    let taken = sluice::ops::backup::backup_if_due(db, &dir, 7, interval, at(59))
        .await
        .unwrap();
    assert_eq!(taken, None, "not due 59 minutes after the last");
    let taken = sluice::ops::backup::backup_if_due(db, &dir, 7, interval, at(60))
        .await
        .unwrap();
    assert!(taken.is_some(), "due an hour after the last");
    assert_eq!(backups().len(), 2);
}

/// On PostgreSQL the server backs itself up (`pg_dump`, point-in-time recovery): with
/// `[backup] interval_hours` set, the gateway schedules no file backup — none is written,
/// none fails and no `backup_failed` is alerted — while a SQLite gateway started alike
/// takes its backup at start; a backup asked for all the same refuses by name and leaves
/// no file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_no_file_backup_is_scheduled_nor_alerted() {
    use crate::pg_gateway_app::{spawn_app_on, Engine};
    let scheduled = |s: &mut sluice::config::Settings, m: &sluice::mock::MockServer| {
        s.backup.interval_hours = 1;
        s.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
    };
    let pg = spawn_app_on(Engine::Postgres, scheduled).await;
    let lite = spawn_app_on(Engine::Sqlite, scheduled).await;
    let files = |app: &TestApp| -> Vec<String> {
        std::fs::read_dir(&app.settings.backup.dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("sluice-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Both schedules start with their gateway: by the time SQLite's first backup is
    // written, PostgreSQL's would have been tried.
    let bound = std::time::Instant::now() + Duration::from_secs(20);
    while files(&lite).is_empty() {
        assert!(
            std::time::Instant::now() < bound,
            "no SQLite backup at start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        files(&pg),
        Vec::<String>::new(),
        "a file backup on PostgreSQL"
    );
    let alerts = pg.mock.state.stats("webhook").last_bodies;
    assert!(
        alerts.iter().all(|b| b["kind"] != "backup_failed"),
        "{alerts:?}"
    );
    let dir = std::path::Path::new(&pg.settings.backup.dir).join("asked");
    let refused = sluice::ops::backup::backup_now(pg.db(), &dir, 3, chrono::Utc::now()).await;
    let message = refused
        .expect_err("a file backup of PostgreSQL")
        .to_string();
    assert!(message.contains("pg_dump"), "{message}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "a file left behind"
    );
}

/// Backups written while the clock ran two days ahead (then corrected), and a stray
/// `sluice-*.db` that is no backup: the scheduled backup must take one now, keep it, and
/// then wait an interval — not take one every minute only for the prune to delete it
/// because the stale names sort after it.
#[tokio::test]
async fn stale_future_backups_neither_evict_the_fresh_one_nor_make_every_minute_due() {
    let (app, dir, now, interval) = backup_rig().await;
    let db = &app.state.db;
    for i in 0..3 {
        let ahead = now + chrono::Duration::days(2) + chrono::Duration::minutes(i);
        sluice::ops::backup::backup_now(db, &dir, 3, ahead)
            .await
            .unwrap();
    }
    let taken = sluice::ops::backup::backup_if_due(db, &dir, 3, interval, now)
        .await
        .unwrap()
        .expect("due: the newest is two days in the future");
    assert!(
        taken.exists(),
        "the backup just taken was pruned at once: {}",
        taken.display()
    );
    for m in 1..=3 {
        let again = sluice::ops::backup::backup_if_due(
            db,
            &dir,
            3,
            interval,
            now + chrono::Duration::minutes(m),
        )
        .await
        .unwrap();
        assert_eq!(again, None, "another backup {m} minute(s) after the last");
    }

    // keep = 1 and a stray file named like a backup.
    let dir = std::path::Path::new(&app.settings.backup.dir).join("stray");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sluice-notes.db"), b"not a backup").unwrap();
    let taken = sluice::ops::backup::backup_if_due(db, &dir, 1, interval, now)
        .await
        .unwrap()
        .expect("due: no backup yet");
    assert!(
        taken.exists(),
        "keep = 1: the backup just taken was pruned for a stray file: {}",
        taken.display()
    );
    let again = sluice::ops::backup::backup_if_due(
        db,
        &dir,
        1,
        interval,
        now + chrono::Duration::minutes(1),
    )
    .await
    .unwrap();
    assert_eq!(again, None, "another backup a minute after the last");
}

/// A backup cut short — the process killed while `VACUUM INTO` wrote it, leaving the file
/// half written (or still empty) under a backup's name — is no backup: the scheduled one
/// must not count it as the newest and wait an interval, and must not keep it in place of
/// a whole one.
#[tokio::test]
async fn a_backup_cut_short_by_a_crash_does_not_count_as_the_newest() {
    let (app, dir, now, interval) = backup_rig().await;
    let db = &app.state.db;
    let whole = sluice::ops::backup::backup_now(db, &dir, 3, now - chrono::Duration::hours(2))
        .await
        .unwrap();
    // What a kill during the next backup's `VACUUM INTO` leaves: its first pages only.
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.join("sluice-20261201T115900.000Z.db");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    // If the gateway can write a file of that name, so can it the whole backup.
    let taken = sluice::ops::backup::backup_if_due(db, &dir, 3, interval, now)
        .await
        .unwrap();
    assert!(
        taken.is_some(),
        "no backup taken: the cut file counted as one a minute old"
    );
}

/// A gateway whose own schedule is off, a backup folder of the test's, a fixed time and a
/// one-hour interval: the backup tests call `backup_if_due` themselves.
async fn backup_rig() -> (
    TestApp,
    std::path::PathBuf,
    chrono::DateTime<chrono::Utc>,
    chrono::Duration,
) {
    let app = spawn_app_full(|s, _| s.backup.interval_hours = 0, None).await;
    let dir = std::path::Path::new(&app.settings.backup.dir).join("scheduled");
    let now = chrono::DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    (app, dir, now, chrono::Duration::hours(1))
}

/// A backup cut short by a crash is never one of the `keep`, yet nothing ever removed it:
/// every crash during a backup left a partial copy of the database in the folder for good,
/// past any number of later backups (the folder grows without bound over crashes, and
/// `keep` no longer bounds what it holds). Once older than every backup kept, it goes.
#[tokio::test]
async fn a_backup_cut_short_is_pruned_once_older_than_every_backup_kept() {
    let (app, dir, now, interval) = backup_rig().await;
    let db = &app.state.db;
    let whole = sluice::ops::backup::backup_now(db, &dir, 2, now - chrono::Duration::hours(2))
        .await
        .unwrap();
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.join("sluice-20261201T115900.000Z.db");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    for h in 0..3 {
        sluice::ops::backup::backup_if_due(db, &dir, 2, interval, now + interval * h)
            .await
            .unwrap()
            .expect("due an interval after the last");
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("sluice-") && n.ends_with(".db"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "sluice-20261201T130000.000Z.db",
            "sluice-20261201T140000.000Z.db"
        ],
        "keep = 2: the cut-short copy of 11:59 outlived every later backup"
    );
}
