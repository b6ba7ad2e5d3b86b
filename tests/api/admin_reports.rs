//! What finance reads: the request log's filters and pages, spend grouped every way, the
//! CSV equal to the table, the dashboard figures; a lead's view limited to their team.

use serde_json::{json, Value};
use sluice::store::spend::{report, Dim, Filters, Group, SpendQuery};

use crate::admin_helpers::*;
use crate::helpers::*;

/// Writes request-log rows through the store's batch writer (what the request log's task
/// calls), so on PostgreSQL the spend-by-day rollup reports read follows them as it does
/// the gateway's own rows: (team, user, token, model, status, cost, day).
async fn seed(app: &TestApp, rows: &[(i64, i64, i64, &str, i64, i64, &str)]) {
    let rows: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, (team, user, token, model, status, cost, day))| {
            sluice::store::requests::RequestRow {
                trace: Default::default(),
                id: format!("req-{i}"),
                token_id: Some(*token),
                presented_token_id: None,
                user_id: Some(*user),
                team_id: Some(*team),
                endpoint: "chat",
                model: model.to_string(),
                served_model: model.to_string(),
                upstream: String::new(),
                upstream_model: String::new(),
                status: *status as u16,
                error_code: None,
                usage_estimated: false,
                stream: false,
                attempts: 0,
                input_tokens: 10,
                output_tokens: 20,
                cost_micros: *cost,
                latency_ms: 0,
                ttfb_ms: None,
                cache: "off",
                cache_key: None,
                cache_similarity: None,
                created_at: format!("{day}T12:{:02}:{:02}.000Z", i / 60 % 60, i % 60),
                kinds: Default::default(),
                tags: String::new(),
                fixed_tags: String::new(),
            }
        })
        .collect();
    sluice::store::requests::insert_batch(app.db(), &rows)
        .await
        .expect("request rows written");
}

async fn setup() -> (TestApp, Session) {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    for team in ["red", "blue"] {
        admin
            .post("/admin/api/v1/teams", &json!({"name": team}))
            .await;
    }
    admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "rosa", "team_id": 1}),
        )
        .await;
    admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "bert", "team_id": 2}),
        )
        .await;
    admin
        .post("/admin/api/v1/tokens", &json!({"user_id": 1}))
        .await;
    admin
        .post("/admin/api/v1/tokens", &json!({"user_id": 2}))
        .await;
    admin
        .post(
            "/admin/api/v1/users",
            &json!({"username": "lena", "role": "lead", "team_id": 1, "password": PASSWORD}),
        )
        .await;
    let mut rows = Vec::new();
    for _ in 0..55 {
        rows.push((1, 1, 1, "gpt-4o-mini", 200, 100, "2026-10-03"));
    }
    rows.push((1, 1, 1, "gpt-4o-mini", 429, 0, "2026-10-04"));
    rows.push((2, 2, 2, "text-embedding-3-small", 200, 7, "2026-10-04"));
    rows.push((2, 2, 2, "gpt-4o-mini", 502, 0, "2026-10-05"));
    rows.push((2, 2, 2, "gpt-4o-mini", 200, 1000, "2026-11-01"));
    seed(&app, &rows).await;
    (app, admin)
}

