//! Benchmark of the spend reports (issue 20): a SQLite database of `--rows` request-log rows
//! (default 10 000 000) over a year, with the `spend_days` rollup and its monthly level
//! `spend_months`, then every report kind
//! timed through `store::spend::report` — the function the admin API, the CSV and the page
//! call.
//!
//!     cargo run --release --example spend_reports -- [--rows 10000000] [--db FILE] [--runs 3]
//!
//! The rows are generated inside SQLite (one `INSERT … SELECT` over a counter), and the
//! rollup is then built from them with the statement the migration uses to backfill it —
//! the same rows the write path adds (`admin_reports::the_rollup_equals_a_recomputation…`
//! checks that), without paying 10 M gateway writes here; the months follow the days by the
//! triggers every writer of `spend_days` goes through (migration `0023_spend_months`). The workload is shaped like a
//! real install: 20 teams, 200 users, 500 tokens; each token is one application with its
//! own two models, default tags and an occasional tag of its own.
//!
//! A benchmark, not a test: it asserts nothing. `--db` keeps the database for further runs
//! (an existing file is reused as it is).

use std::time::Instant;

use chrono::NaiveDate;
use sluice::cli::{self, IssueArgs, UserArgs};
use sluice::store::spend::{self, Dim, Filters, SpendQuery};
use sluice::store::Db;

struct Args {
    rows: u64,
    db: Option<std::path::PathBuf>,
    runs: usize,
}

fn args() -> Args {
    let mut a = Args {
        rows: 10_000_000,
        db: None,
        runs: 3,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        match (pair[0].as_str(), pair.get(1)) {
            ("--rows", Some(v)) => a.rows = v.parse().expect("--rows N"),
            ("--db", Some(v)) => a.db = Some(v.into()),
            ("--runs", Some(v)) => a.runs = v.parse().expect("--runs N"),
            _ => panic!("usage: spend_reports [--rows N] [--db FILE] [--runs N]"),
        }
    }
    a
}

const TEAMS: i64 = 20;
const USERS: i64 = 200;
const TOKENS: i64 = 500;

async fn tenants(db: &Db) {
    let now = chrono::Utc::now();
    for t in 0..TEAMS {
        let tags = format!("cost-center:cc{t}");
        cli::team_create_tagged(db, &format!("team{t}"), None, Some(&tags), now)
            .await
            .expect("team");
    }
    for u in 0..USERS {
        let team = format!("team{}", u % TEAMS);
        let user = format!("user{u}");
        let a = UserArgs {
            username: &user,
            team: Some(&team),
            rpm: None,
            tpm: None,
            budget_usd: None,
            reset: None,
        };
        cli::user_create(db, &a, now).await.expect("user");
    }
    for k in 0..TOKENS {
        let user = format!("user{}", k % USERS);
        let a = IssueArgs {
            user: &user,
            budget_usd: None,
            reset: None,
            expires: None,
            rpm: None,
            tpm: None,
            models: None,
            max_priority: 2,
            downgrade_model: None,
        };
        cli::token_issue(db, &a, now).await.expect("token");
    }
}

/// The request rows: token `k` (ids 1..=500) belongs to user `(k - 1) % 200` + 1 of team
/// `(k - 1) % 20` + 1; half its requests ask for `gpt-4o-mini`, half for its own second
/// model; two upstreams; 1 in 50 is a 429 (cost 0); every row carries `env:prod|dev` and
/// `project:p<k % 40>`, and one in eight adds `feature:f<0..4>`. Rows are spread evenly
/// over 2026.
const GENERATE: &str = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1),
     g AS (SELECT i, (i * 2654435761) % 500 + 1 AS k FROM n)
INSERT INTO requests (id, token_id, user_id, team_id, endpoint, model, served_model, upstream, status,
                      input_tokens, output_tokens, cost_micros, latency_ms, cache, created_at, tags)
SELECT printf('bench-%010d', i), k, (k - 1) % 200 + 1, (k - 1) % 20 + 1, 'chat',
       CASE WHEN i % 2 = 0 THEN 'gpt-4o-mini' WHEN k % 3 = 0 THEN 'gpt-4o' WHEN k % 3 = 1 THEN 'claude-haiku'
            ELSE 'gemini-flash' END,
       CASE WHEN i % 2 = 0 THEN 'gpt-4o-mini' WHEN k % 3 = 0 THEN 'gpt-4o' WHEN k % 3 = 1 THEN 'claude-haiku'
            ELSE 'gemini-flash' END,
       CASE WHEN i % 3 = 0 THEN 'up-b' ELSE 'up-a' END,
       CASE WHEN i % 50 = 0 THEN 429 ELSE 200 END,
       100 + i % 900, 10 + i % 300, CASE WHEN i % 50 = 0 THEN 0 ELSE 50 + (i * 7919) % 4000 END, 0, 'off',
       strftime('%Y-%m-%dT%H:%M:%fZ', 1767225600 + (i * 31536000) / ?1, 'unixepoch'),
       'env:' || CASE WHEN k % 4 = 0 THEN 'dev' ELSE 'prod' END
         || CASE WHEN i % 8 = 0 THEN ',feature:f' || (i % 5) ELSE '' END || ',project:p' || (k % 40)
