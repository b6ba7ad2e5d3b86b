//! `sluice reconcile --provider openai-usage` (issue 20, item 4): OpenAI's completions
//! usage export held against the request log's tokens per (day, model, account). The log
//! is seeded over 3 days × 2 models × 2 accounts, through every endpoint OpenAI bills as
//! completions, beside embeddings requests the export does not hold; the export is built
//! from the same counts, so exactly the cells made to differ are flagged.

use std::path::{Path, PathBuf};
use std::process::Output;

use chrono::{TimeZone, Utc};
use serde_json::{json, Value};
use sluice::quota::pricing::Parts;
use sluice::store::requests::{self, RequestRow};

use crate::helpers::{spawn_app_with, TestApp};
use crate::reconcile::{
    assert_exit, bucket, cells, config, day, flagged, reconcile, text, two_pages, webhook_kinds,
    MODELS, UPSTREAMS,
};

/// A cell's (input, output, cached input) tokens: distinct per cell.
fn cell(d: u32, m: usize, u: usize) -> (i64, i64, i64) {
    let input = 10_000 * i64::from(d) + 1_000 * m as i64 + 100 * u as i64 + 7;
    (input, input / 3, input / 5)
}

/// The request log's endpoints OpenAI's completions usage counts: a cell's second request
/// goes through one of them in turn (its first through chat).
const COMPLETION_ENDPOINTS: [&str; 4] =
    ["responses", "completions", "messages", "chat.completions"];

/// Each cell as two requests (their sums are the cell's counts), plus an Anthropic
/// deployment's request an OpenAI reconciliation leaves out, and an embeddings request on
/// each OpenAI deployment each day: OpenAI's embeddings usage is another export.
async fn seed(app: &TestApp) {
    let mut rows = Vec::new();
    let row = |id: String,
               endpoint: &'static str,
               upstream: &str,
               model: &str,
               at,
               (input, output, cached)| RequestRow {
        id,
        endpoint,
        model: model.into(),
        served_model: model.into(),
        upstream: upstream.into(),
        upstream_model: model.into(),
        status: 200,
        input_tokens: input,
        output_tokens: output,
        kinds: Parts {
            cached_input: cached,
            ..Parts::default()
        },
        cost_micros: 1,
        cache: "miss",
        created_at: sluice::clock::db_time(at),
        ..Default::default()
    };
    for d in 1..=3 {
        for (m, model) in MODELS.iter().enumerate() {
            for (u, (upstream, _)) in UPSTREAMS.iter().enumerate() {
                let (i, o, c) = cell(d, m, u);
                for (n, part) in [(i / 2, o / 2, c / 2), (i - i / 2, o - o / 2, c - c / 2)]
                    .into_iter()
                    .enumerate()
                {
                    let at =
                        Utc.from_utc_datetime(&day(d).and_hms_opt(9 + n as u32, 0, 0).unwrap());
                    let endpoint = match n {
                        0 => "chat.completions",
                        _ => COMPLETION_ENDPOINTS[(d as usize + m + u) % 4],
                    };
                    rows.push(row(
                        format!("req-{d}-{m}-{u}-{n}"),
                        endpoint,
                        upstream,
                        model,
                        at,
                        part,
                    ));
                }
            }
        }
        for (u, (upstream, _)) in UPSTREAMS.iter().enumerate() {
            let at = Utc.from_utc_datetime(&day(d).and_hms_opt(14, 0, 0).unwrap());
            rows.push(row(
                format!("req-embed-{d}-{u}"),
                "embeddings",
                upstream,
                EMBEDDING_MODEL,
                at,
                (5_000 + i64::from(d), 0, 0),
            ));
        }
    }
    let at = Utc.from_utc_datetime(&day(2).and_hms_opt(12, 0, 0).unwrap());
    rows.push(row(
        "req-claude".into(),
        "messages",
        "c",
        "claude-3-5-haiku",
        at,
        (5, 5, 5),
    ));
    requests::insert_batch(app.db(), &rows).await.unwrap();
}

