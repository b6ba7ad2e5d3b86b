//! `sluice reconcile` (issue 20, item 4): a provider's cost export held against the request
//! log per (day, model, account). Sluice's side is seeded through the store's request-log
//! writer over 3 days × 2 models × 2 accounts; the export is built from the same figures,
//! so exactly the cells made to differ are flagged.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use chrono::{NaiveDate, TimeZone, Utc};
use serde_json::{json, Value};
use sluice::store::requests::{self, RequestRow};

use crate::admin_helpers::{login, make_login};
use crate::helpers::{cli_config, spawn_app_with, TestApp};

pub(crate) const MODELS: [&str; 2] = ["gpt-4o-mini", "gpt-4o"];
/// Deployment → the OpenAI project its key bills to (`b` names none: account `*`).
pub(crate) const UPSTREAMS: [(&str, Option<&str>); 2] = [("a", Some("proj_a")), ("b", None)];

pub(crate) fn day(d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 3, d).unwrap()
}

/// Sluice's spend in one cell, in micro-dollars: distinct per cell, not round.
pub(crate) fn cell(d: u32, m: usize, u: usize) -> i64 {
    1_000_000 * i64::from(d) + 100_000 * m as i64 + 10_000 * u as i64 + 1_234
}

/// The request log: each cell as two requests (their sum is the cell), plus an Anthropic
/// deployment's request that an OpenAI reconciliation must leave out.
pub(crate) async fn seed(app: &TestApp) {
    let mut rows = Vec::new();
    for d in 1..=3 {
        for (m, model) in MODELS.iter().enumerate() {
            for (u, (upstream, _)) in UPSTREAMS.iter().enumerate() {
                let total = cell(d, m, u);
                for (i, cost) in [total / 3, total - total / 3].into_iter().enumerate() {
                    let at =
                        Utc.from_utc_datetime(&day(d).and_hms_opt(9 + i as u32, 30, 0).unwrap());
                    rows.push(RequestRow {
                        id: format!("req-{d}-{m}-{u}-{i}"),
                        endpoint: "chat",
                        model: format!("alias-of-{model}"),
                        served_model: format!("alias-of-{model}"),
                        upstream: (*upstream).into(),
                        upstream_model: (*model).into(),
                        status: 200,
                        cost_micros: cost,
                        cache: "miss",
                        created_at: sluice::clock::db_time(at),
                        ..Default::default()
                    });
                }
            }
        }
    }
    rows.push(RequestRow {
        id: "req-claude".into(),
        endpoint: "messages",
        model: "claude".into(),
        served_model: "claude".into(),
        upstream: "c".into(),
        upstream_model: "claude-3-5-haiku".into(),
        status: 200,
        cost_micros: 7_000_000,
        cache: "miss",
        created_at: sluice::clock::db_time(
            Utc.from_utc_datetime(&day(2).and_hms_opt(12, 0, 0).unwrap()),
        ),
        ..Default::default()
    });
    requests::insert_batch(app.db(), &rows).await.unwrap();
}

/// Micro-dollars as the decimal text OpenAI writes (`1.001234`).
pub(crate) fn usd_text(micros: i64) -> String {
    sluice::quota::pricing::usd(micros)
}

/// An OpenAI Costs API export of the seeded figures, each cell split into an input and an
/// output line item of the dated snapshot, plus `delta(d, m, u)` on the output line; two
/// pages, as a paginated download saves them.
pub(crate) fn openai_export(delta: impl Fn(u32, usize, usize) -> i64) -> String {
    let mut buckets = Vec::new();
    for d in 1..=3 {
        let mut results = Vec::new();
        for (m, model) in MODELS.iter().enumerate() {
            for (u, (_, project)) in UPSTREAMS.iter().enumerate() {
                let total = cell(d, m, u) + delta(d, m, u);
                let input = total / 4;
                for (kind, micros) in [("input", input), ("output", total - input)] {
                    let value: Value = serde_json::from_str(&usd_text(micros)).unwrap();
                    results.push(json!({
                        "object": "organization.costs.result",
                        "amount": {"value": value, "currency": "usd"},
                        "line_item": format!("{model}-2024-07-18, {kind}"),
                        "project_id": project,
                    }));
                }
            }
        }
        buckets.push(bucket(d, results));
    }
    two_pages(&buckets)
}