fn len(v: &Value, k: &str) -> usize {
    v[k].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn the_request_log_filters_and_pages_on_the_server() {
    let (app, admin) = setup().await;
    let (_, p1) = admin.get_json("/admin/api/v1/requests").await;
    assert_eq!(
        (len(&p1, "requests"), p1["more"].as_bool()),
        (50, Some(true))
    );
    assert_eq!(
        p1["requests"][0]["created_at"], "2026-11-01T12:00:58.000Z",
        "newest first"
    );
    let (_, p2) = admin.get_json("/admin/api/v1/requests?page=2").await;
    assert_eq!(
        (len(&p2, "requests"), p2["more"].as_bool()),
        (9, Some(false))
    );
    for (q, n) in [
        ("status=4xx", 1),
        ("status=429", 1),
        ("status=5xx", 1),
        ("status=2xx", 57),
        ("team=2", 3),
        ("user=2&model=gpt-4o-mini", 2),
        ("token=2&from=2026-10-01&to=2026-10-31", 2),
        ("from=2026-10-04&to=2026-10-04", 2),
        ("model=text-embedding-3-small", 1),
        ("from=2026-11-01", 1),
    ] {
        let (s, v) = admin.get_json(&format!("/admin/api/v1/requests?{q}")).await;
        assert_eq!(s, 200, "{q}");
        let total = len(&v, "requests") + if v["more"] == true { 1000 } else { 0 };
        assert_eq!(total.min(1000), if n > 50 { 1000 } else { n }, "{q}");
    }
    for q in [
        "status=6xx",
        "status=abc",
        "from=yesterday",
        "to=2026-13-01",
        // chrono's `%Y` takes a signed year of any width: its last date panicked the
        // handler at `to + 1 day` (s26 attack admin #1: the connection dropped).
        "to=%2B262142-12-31",
        "from=%2B262142-12-31",
        "from=%2B10000-01-01",
    ] {
        assert_eq!(
            admin
                .get_json(&format!("/admin/api/v1/requests?{q}"))
                .await
                .0,
            400,
            "{q}"
        );
    }
    let (s, v) = admin.get_json("/admin/api/v1/requests?to=9999-12-31").await;
    assert_eq!(
        (s, len(&v, "requests"), &v["more"]),
        (200, 50, &Value::Bool(true)),
        "the last day bounds nothing"
    );
    assert_eq!(
        admin
            .get("/admin/requests?to=%2B262142-12-31")
            .await
            .status(),
        400,
        "the page as the API"
    );
    let page = admin
        .get("/admin/requests?status=5xx")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("502") && !page.contains(">429<"),
        "the page shows the same filter"
    );
    let frag = admin
        .http
        .get(format!("{}/admin/requests?page=2", app.address))
        .header("cookie", admin.cookie())
        .header("hx-request", "true")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        frag.starts_with("<section id=\"requests\""),
        "htmx gets the table only"
    );
    assert!(frag.contains("← Newer") && !frag.contains("Older →"));

    let lead = login(&app, "lena").await;
    let (_, v) = lead.get_json("/admin/api/v1/requests?token=2").await;
    assert_eq!(
        len(&v, "requests"),
        0,
        "a lead never sees another team's requests"
    );
    let (_, v) = lead.get_json("/admin/api/v1/requests?page=2").await;
    assert_eq!(len(&v, "requests"), 6);
}