FROM g";

async fn generate(db: &Db, rows: u64) {
    let pool = &db.sqlite().write;
    let started = Instant::now();
    sqlx::query(GENERATE)
        .bind(rows as i64)
        .execute(pool)
        .await
        .expect("rows generated");
    println!("{rows} request rows written in {:.1?}", started.elapsed());
    let started = Instant::now();
    sqlx::query("DELETE FROM spend_days")
        .execute(pool)
        .await
        .expect("emptied");
    sqlx::query(
        "INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                                 requests, errors, input_tokens, output_tokens, cost_micros)
         SELECT substr(created_at, 1, 10), COALESCE(team_id, 0), COALESCE(user_id, 0), token_id, model, served_model,
                upstream, tags, COUNT(*), SUM(status NOT BETWEEN 200 AND 299), SUM(input_tokens), SUM(output_tokens),
                SUM(cost_micros)
         FROM requests WHERE token_id IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 7, 8",
    )
    .execute(pool)
    .await
    .expect("rollup built");
    sqlx::query("ANALYZE")
        .execute(pool)
        .await
        .expect("analyzed");
    println!(
        "rollup (days and months) built in {:.1?}",
        started.elapsed()
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = a.db.clone().unwrap_or_else(|| dir.path().join("spend.db"));
    let fresh = !path.exists();
    let db = Db::open(&path, false).await.expect("open");
    if fresh {
        tenants(&db).await;
        generate(&db, a.rows).await;
    }
    let count = |sql: &'static str| async {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&db.sqlite().read)
            .await
            .expect(sql)
    };
    println!(
        "requests: {} rows; spend_days: {} rows; spend_months: {} rows",
        count("SELECT COUNT(*) FROM requests").await,
        count("SELECT COUNT(*) FROM spend_days").await,
        count("SELECT COUNT(*) FROM spend_months").await
    );
    let day = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").expect("a date");
    let (year, month) = (
        (day("2026-01-01"), day("2027-01-01")),
        (day("2026-11-01"), day("2026-12-01")),
    );
    let tag = |k: &str| Dim::Tag(k.to_string());
    /// A report kind: its name, range, grouping and filters.
    type Kind = (&'static str, (NaiveDate, NaiveDate), Vec<Dim>, Filters);
    let kinds: Vec<Kind> = vec![
        ("month by team", month, vec![Dim::Team], Filters::default()),
        ("month by user", month, vec![Dim::User], Filters::default()),
        (
            "month by token",
            month,
            vec![Dim::Token],
            Filters::default(),
        ),
        (
            "month by model",
            month,
            vec![Dim::Model],
            Filters::default(),
        ),
        (
            "month by upstream",
            month,
            vec![Dim::Upstream],
            Filters::default(),
        ),
        (
            "month by tag:project",
            month,
            vec![tag("project")],
            Filters::default(),
        ),
        ("month by day", month, vec![Dim::Day], Filters::default()),
        (
            "month, project p7, by model",
            month,
            vec![Dim::Model],
            Filters {
                tags: vec![("project".into(), "p7".into())],
                ..Filters::default()
            },
        ),
        (
            "month by tag:project,model",
            month,
            vec![tag("project"), Dim::Model],
            Filters::default(),
        ),
        ("year by team", year, vec![Dim::Team], Filters::default()),
        ("year by token", year, vec![Dim::Token], Filters::default()),
        ("year by model", year, vec![Dim::Model], Filters::default()),
        (
            "year by tag:project",
            year,
            vec![tag("project")],
            Filters::default(),
        ),
        (
            "year by tag:feature",
            year,
            vec![tag("feature")],
            Filters::default(),
        ),
        ("year by week", year, vec![Dim::Week], Filters::default()),
        ("year by month", year, vec![Dim::Month], Filters::default()),
        ("year by day", year, vec![Dim::Day], Filters::default()),
        (
            "year by month,team",
            year,
            vec![Dim::Month, Dim::Team],
            Filters::default(),
        ),
        (
            "year, team 3, by month",
            year,
            vec![Dim::Month],
            Filters {
                team: Some(3),
                ..Filters::default()
            },
        ),
    ];
    println!("| report | rows | best of {} | worst |", a.runs);
    println!("| --- | ---: | ---: | ---: |");
    for (name, (from, to), group_by, filters) in kinds {
        let q = SpendQuery {
            from,
            to,
            group_by,
            filters,
            scope: None,
        };
        let mut times = Vec::new();
        let mut n = 0;
        for _ in 0..a.runs.max(1) {
            let started = Instant::now();
            n = spend::report(&db, &q).await.expect("report").len();
            times.push(started.elapsed());
        }
        times.sort();
        println!(
            "| {name} | {n} | {:.0?} | {:.0?} |",
            times[0],
            times[times.len() - 1]
        );
    }
}