/// Day `d`'s bucket of an OpenAI organization export (costs or usage), holding `results`.
pub(crate) fn bucket(d: u32, results: Vec<Value>) -> Value {
    let start = Utc
        .from_utc_datetime(&day(d).and_hms_opt(0, 0, 0).unwrap())
        .timestamp();
    json!({"object": "bucket", "start_time": start, "end_time": start + 86_400, "results": results})
}

/// Three days' buckets as a paginated download saves them: two pages, the first saying
/// there is more.
pub(crate) fn two_pages(buckets: &[Value]) -> String {
    let page = |data: &[Value], more: bool| {
        json!({"object": "page", "data": data, "has_more": more,
            "next_page": if more { json!("page_2") } else { Value::Null }})
    };
    format!(
        "{}\n{}\n",
        page(&buckets[..2], true),
        page(&buckets[2..], false)
    )
}

/// The same figures as OpenAI's usage dashboard exports them ("Cost data", grouped by line
/// item, CSV): a header of the Costs API's flattened columns, ISO days, quoted line items.
pub(crate) fn openai_dashboard_csv(delta: impl Fn(u32, usize, usize) -> i64) -> String {
    let mut out = String::from(
        "start_time,end_time,amount_value,amount_currency,line_item,project_id,organization_id,project_name,organization_name\n",
    );
    for d in 1..=3 {
        for (m, model) in MODELS.iter().enumerate() {
            for (u, (_, project)) in UPSTREAMS.iter().enumerate() {
                let total = cell(d, m, u) + delta(d, m, u);
                let input = total / 4;
                for (kind, micros) in [("input", input), ("output", total - input)] {
                    out.push_str(&format!(
                        "{},{},{},usd,\"{model}-2024-07-18, {kind}\",{},org_1,,Acme\n",
                        day(d),
                        day(d + 1),
                        usd_text(micros),
                        project.unwrap_or("")
                    ));
                }
            }
        }
    }
    out
}

/// The CLI's config: the test database, the two OpenAI deployments (one naming its project),
/// an Anthropic one, and the mock's webhook for alerts.
pub(crate) fn config(app: &TestApp) -> PathBuf {
    let path = cli_config(app);
    let mut text = std::fs::read_to_string(&path).unwrap();
    let base = app.mock.base_url();
    for (id, account) in UPSTREAMS {
        text.push_str(&format!(
            "\n[[upstreams]]\nid = \"{id}\"\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\napi_key = \"sk-test\"\nallow_private_network = true\n"
        ));
        if let Some(a) = account {
            text.push_str(&format!("provider_account = \"{a}\"\n"));
        }
    }
    text.push_str(&format!(
        "\n[[upstreams]]\nid = \"c\"\nprovider = \"anthropic\"\nbase_url = \"{base}\"\napi_key = \"sk-test\"\nallow_private_network = true\nprovider_account = \"wrkspc_1\"\n"
    ));
    text.push_str(&format!(
        "\n[alerts]\nwebhooks = [{{ url = \"{base}/_mock/webhook\", format = \"generic\" }}]\n"
    ));
    std::fs::write(&path, text).unwrap();
    path
}

/// `sluice reconcile --provider <provider> <file>`, as a table or with `--json`.
pub(crate) fn reconcile(config: &Path, provider: &str, file: &Path, json: bool) -> Output {
    reconcile_files(config, provider, &[file], json)
}

/// The same over several files read as one download.
pub(crate) fn reconcile_files(
    config: &Path,
    provider: &str,
    files: &[&Path],
    json: bool,
) -> Output {
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "reconcile",
        "--provider",
        provider,
    ];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    if json {
        args.push("--json");
    }
    std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The run exited with `code`; else the test fails showing what it printed.
pub(crate) fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// (day, model, account) cells, as `flagged` gives them.
pub(crate) fn cells(cells: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    cells
        .iter()
        .map(|&(d, m, a)| (d.into(), m.into(), a.into()))
        .collect()
}