#[tokio::test]
async fn reports_group_spend_every_way_and_the_csv_is_the_table() {
    let (app, admin) = setup().await;
    let (_, by_team) = admin
        .get_json("/admin/api/v1/reports/spend?month=2026-10&by=team")
        .await;
    let rows: Vec<(String, i64, i64)> = by_team["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["label"].as_str().unwrap().to_string(),
                r["requests"].as_i64().unwrap(),
                r["spend_micros"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, vec![("red".into(), 56, 5500), ("blue".into(), 2, 7)]);
    assert_eq!(by_team["total_micros"], 5507);
    let days = by_team["days"].as_array().unwrap();
    assert_eq!(days.len(), 31);
    assert_eq!(days[2], json!({"day": "2026-10-03", "spend_micros": 5500}));
    let (_, by_model) = admin
        .get_json("/admin/api/v1/reports/spend?month=2026-10&by=model")
        .await;
    assert_eq!(by_model["rows"][0]["label"], "gpt-4o-mini");
    assert_eq!(by_model["rows"][1]["label"], "text-embedding-3-small");
    let (_, by_token) = admin
        .get_json("/admin/api/v1/reports/spend?month=2026-10&by=token")
        .await;
    assert!(by_token["rows"][0]["label"]
        .as_str()
        .unwrap()
        .ends_with("(rosa)"));
    let (_, by_day) = admin
        .get_json("/admin/api/v1/reports/spend?month=2026-11&by=day")
        .await;
    assert_eq!(
        by_day["rows"],
        json!([{"label": "2026-11-01", "requests": 1, "input_tokens": 10, "output_tokens": 20, "spend_micros": 1000}])
    );
    assert_eq!(
        admin
            .get_json("/admin/api/v1/reports/spend?month=2026-1")
            .await
            .0,
        400
    );
    assert_eq!(
        admin
            .get_json("/admin/api/v1/reports/spend?by=planet")
            .await
            .0,
        400
    );

    for by in ["token", "user", "team", "model", "day"] {
        let (_, json) = admin
            .get_json(&format!(
                "/admin/api/v1/reports/spend?month=2026-10&by={by}"
            ))
            .await;
        let r = admin
            .get(&format!("/admin/reports.csv?month=2026-10&by={by}"))
            .await;
        assert_eq!(r.headers()["content-type"], "text/csv; charset=utf-8");
        assert!(r.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains(&format!("sluice-spend-2026-10-by-{by}.csv")));
        let csv = r.text().await.unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            format!("{by},requests,input_tokens,output_tokens,spend_usd,estimated_usd")
        );
        let expected: Vec<String> = json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{},{}",
                    r["label"].as_str().unwrap(),
                    r["requests"],
                    r["input_tokens"],
                    r["output_tokens"],
                    sluice::quota::pricing::usd(r["spend_micros"].as_i64().unwrap()),
                    // The older `by=` rows keep their shape: nothing here is estimated.
                    sluice::quota::pricing::usd(0)
                )
            })
            .collect();
        assert_eq!(lines[1..].to_vec(), expected, "{by}");
        let page = admin
            .get(&format!("/admin/reports?month=2026-10&by={by}"))
            .await
            .text()
            .await
            .unwrap();
        for row in json["rows"].as_array().unwrap() {
            assert!(
                page.contains(&sluice::quota::pricing::usd(
                    row["spend_micros"].as_i64().unwrap()
                )),
                "{by}"
            );
        }
        assert!(page.contains("<svg") && page.contains("class=\"bar\""));
    }

    let lead = login(&app, "lena").await;
    let (_, v) = lead
        .get_json("/admin/api/v1/reports/spend?month=2026-10&by=team")
        .await;
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    assert_eq!(v["rows"][0]["label"], "red");
    let csv = lead
        .get("/admin/reports.csv?month=2026-10&by=user")
        .await
        .text()
        .await
        .unwrap();
    assert!(!csv.contains("bert"));
}

#[tokio::test]
async fn the_dashboard_counts_today_and_this_month() {
    let app = spawn_app().await;
    make_login(&app, "root", "admin", None).await;
    let admin = login(&app, "root").await;
    let (_, t) = app.token("alice", Some("5")).await;
    for _ in 0..3 {
        assert_eq!(app.chat(&t, &chat_body(5)).await.status(), 200);
    }
    assert_eq!(
        app.chat("sk-sl-nonsense", &chat_body(5)).await.status(),
        401
    );
    app.wait_for_log_rows(4).await;
    let (_, d) = admin.get_json("/admin/api/v1/dashboard").await;
    assert_eq!(d["today"]["requests"], 4);
    assert_eq!(d["today"]["errors"], 1);
    assert_eq!(d["error_permille"], 250);
    assert!(d["month"]["spend_micros"].as_i64().unwrap() > 0);
    assert_eq!(d["top_tokens"][0]["requests"], 3);
    let frag = admin
        .get("/admin/dashboard/stats")
        .await
        .text()
        .await
        .unwrap();
    assert!(frag.contains("25.0%"), "{frag}");
}

/// One generated request-log row: (id, team, user, token, model, served, upstream, status,
/// cost, day, tags); `token == 0` is an unauthenticated request.
type Gen = (
    String,
    i64,
    i64,
    i64,
    &'static str,
    &'static str,
    &'static str,
    i64,
    i64,
    String,
    &'static str,
);