const EMBEDDING_MODEL: &str = "text-embedding-3-small";

/// How the usage export was asked to group its figures besides by model.
#[derive(Clone, Copy, PartialEq)]
enum Grouping {
    /// `group_by=api_key_id&group_by=project_id`: a figure per account.
    Accounts,
    /// Not by account: one figure per model, `api_key_id` and `project_id` null (as the
    /// Usage API answers).
    NullIds,
    /// Not by account, the id fields left out altogether.
    NoIds,
    /// `group_by=project_id` only: both deployments' keys in one project `proj_1`, a
    /// model's figure their sum, `api_key_id` null.
    Project,
}

/// OpenAI's completions usage export of the seeded counts, grouped by model, project and
/// API key (a key no deployment names: the project decides), `delta` added to a cell's
/// (input, output, cached); two pages.
fn usage_export(delta: impl Fn(u32, usize, usize) -> (i64, i64, i64)) -> String {
    usage_export_grouped(Grouping::Accounts, delta)
}

/// `usage_export` grouped as `grouping` says: not by account, a model's cells are summed.
fn usage_export_grouped(
    grouping: Grouping,
    delta: impl Fn(u32, usize, usize) -> (i64, i64, i64),
) -> String {
    let mut buckets = Vec::new();
    for d in 1..=3 {
        let mut results = Vec::new();
        for (m, model) in MODELS.iter().enumerate() {
            let mut sum = (0, 0, 0);
            for (u, (_, project)) in UPSTREAMS.iter().enumerate() {
                let (i, o, c) = cell(d, m, u);
                let (di, d_o, dc) = delta(d, m, u);
                let (i, o, c) = (i + di, o + d_o, c + dc);
                sum = (sum.0 + i, sum.1 + o, sum.2 + c);
                if grouping == Grouping::Accounts {
                    results.push(json!({
                        "object": "organization.usage.completions.result",
                        "input_tokens": i, "output_tokens": o, "input_cached_tokens": c,
                        "num_model_requests": 2, "project_id": project, "user_id": null,
                        "api_key_id": format!("key_{u}"), "model": format!("{model}-2024-07-18"),
                        "batch": null,
                    }));
                }
            }
            let mut result = json!({
                "object": "organization.usage.completions.result",
                "input_tokens": sum.0, "output_tokens": sum.1, "input_cached_tokens": sum.2,
                "num_model_requests": 4, "model": format!("{model}-2024-07-18"),
            });
            match grouping {
                Grouping::Accounts => continue,
                Grouping::NullIds => {
                    for id in ["project_id", "user_id", "api_key_id", "batch"] {
                        result[id] = Value::Null;
                    }
                }
                Grouping::NoIds => {}
                Grouping::Project => {
                    result["project_id"] = json!("proj_1");
                    result["api_key_id"] = Value::Null;
                }
            }
            results.push(result);
        }
        buckets.push(bucket(d, results));
    }
    two_pages(&buckets)
}

/// The seeded app, the CLI's config for it and where the export is saved.
async fn setup() -> (TestApp, PathBuf, PathBuf) {
    let app = spawn_app_with(|_, _| {}).await;
    seed(&app).await;
    let config = config(&app);
    let file = app.dir.path().join("usage.json");
    (app, config, file)
}

