//! What finance reads: the request log's filters and pages, spend grouped every way, the
//! CSV equal to the table, the dashboard figures; a lead's view limited to their team.

use serde_json::{json, Value};

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
                id: format!("req-{i}"),
                token_id: Some(*token),
                user_id: Some(*user),
                team_id: Some(*team),
                endpoint: "chat",
                model: model.to_string(),
                served_model: model.to_string(),
                upstream: String::new(),
                upstream_model: String::new(),
                status: *status as u16,
                error_code: None,
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
            format!("{by},requests,input_tokens,output_tokens,spend_usd")
        );
        let expected: Vec<String> = json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{},{},{},{},{}",
                    r["label"].as_str().unwrap(),
                    r["requests"],
                    r["input_tokens"],
                    r["output_tokens"],
                    sluice::quota::pricing::usd(r["spend_micros"].as_i64().unwrap())
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