/// A seeded random workload over both teams, both tokens, three models (with fallbacks
/// and unanswered requests), two upstreams, three statuses, a few tag sets and 37 days from 2026-12-28,
/// with some ids repeated (a row logged twice counts once) and some rows without a token.
fn workload(seed: u64, n: usize) -> Vec<Gen> {
    let mut x = seed.max(1);
    let mut next = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let models = [
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("gpt-4o-mini", "gpt-4o"),
        ("gpt-4o", "gpt-4o"),
        ("text-embedding-3-small", "text-embedding-3-small"),
        ("gpt-4o", ""),
    ];
    let tags = [
        "",
        "project:apollo",
        "env:prod,project:apollo",
        "project:zeus",
        "env:dev",
        "env:prod,project:Apollo",
        "owner:a_b,project:zeus",
    ];
    let start = chrono::NaiveDate::from_ymd_opt(2026, 12, 28).unwrap();
    (0..n)
        .map(|i| {
            let who = next(2) as i64 + 1;
            let token = if next(20) == 0 { 0 } else { who };
            let (model, served) = models[next(models.len() as u64) as usize];
            let day = start + chrono::Duration::days(next(37) as i64);
            let id = if i > 0 && next(10) == 0 {
                format!("gen-{}", next(i as u64))
            } else {
                format!("gen-{i}")
            };
            (
                id,
                who,
                who,
                token,
                model,
                served,
                ["a", "b", ""][next(3) as usize],
                [200, 200, 200, 429, 502][next(5) as usize],
                next(5000) as i64,
                day.to_string(),
                tags[next(tags.len() as u64) as usize],
            )
        })
        .collect()
}

async fn write_workload(app: &TestApp, rows: &[Gen]) {
    let rows: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, g)| sluice::store::requests::RequestRow {
            id: g.0.clone(),
            token_id: (g.3 != 0).then_some(g.3),
            user_id: (g.3 != 0).then_some(g.2),
            team_id: (g.3 != 0).then_some(g.1),
            endpoint: "chat",
            model: g.4.to_string(),
            served_model: g.5.to_string(),
            upstream: g.6.to_string(),
            status: g.7 as u16,
            input_tokens: g.8 % 97,
            output_tokens: g.8 % 13,
            cost_micros: g.8,
            cache: "off",
            created_at: format!("{}T{:02}:{:02}:00.000Z", g.9, i % 24, i % 60),
            tags: g.10.to_string(),
            usage_estimated: g.8 % 3 == 0,
            ..Default::default()
        })
        .collect();
    for chunk in rows.chunks(97) {
        sluice::store::requests::insert_batch(app.db(), chunk)
            .await
            .expect("request rows written");
    }
}

/// A rollup row: its key's eight columns joined, then its five sums.
type RollupRow = (String, i64, i64, i64, i64, i64);

/// The SQL that joins a rollup key's eight columns into one text, the period (`day`,
/// `month`), team and user given as expressions.
fn rollup_key(period: &str, team: &str, user: &str) -> String {
    format!(
        "{period} || '|' || CAST({team} AS TEXT) || '|' || CAST({user} AS TEXT) || '|' || CAST(token_id AS TEXT)
         || '|' || model || '|' || served_model || '|' || upstream || '|' || tags"
    )
}

/// The rows that count: the first of each id, with a token.
fn logged(rows: &[Gen]) -> Vec<Gen> {
    let mut seen = std::collections::HashSet::new();
    rows.iter()
        .filter(|g| seen.insert(g.0.clone()))
        .filter(|g| g.3 != 0)
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_rollup_equals_a_recomputation_from_the_request_log_after_a_mixed_workload() {
    let (app, admin) = setup().await;
    let rows = workload(0x5eed_1234, 900);
    write_workload(&app, &rows).await;
    // And some through the gateway itself, tagged and not.
    let (_, t) = app.token("gwuser", None).await;
    for tags in ["project:apollo", ""] {
        let r = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&t)
            .header("x-sluice-tags", tags)
            .json(&chat_body(8))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    app.state.request_log.flush().await;
    let rollup: Vec<RollupRow> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, requests, errors, input_tokens, output_tokens, cost_micros
             FROM spend_days ORDER BY k",
            rollup_key("day", "team_id", "user_id")
        ),
    )
    .await;
    let recomputed: Vec<RollupRow> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, CAST(COUNT(*) AS BIGINT),
                CAST(SUM(CASE WHEN status BETWEEN 200 AND 299 THEN 0 ELSE 1 END) AS BIGINT),
                CAST(SUM(input_tokens) AS BIGINT), CAST(SUM(output_tokens) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT)
             FROM requests WHERE token_id IS NOT NULL GROUP BY k ORDER BY k",
            rollup_key(
                "substr(created_at, 1, 10)",
                "COALESCE(team_id, 0)",
                "COALESCE(user_id, 0)"
            )
        ),
    )
    .await;
    assert!(rollup.len() > 100);
    assert_eq!(rollup, recomputed);

    // Every report over the whole span adds up to the request log's total.
    let total = app
        .scalar(
            "SELECT CAST(SUM(cost_micros) AS BIGINT) FROM requests WHERE token_id IS NOT NULL
             AND created_at >= '2026-09-01' AND created_at < '2027-03-01'",
        )
        .await;
    for by in [
        "team",
        "tag:project",
        "model,upstream",
        "week",
        "month,tag:env",
    ] {
        let (s, v) = admin
            .get_json(&format!(
                "/admin/api/v1/reports/spend?from=2026-09-01&to=2027-03-01&group_by={by}"
            ))
            .await;
        assert_eq!(s, 200, "{by}: {v}");
        let sum: i64 = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["spend_micros"].as_i64().unwrap())
            .sum();
        assert_eq!(
            (sum, v["total_micros"].as_i64().unwrap()),
            (total, total),
            "{by}"
        );
    }
    app.assert_invariant().await;
}