/// Saves `export` at `file` and reconciles it as OpenAI's usage export.
fn reconcile_usage(config: &Path, file: &Path, export: String, json: bool) -> Output {
    std::fs::write(file, export).unwrap();
    reconcile(config, "openai-usage", file, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_export_differing_in_exactly_two_cells_flags_exactly_those_two() {
    let (app, config, file) = setup().await;
    // Day 1, gpt-4o, proj_a: one output token more; day 3, gpt-4o-mini, account `*`: 40
    // cached tokens fewer. Every other count as logged.
    let export = usage_export(|d, m, u| match (d, m, u) {
        (1, 1, 0) => (0, 1, 0),
        (3, 0, 1) => (0, 0, -40),
        _ => (0, 0, 0),
    });
    let out = reconcile_usage(&config, &file, export, true);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(report["rows"].as_array().unwrap().len(), 12, "{report}");
    assert_eq!(
        flagged(&report),
        cells(&[
            ("2026-03-01", "gpt-4o", "proj_a"),
            ("2026-03-03", "gpt-4o-mini", "*"),
        ])
    );
    let row = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["day"] == "2026-03-03" && r["model"] == "gpt-4o-mini" && r["account"] == "*")
        .unwrap();
    let (_, _, cached) = cell(3, 0, 1);
    assert_eq!(row["sluice"]["cached_input_tokens"], cached, "{row}");
    assert_eq!(row["provider"]["cached_input_tokens"], cached - 40, "{row}");
    assert!(webhook_kinds(&app)
        .await
        .iter()
        .any(|k| k == "reconcile_mismatch"));

    // The same counts everywhere: every row clean, exit 0, the table says so.
    let out = reconcile_usage(&config, &file, usage_export(|_, _, _| (0, 0, 0)), false);
    assert_exit(&out, 0);
    assert!(
        text(&out.stdout).contains("0 of 12 rows flagged"),
        "{}",
        text(&out.stdout)
    );
}

/// The export holds completions only (chat, responses, legacy completions; an Anthropic
/// messages request sent to OpenAI is chat there): the log's embeddings requests on the
/// same deployments are no part of the comparison — not a row of their own, not in a
/// cell — while every completions endpoint's tokens are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_requests_are_left_out_and_every_completions_endpoint_counts() {
    let (_app, config, file) = setup().await;
    // Day 2, gpt-4o-mini, proj_a: 3 input tokens more. Every other count as logged.
    let export = usage_export(|d, m, u| match (d, m, u) {
        (2, 0, 0) => (3, 0, 0),
        _ => (0, 0, 0),
    });
    let out = reconcile_usage(&config, &file, export, true);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert!(
        rows.iter().all(|r| r["model"] != EMBEDDING_MODEL),
        "embeddings tokens are not completions usage: {report}"
    );
    assert_eq!(rows.len(), 12, "{report}");
    assert_eq!(
        flagged(&report),
        cells(&[("2026-03-02", "gpt-4o-mini", "proj_a")])
    );
}