/// (day, model, account) of every flagged row of a JSON report.
pub(crate) fn flagged(report: &Value) -> Vec<(String, String, String)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["flagged"] == json!(true))
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_string();
            (s("day"), s("model"), s("account"))
        })
        .collect()
}

pub(crate) async fn webhook_kinds(app: &TestApp) -> Vec<String> {
    app.mock
        .state
        .stats("webhook")
        .last_bodies
        .iter()
        .filter_map(|b| b["kind"].as_str().map(String::from))
        .collect()
}

/// The seeded app and the CLI's config for it.
pub(crate) async fn setup() -> (TestApp, PathBuf) {
    let app = spawn_app_with(|_, _| {}).await;
    seed(&app).await;
    let config = config(&app);
    (app, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_differing_in_exactly_two_cells_flags_exactly_those_two() {
    let (app, config) = setup().await;
    let file = app.dir.path().join("costs.json");
    // Day 2, gpt-4o, project proj_a billed $1.000001 more; day 3, gpt-4o-mini, account *
    // billed $5 less. Everything else to the micro-dollar.
    std::fs::write(
        &file,
        openai_export(|d, m, u| match (d, m, u) {
            (2, 1, 0) => 1_000_001,
            (3, 0, 1) => -5_000_000,
            _ => 0,
        }),
    )
    .unwrap();

    let out = reconcile(&config, "openai", &file, false);
    assert_exit(&out, 3);
    let table = text(&out.stdout);
    assert!(table.contains("2 of 12 rows flagged"), "{table}");
    assert!(table.contains("proj_a"), "{table}");
    assert!(
        !table.contains("claude"),
        "another provider's spend is not compared: {table}"
    );
    // The alert reached the webhook before the command ended.
    assert!(
        webhook_kinds(&app)
            .await
            .iter()
            .any(|k| k == "reconcile_mismatch"),
        "{:?}",
        webhook_kinds(&app).await
    );

    let out = reconcile(&config, "openai", &file, true);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected = cells(&[
        ("2026-03-02", "gpt-4o", "proj_a"),
        ("2026-03-03", "gpt-4o-mini", "*"),
    ]);
    assert_eq!(flagged(&report), expected);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12);
    let d2 = rows
        .iter()
        .find(|r| r["day"] == "2026-03-02" && r["model"] == "gpt-4o" && r["account"] == "proj_a")
        .unwrap();
    assert_eq!(d2["sluice_micros"], json!(cell(2, 1, 0)));
    assert_eq!(d2["provider_micros"], json!(cell(2, 1, 0) + 1_000_001));
    assert_eq!(d2["diff_micros"], json!(-1_000_001));
    let total: i64 = (1..=3)
        .flat_map(|d| (0..2).flat_map(move |m| (0..2).map(move |u| cell(d, m, u))))
        .sum();
    assert_eq!(report["reconciliation"]["sluice_micros"], json!(total));
    assert_eq!(
        report["reconciliation"]["provider_micros"],
        json!(total + 1_000_001 - 5_000_000)
    );

    // Stored, audited, and shown to finance on the page and in the JSON API.
    let audited = crate::helpers::scalar_on(
        app.db(),
        "SELECT COUNT(*) FROM audit_log WHERE action = 'finance.reconcile'",
    )
    .await;
    assert_eq!(audited, 2);
    make_login(&app, "fin", "finance", None).await;
    let fin = login(&app, "fin").await;
    let (status, api) = fin.get_json("/admin/api/v1/reports/reconciliation").await;
    assert_eq!(status, 200, "{api}");
    assert_eq!(api["reconciliation"]["flagged"], json!(2));
    assert_eq!(api["reconciliation"]["provider"], json!("openai"));
    assert_eq!(api["reconciliation"]["source"], json!("costs.json"));
    assert_eq!(flagged(&api), expected);
    let page = fin.get("/admin/finance").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(
        html.contains("<strong id=\"flagged-count\">2</strong> of 12 rows flagged"),
        "{html}"
    );
    assert_eq!(html.matches("<tr class=\"flagged\">").count(), 2, "{html}");
    assert!(html.contains("-1.000001"), "{html}");

    // A lead sees none of it (as for the audit log: it does not exist for them); their
    // page is their team's forecasts.
    make_login(&app, "lead", "lead", Some("t1")).await;
    let lead = login(&app, "lead").await;
    let page = lead.get("/admin/finance").await;
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(!html.contains("flagged"), "{html}");
    let (status, _) = lead.get_json("/admin/api/v1/reports/reconciliation").await;
    assert_eq!(status, 404);
}

/// The dashboard's CSV export reconciles like the Costs API's JSON: the same two cells
/// flagged, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboards_csv_export_flags_exactly_the_two_cells_that_differ() {
    let (app, config) = setup().await;
    let file = app.dir.path().join("costs.csv");
    std::fs::write(
        &file,
        openai_dashboard_csv(|d, m, u| match (d, m, u) {
            (2, 1, 0) => 1_000_001,
            (3, 0, 1) => -5_000_000,
            _ => 0,
        }),
    )
    .unwrap();
    let out = reconcile(&config, "openai", &file, true);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        flagged(&report),
        cells(&[
            ("2026-03-02", "gpt-4o", "proj_a"),
            ("2026-03-03", "gpt-4o-mini", "*"),
        ])
    );
    assert_eq!(report["rows"].as_array().map(Vec::len), Some(12));
    // Unchanged, it is clean.
    std::fs::write(&file, openai_dashboard_csv(|_, _, _| 0)).unwrap();
    let out = reconcile(&config, "openai", &file, false);
    assert_exit(&out, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_difference_one_micro_under_the_threshold_is_not_flagged() {
    let (app, config) = setup().await;
    let file = app.dir.path().join("costs.json");
    // $0.999999 and exactly $1.00 (the threshold is passed only when exceeded).
    std::fs::write(
        &file,
        openai_export(|d, m, u| match (d, m, u) {
            (1, 0, 0) => 999_999,
            (2, 1, 1) => -1_000_000,
            _ => 0,
        }),
    )
    .unwrap();
    let out = reconcile(&config, "openai", &file, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(flagged(&report).is_empty(), "{report}");
    assert_eq!(report["reconciliation"]["flagged"], json!(0));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!webhook_kinds(&app)
        .await
        .iter()
        .any(|k| k == "reconcile_mismatch"));

    // Anthropic's report, in cents as decimal strings, matching Sluice's Anthropic spend.
    let report = json!({"data": [{"starting_at": "2026-03-02T00:00:00Z", "ending_at": "2026-03-03T00:00:00Z",
        "results": [
            {"currency": "USD", "amount": "400", "workspace_id": "wrkspc_1", "cost_type": "tokens",
             "model": "claude-3-5-haiku-20241022", "token_type": "uncached_input_tokens"},
            {"currency": "USD", "amount": "300.00", "workspace_id": "wrkspc_1", "cost_type": "tokens",
             "model": "claude-3-5-haiku-20241022", "token_type": "output_tokens"}]}],
        "has_more": false, "next_page": null});
    let file = app.dir.path().join("anthropic.json");
    std::fs::write(&file, report.to_string()).unwrap();
    let out = reconcile(&config, "anthropic", &file, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["rows"],
        json!([{"day": "2026-03-02", "model": "claude-3-5-haiku", "account": "wrkspc_1",
                "sluice_micros": 7_000_000, "provider_micros": 7_000_000, "diff_micros": 0, "flagged": false}])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_export_exits_2_naming_the_problem() {
    let (app, config) = setup().await;
    let dir = app.dir.path();
    let good = openai_export(|_, _, _| 0);
    // Day 1's bucket made a week long: it would land whole on day 1 (s29 finance attack F2).
    let day_1 = Utc
        .from_utc_datetime(&day(1).and_hms_opt(0, 0, 0).unwrap())
        .timestamp();
    let week = good.replacen(
        &format!("\"end_time\":{}", day_1 + 86_400),
        &format!("\"end_time\":{}", day_1 + 7 * 86_400),
        1,
    );
    assert_ne!(week, good);
    let cases: Vec<(&str, &str, String, &str)> = vec![
        ("openai", "week.json", week, "page 1, data[0].end_time: "),
        // A day from local midnight (PST) runs past its UTC day.
        ("anthropic", "offset.json", r#"{"data":[{"starting_at":"2026-03-02T00:00:00-08:00","ending_at":"2026-03-03T00:00:00-08:00","results":[]}],"has_more":false}"#.into(), "page 1, data[0].ending_at: "),
        ("openai", "truncated.json", good[..good.len() / 2].to_string(), "line "),
        ("openai", "amount.json", good.replacen("\"value\":", "\"value\":\"1,5\",\"x\":", 1), "amount.value"),
        ("openai", "items.json", good.replacen("\"line_item\":", "\"line_item\":null,\"y\":", 1), "line_item"),
        ("openai", "empty.json", String::new(), "empty"),
        ("anthropic", "cents.json", r#"{"data":[{"starting_at":"2026-03-02T00:00:00Z","results":[{"amount":"12e","currency":"USD","model":"m"}]}]}"#.into(), "data[0].results[0].amount"),
        ("anthropic", "binary.json", "\u{0}\u{1}".into(), "not a cost export"),
        // The calendar's last day: it has no next day (the run panicked computing one).
        ("openai", "end.json", json!({"object": "page", "has_more": false, "data": [{"object": "bucket",
            "start_time": 8_210_266_876_799_i64, "end_time": 8_210_266_876_799_i64, "results": [{"object": "organization.costs.result",
            "amount": {"value": 0.06, "currency": "usd"}, "line_item": "gpt-4o-mini, input", "project_id": "p"}]}]}).to_string(),
            "calendar's end"),
    ];
    for (provider, name, body, needle) in cases {
        let file = dir.join(name);
        std::fs::write(&file, body).unwrap();
        let out = reconcile(&config, provider, &file, false);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: expected `{needle}` in {err}");
        assert!(err.contains(name), "{name}: the file is named: {err}");
    }
    let out = reconcile(&config, "openai", &dir.join("missing.json"), false);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("cannot read"),
        "{}",
        text(&out.stderr)
    );
    // Nothing was stored.
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 0);
}

/// The provider bills a request under the model name the upstream was sent (the route's
/// `model`), not the name the client asked for: the request log keeps it, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_keeps_the_model_the_upstream_was_sent() {
    let app = crate::helpers::spawn_app().await;
    let (_, token) = app.token("dev", None).await;
    let mut body = crate::helpers::chat_body(10);
    body["model"] = json!("mini");
    assert_eq!(app.chat(&token, &body).await.status(), 200);
    body["stream"] = json!(true);
    let streamed = app.chat(&token, &body).await;
    assert_eq!(streamed.status(), 200);
    streamed.text().await.unwrap();
    app.wait_for_log_rows(2).await;
    let sent = crate::helpers::sql_text(
        app.db(),
        "SELECT MIN(upstream_model) || ' ' || MAX(upstream_model) FROM requests",
    )
    .await;
    assert_eq!(sent, "gpt-4o-mini-upstream gpt-4o-mini-upstream");
}

/// A saved first page of a paginated download (`has_more: true`) is not the month: the run
/// exits 2 naming `has_more` and stores nothing; the same page saved twice counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_or_repeated_export_is_not_reported_clean() {
    let (app, config) = setup().await;
    let dir = app.dir.path();
    let export = openai_export(|_, _, _| 0);
    let pages: Vec<&str> = export.lines().collect();
    let first = dir.join("first-page.json");
    std::fs::write(&first, pages[0]).unwrap();
    let out = reconcile(&config, "openai", &first, true);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    assert!(err.contains("has_more"), "{err}");
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 0, "nothing stored");

    // Page one saved twice, then page two: every figure once, nothing flagged.
    let twice = dir.join("twice.json");
    std::fs::write(
        &twice,
        format!("{}\n{}\n{}\n", pages[0], pages[0], pages[1]),
    )
    .unwrap();
    let out = reconcile(&config, "openai", &twice, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(flagged(&report).is_empty(), "{report}");

    // A bucket given twice with different figures cannot be told apart: refused.
    let other = openai_export(|d, _, _| if d == 1 { 5 } else { 0 });
    let clash = dir.join("clash.json");
    std::fs::write(
        &clash,
        format!("{}\n{}\n", other.lines().next().unwrap(), export),
    )
    .unwrap();
    let out = reconcile(&config, "openai", &clash, true);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("twice"), "{err}");
}