#[tokio::test]
async fn every_dimension_and_a_pair_give_the_same_rows_as_json_and_csv_and_filters_match() {
    let (app, admin) = setup().await;
    let rows = workload(77, 600);
    write_workload(&app, &rows).await;
    // The generated days start on 2026-12-28: January holds only generated rows.
    let range = "from=2027-01-01&to=2027-02-01";
    for by in [
        "team",
        "user",
        "token",
        "model",
        "upstream",
        "tag:project",
        "day",
        "week",
        "month",
        "tag:project,model",
        "team,day",
    ] {
        let q = format!("/admin/api/v1/reports/spend?{range}&group_by={by}");
        let (s, json) = admin.get_json(&q).await;
        assert_eq!(s, 200, "{by}: {json}");
        let r = admin.get(&format!("{q}&format=csv")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/csv; charset=utf-8");
        let csv = r.text().await.unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            format!("{by},requests,input_tokens,output_tokens,spend_usd,estimated_usd"),
            "{by}"
        );
        let expected: Vec<String> = json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let keys: Vec<&str> = r["keys"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| k.as_str().unwrap())
                    .collect();
                format!(
                    "{},{},{},{},{},{}",
                    keys.join(","),
                    r["requests"],
                    r["input_tokens"],
                    r["output_tokens"],
                    sluice::quota::pricing::usd(r["spend_micros"].as_i64().unwrap()),
                    sluice::quota::pricing::usd(r["estimated_micros"].as_i64().unwrap())
                )
            })
            .collect();
        assert!(!expected.is_empty(), "{by}");
        assert_eq!(lines[1..].to_vec(), expected, "{by}");
        let page = admin
            .get(&format!("/admin/reports?{range}&group_by={by}"))
            .await
            .text()
            .await
            .unwrap();
        assert!(
            page.contains(&format!("value=\"{by}\"")),
            "{by}: the page keeps the grouping"
        );
    }

    // Filters, against the same sums computed here from the generated rows.
    let january: Vec<Gen> = logged(&rows)
        .into_iter()
        .filter(|g| g.9.as_str() >= "2027-01-01" && g.9.as_str() < "2027-02-01")
        .collect();
    let has = |g: &Gen, tag: &str| g.10.split(',').any(|t| t == tag);
    let model = |g: &Gen| if g.5.is_empty() { g.4 } else { g.5 };
    type Keep = Box<dyn Fn(&Gen) -> bool>;
    let cases: Vec<(&str, Keep)> = vec![
        ("team=1", Box::new(|g: &Gen| g.1 == 1)),
        ("user=2", Box::new(|g: &Gen| g.2 == 2)),
        ("token=1", Box::new(|g: &Gen| g.3 == 1)),
        (
            "model=gpt-4o",
            Box::new(move |g: &Gen| model(g) == "gpt-4o"),
        ),
        ("upstream=b", Box::new(|g: &Gen| g.6 == "b")),
        (
            "tag=project:apollo",
            Box::new(move |g: &Gen| has(g, "project:apollo")),
        ),
        (
            "tag=owner:a_b",
            Box::new(move |g: &Gen| has(g, "owner:a_b")),
        ),
        (
            "tag=env:prod,project:apollo&team=2",
            Box::new(move |g: &Gen| has(g, "env:prod") && has(g, "project:apollo") && g.1 == 2),
        ),
    ];
    for (f, keep) in cases {
        let want: i64 = january.iter().filter(|g| keep(g)).map(|g| g.8).sum();
        let n = january.iter().filter(|g| keep(g)).count() as i64;
        let (s, v) = admin
            .get_json(&format!(
                "/admin/api/v1/reports/spend?{range}&group_by=model&{f}"
            ))
            .await;
        assert_eq!(s, 200, "{f}: {v}");
        assert_eq!(
            (v["total_micros"].as_i64(), v["total_requests"].as_i64()),
            (Some(want), Some(n)),
            "{f}"
        );
    }

    for bad in [
        "group_by=planet",
        "group_by=tag:a%20b",
        "group_by=team,team",
        "from=2026-10-01",
        "from=2026-10-05&to=2026-10-01",
        "from=2026-10-1&to=2026-11-01",
        "team=abc",
        "tag=a:b:c",
        "format=xml",
    ] {
        let (s, _) = admin
            .get_json(&format!("/admin/api/v1/reports/spend?{bad}"))
            .await;
        assert_eq!(s, 400, "{bad}");
    }

    let lead = login(&app, "lena").await;
    let (_, v) = lead
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&group_by=team,tag:project"
        ))
        .await;
    let teams: std::collections::BTreeSet<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["keys"][0].as_str().unwrap())
        .collect();
    assert_eq!(teams.into_iter().collect::<Vec<_>>(), ["red"]);
    let (_, v) = lead
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&group_by=team&team=2"
        ))
        .await;
    assert_eq!(v["rows"], json!([]), "another team's filter finds nothing");
}