/// An export not grouped by API key and project names no account: compared to deployments
/// that claim accounts, every figure would meet the deployments naming none (`*`) and the
/// claimed ones would show as unbilled. The run refuses it (exit 2, naming the query
/// parameter to add) whether the ids are null or absent; with no deployment of OpenAI's
/// claiming an account (another provider's claim does not count) it is compared whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_not_grouped_by_account_exits_2_naming_group_by_api_key_id_when_deployments_claim_accounts(
) {
    let (app, config, file) = setup().await;
    for grouping in [Grouping::NullIds, Grouping::NoIds] {
        let export = usage_export_grouped(grouping, |_, _, _| (0, 0, 0));
        let out = reconcile_usage(&config, &file, export, false);
        let err = text(&out.stderr);
        assert_exit(&out, 2);
        assert!(err.contains("group_by=api_key_id"), "{err}");
        assert!(
            err.contains("proj_a"),
            "the claimed account is named: {err}"
        );
        assert_eq!(text(&out.stdout), "", "no comparison is printed");
    }
    assert!(
        webhook_kinds(&app).await.is_empty(),
        "{:?}",
        webhook_kinds(&app).await
    );

    // No OpenAI deployment names an account: everything is `*` on both sides anyway.
    let unclaimed = app.dir.path().join("unclaimed.toml");
    let text_of = std::fs::read_to_string(&config).unwrap();
    let without = text_of.replace("provider_account = \"proj_a\"\n", "");
    assert_ne!(without, text_of);
    std::fs::write(&unclaimed, without).unwrap();
    let export = usage_export_grouped(Grouping::NullIds, |_, _, _| (0, 0, 0));
    let out = reconcile_usage(&unclaimed, &file, export, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{report}");
    assert!(rows.iter().all(|r| r["account"] == "*"), "{report}");
}

/// An export grouped by project only (the figures name `proj_1`, no API key) while a
/// deployment bills to an API key: the project's figure sums both deployments' keys and
/// would be held against one key's log (or `*`'s), a difference that means nothing. The
/// run refuses it (exit 2, naming `group_by=api_key_id` and the key); when the
/// deployments name the project instead, it compares per project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_grouped_by_project_exits_2_naming_group_by_api_key_id_when_deployments_claim_keys(
) {
    let (app, config, file) = setup().await;
    let text_of = std::fs::read_to_string(&config).unwrap();
    let keyed = app.dir.path().join("keyed.toml");
    let with_key = text_of.replace(
        "provider_account = \"proj_a\"\n",
        "provider_account = \"key_0\"\n",
    );
    assert_ne!(with_key, text_of);
    std::fs::write(&keyed, with_key).unwrap();
    let export = usage_export_grouped(Grouping::Project, |_, _, _| (0, 0, 0));
    let out = reconcile_usage(&keyed, &file, export.clone(), false);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    assert!(err.contains("group_by=api_key_id"), "{err}");
    assert!(err.contains("key_0"), "the claimed key is named: {err}");
    assert_eq!(text(&out.stdout), "", "no comparison is printed");
    assert!(webhook_kinds(&app).await.is_empty());

    // Both deployments name the project: its figures meet their summed log, clean.
    let by_project = app.dir.path().join("project.toml");
    let mut with_project = text_of.replace("provider_account = \"proj_a\"\n", "");
    with_project = with_project.replace(
        "allow_private_network = true\n\n[[upstreams]]\nid = \"c\"",
        "allow_private_network = true\nprovider_account = \"proj_1\"\n\n[[upstreams]]\nid = \"c\"",
    );
    with_project = with_project.replacen(
        "id = \"a\"\nprovider = \"openai\"",
        "id = \"a\"\nprovider_account = \"proj_1\"\nprovider = \"openai\"",
        1,
    );
    assert_eq!(with_project.matches("proj_1").count(), 2, "{with_project}");
    std::fs::write(&by_project, with_project).unwrap();
    let out = reconcile_usage(&by_project, &file, export, true);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{report}");
    assert!(rows.iter().all(|r| r["account"] == "proj_1"), "{report}");
}

/// A last day the usage export covers with an empty bucket (no usage billed) is compared:
/// Sluice's tokens on it are flagged against 0 and the run's last day is it (s29 finance
/// attack F1: the days were the figures', so day 3 fell out and the run was clean).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_day_without_usage_in_the_export_is_still_compared() {
    let (_app, config, file) = setup().await;
    let export = usage_export(|_, _, _| (0, 0, 0));
    let mut pages: Vec<Value> = export
        .lines()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    let last = pages.last_mut().unwrap();
    assert_eq!(last["data"].as_array().map(Vec::len), Some(1), "{last}");
    last["data"][0]["results"] = json!([]);
    let export: Vec<String> = pages.iter().map(Value::to_string).collect();
    let out = reconcile_usage(&config, &file, export.join("\n"), true);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(report["last_day"], "2026-03-03", "{report}");
    let day_3: Vec<&Value> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["day"] == "2026-03-03")
        .collect();
    assert_eq!(day_3.len(), 4, "{report}");
    for r in day_3 {
        assert_eq!(r["flagged"], json!(true), "{r}");
        assert_eq!(r["provider"]["input_tokens"], json!(0), "{r}");
        assert!(r["sluice"]["input_tokens"].as_i64() > Some(0), "{r}");
    }
}