/// Anthropic's report bills web search as its own row (`cost_type: web_search`, no model);
/// Sluice folds the fee into the model's cost. The row is folded into the bucket's model, so
/// a day with searches compares like with like.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_rows_fold_into_the_models_figure() {
    let (app, config) = setup().await;
    let report = json!({"data": [{"starting_at": "2026-03-02T00:00:00Z", "ending_at": "2026-03-03T00:00:00Z",
        "results": [
            {"currency": "USD", "amount": "400", "workspace_id": "wrkspc_1", "cost_type": "tokens",
             "model": "claude-3-5-haiku-20241022", "token_type": "uncached_input_tokens"},
            {"currency": "USD", "amount": "200.00", "workspace_id": "wrkspc_1", "cost_type": "tokens",
             "model": "claude-3-5-haiku-20241022", "token_type": "output_tokens"},
            {"currency": "USD", "amount": "100", "workspace_id": "wrkspc_1", "cost_type": "web_search",
             "model": null}]}],
        "has_more": false, "next_page": null});
    let file = app.dir.path().join("searches.json");
    std::fs::write(&file, report.to_string()).unwrap();
    let out = reconcile(&config, "anthropic", &file, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["rows"],
        json!([{"day": "2026-03-02", "model": "claude-3-5-haiku", "account": "wrkspc_1",
                "sluice_micros": 7_000_000, "provider_micros": 7_000_000, "diff_micros": 0, "flagged": false}])
    );
}