/// A report read day by day (ranges of one day never hold a whole month, so they read
/// `spend_days` alone), summed per group: what every report over `[from, to)` must equal.
type Sums = std::collections::BTreeMap<Vec<String>, [i64; 5]>;

fn spend_query(
    from: chrono::NaiveDate,
    to: chrono::NaiveDate,
    by: &str,
    filters: &str,
) -> SpendQuery {
    let mut f = Filters::default();
    match filters {
        "" => {}
        "team=1" => f.team = Some(1),
        "tag=project:apollo" => f.tags = vec![("project".into(), "apollo".into())],
        "model=gpt-4o" => f.model = Some("gpt-4o".into()),
        other => panic!("no such filter in this test: {other}"),
    }
    SpendQuery {
        from,
        to,
        group_by: by.split(',').map(|d| Dim::parse(d).expect(d)).collect(),
        filters: f,
        scope: None,
    }
}

fn sums(groups: &[Group]) -> Sums {
    let mut out = Sums::new();
    for g in groups {
        let s = out.entry(g.keys.clone()).or_default();
        for (s, v) in s.iter_mut().zip([
            g.requests,
            g.input_tokens,
            g.output_tokens,
            g.spend_micros,
            g.estimated_micros,
        ]) {
            *s += v;
        }
    }
    out
}

/// The monthly level (`spend_months`) always equals the sum of its days — written by the
/// batch writer, and by a writer of `spend_days` alone (the previous version during a
/// rolling upgrade, a hand-made fix) — and every report kind over seeded random ranges, with
/// leading days, whole months and trailing days, gives the same groups and sums as the
/// same report read day by day.
#[tokio::test]
async fn the_monthly_rollup_equals_its_days_and_reports_over_whole_months_equal_the_days() {
    let (app, _admin) = setup().await;
    // 2026-12-28 to 2027-02-02: a partial December, the whole of January, two February days.
    write_workload(&app, &workload(0x5eed_4321, 800)).await;
    // The previous version writes the days only: a new day row, added to again, …
    for _ in 0..2 {
        sql_exec(
            app.db(),
            "INSERT INTO spend_days (day, team_id, user_id, token_id, model, served_model, upstream, tags,
                                     requests, errors, input_tokens, output_tokens, cost_micros)
             VALUES ('2027-01-15', 1, 1, 1, 'gpt-4o', 'gpt-4o', 'a', 'project:apollo', 1, 0, 10, 5, 1234)
             ON CONFLICT (day, team_id, user_id, token_id, model, served_model, upstream, tags) DO UPDATE SET
                 requests = spend_days.requests + 1, input_tokens = spend_days.input_tokens + 10,
                 output_tokens = spend_days.output_tokens + 5, cost_micros = spend_days.cost_micros + 1234",
        )
        .await;
    }
    // … and a day's rows taken away by hand.
    sql_exec(app.db(), "DELETE FROM spend_days WHERE day = '2027-01-20'").await;

    let key = |month: &str| rollup_key(month, "team_id", "user_id");
    let months: Vec<RollupRow> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, requests, errors, input_tokens, output_tokens, cost_micros
             FROM spend_months ORDER BY k",
            key("month")
        ),
    )
    .await;
    let recomputed: Vec<RollupRow> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, CAST(SUM(requests) AS BIGINT), CAST(SUM(errors) AS BIGINT),
                CAST(SUM(input_tokens) AS BIGINT), CAST(SUM(output_tokens) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT)
             FROM spend_days GROUP BY k ORDER BY k",
            key("substr(day, 1, 7)")
        ),
    )
    .await;
    assert!(months.len() > 50, "{}", months.len());
    assert_eq!(months, recomputed);
    // The estimated spend too (migration `0024_usage_estimated`): some of it, and the
    // months the sum of their days.
    let months: Vec<(String, i64)> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, estimated_micros FROM spend_months ORDER BY k",
            key("month")
        ),
    )
    .await;
    let recomputed: Vec<(String, i64)> = sql_rows(
        app.db(),
        &format!(
            "SELECT {} AS k, CAST(SUM(estimated_micros) AS BIGINT) FROM spend_days GROUP BY k ORDER BY k",
            key("substr(day, 1, 7)")
        ),
    )
    .await;
    assert!(months.iter().any(|(_, e)| *e > 0), "{months:?}");
    assert_eq!(months, recomputed);

    // Every report kind, read one day at a time over the whole window.
    let day0 = chrono::NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
    let kinds = [
        ("team", ""),
        ("user", ""),
        ("token", ""),
        ("model", ""),
        ("upstream", ""),
        ("tag:project", ""),
        ("tag:env,model", ""),
        ("month", ""),
        ("month,team", ""),
        ("week", ""),
        ("model", "tag=project:apollo"),
        ("month", "team=1"),
        ("tag:project", "model=gpt-4o"),
    ];
    let mut daily: Vec<Vec<Sums>> = Vec::new();
    for (by, filters) in kinds {
        let mut per_day = Vec::new();
        for i in 0..90 {
            let d = day0 + chrono::Duration::days(i);
            let q = spend_query(d, d + chrono::Duration::days(1), by, filters);
            per_day.push(sums(&report(app.db(), &q).await.expect("report")));
        }
        daily.push(per_day);
    }
    // Ranges: fixed ones (whole months, a month and a half, leading and trailing days) and
    // seeded random ones inside the window.
    let mut ranges = vec![
        (27, 64),
        (31, 62),
        (0, 90),
        (31, 90),
        (0, 62),
        (40, 70),
        (30, 33),
    ];
    let mut x: u64 = 0x5eed_0bad;
    while ranges.len() < 25 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let from = (x % 89) as i64;
        let to = from + 1 + ((x >> 20) % (90 - from as u64)) as i64;
        ranges.push((from, to));
    }
    for (from, to) in ranges {
        for ((by, filters), per_day) in kinds.iter().zip(&daily) {
            let mut expected = Sums::new();
            for s in &per_day[from as usize..to as usize] {
                for (k, v) in s {
                    let e = expected.entry(k.clone()).or_default();
                    for (e, v) in e.iter_mut().zip(v) {
                        *e += v;
                    }
                }
            }
            let q = spend_query(
                day0 + chrono::Duration::days(from),
                day0 + chrono::Duration::days(to),
                by,
                filters,
            );
            let got = sums(&report(app.db(), &q).await.expect("report"));
            assert_eq!(got, expected, "{by} {filters} over days {from}..{to}");
        }
    }
}