/// The Costs API's pages saved one file each are read as one download: given together they
/// reconcile like the single file; the first alone is incomplete (exit 2); a CSV is read
/// beside them only one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_saved_as_several_files_are_read_as_one_download() {
    let (app, config) = setup().await;
    let export = openai_export(|_, _, _| 0);
    let mut pages = export.lines();
    let (first, second) = (
        app.dir.path().join("p1.json"),
        app.dir.path().join("p2.json"),
    );
    std::fs::write(&first, pages.next().unwrap()).unwrap();
    std::fs::write(&second, pages.next().unwrap()).unwrap();
    let run = |files: &[&Path]| reconcile_files(&config, "openai", files, true);
    let out = run(&[&first, &second]);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["rows"].as_array().unwrap().len(), 12);
    assert_eq!(
        report["reconciliation"]["source"],
        json!("p1.json, p2.json")
    );
    let out = run(&[&first]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("has_more"),
        "{}",
        text(&out.stderr)
    );
    let csv = app.dir.path().join("costs.csv");
    std::fs::write(&csv, openai_dashboard_csv(|_, _, _| 0)).unwrap();
    let out = run(&[&csv, &second]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("one at a time"),
        "{}",
        text(&out.stderr)
    );
}

/// The Costs API groups by project: a deployment billing to an API key cannot meet its
/// figures — they would be held against `*` and the key would read as unbilled. The run
/// refuses (exit 2, naming `api_key_id` and the key), nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_export_grouped_by_project_exits_2_when_a_deployment_claims_an_api_key() {
    let (app, config) = setup().await;
    let text_of = std::fs::read_to_string(&config).unwrap();
    let with_key = text_of.replace(
        "provider_account = \"proj_a\"\n",
        "provider_account = \"key_0\"\n",
    );
    assert_ne!(with_key, text_of);
    std::fs::write(&config, with_key).unwrap();
    for (name, body) in [
        ("costs.json", openai_export(|_, _, _| 0)),
        ("costs.csv", openai_dashboard_csv(|_, _, _| 0)),
    ] {
        let file = app.dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        let out = reconcile(&config, "openai", &file, false);
        let err = text(&out.stderr);
        assert_exit(&out, 2);
        assert!(
            err.contains("api_key_id") && err.contains("key_0"),
            "{name}: {err}"
        );
        assert!(err.contains(name), "{name}: {err}");
    }
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 0);
}

/// One download saved as several files: a malformed later file is named — it, not the
/// first or the whole download — with the position inside it (a JSON parser's line and
/// column counted in that file, a field's path from its own first page, a CSV's row of
/// that file), for every export reconcile reads; exit 2 as any unreadable export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_later_file_is_named_with_the_position_inside_it() {
    let (app, config) = setup().await;
    let dir = app.dir.path();
    let export = openai_export(|_, _, _| 0);
    let mut pages = export.lines();
    let (one, two) = (pages.next().unwrap(), pages.next().unwrap());
    let csv = openai_dashboard_csv(|_, _, _| 0);
    let rows: Vec<&str> = csv.lines().collect();
    // The second CSV's third row (its header the first) names another currency.
    let (csv_one, csv_two) = (
        format!("{}\n{}\n", rows[0], rows[1..7].join("\n")),
        format!(
            "{}\n{}\n{}\n{}\n",
            rows[0],
            rows[7],
            rows[8].replacen(",usd,", ",eur,", 1),
            rows[9..].join("\n")
        ),
    );
    let usage = |d: u32, output: i64| {
        bucket(
            d,
            vec![
                json!({"input_tokens": 1, "output_tokens": output, "input_cached_tokens": 0,
                "model": "gpt-4o", "project_id": "proj_a", "api_key_id": "key_0"}),
            ],
        )
    };
    let usage_page = |buckets: Vec<Value>, more: bool| {
        json!({"object": "page", "data": buckets, "has_more": more}).to_string()
    };
    let claude = |d: u32, amount: &str, more: bool| {
        json!({"data": [{"starting_at": format!("{}T00:00:00Z", day(d)),
            "ending_at": format!("{}T00:00:00Z", day(d + 1)),
            "results": [{"amount": amount, "currency": "USD", "model": "claude-3-5-haiku",
                "workspace_id": "wrkspc_1"}]}], "has_more": more})
        .to_string()
    };
    // (provider, first file, second file, what the error says after the second's name)
    let cases: Vec<(&str, String, String, &str)> = vec![
        (
            "openai",
            one.to_string(),
            two.replacen("\"value\":", "\"value\":\"1,5\",\"x\":", 1),
            ": page 1, data[0].results[0].amount.value",
        ),
        (
            "openai",
            one.to_string(),
            format!("\n\n{}", &two[..two.len() / 2]),
            ": not a cost export: EOF while parsing an object at line 3 column",
        ),
        ("openai", csv_one, csv_two, ": row 3, amount_currency"),
        (
            "openai-usage",
            usage_page(vec![usage(1, 5), usage(2, 5)], true),
            usage_page(vec![usage(3, -1)], false),
            ": page 1, data[0].results[0].output_tokens",
        ),
        (
            "anthropic",
            claude(1, "100", true),
            claude(2, "12e", false),
            ": page 1, data[0].results[0].amount",
        ),
        (
            "anthropic",
            claude(1, "100", true),
            "{\n\"data\": [}".to_string(),
            ": not a cost export: expected value at line 2 column 10",
        ),
    ];
    for (n, (provider, first, second, needle)) in cases.into_iter().enumerate() {
        let (a, b) = (
            dir.join(format!("first-{n}")),
            dir.join(format!("second-{n}")),
        );
        std::fs::write(&a, first).unwrap();
        std::fs::write(&b, second).unwrap();
        let out = reconcile_files(&config, provider, &[&a, &b], false);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{provider} {n}: {err}");
        let expected = format!("error: {}{needle}", b.display());
        assert!(
            err.contains(&expected),
            "{provider} {n}: expected `{expected}` in {err}"
        );
        assert!(
            !err.contains(&format!("first-{n}")),
            "{provider} {n}: only the bad file is named: {err}"
        );
    }
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 0);
}
