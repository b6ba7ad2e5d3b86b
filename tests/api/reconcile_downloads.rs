//! `sluice reconcile` over a download given as several files: each part of it (a JSON
//! page, a CSV file) must be grouped by the kind of account the deployments claim, rows of
//! different files are never taken for one another, and an empty file is named as such.
//! The request log and the figures are `reconcile.rs`'s (3 days × 2 models × 2
//! deployments).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::helpers::TestApp;
use crate::reconcile::{
    assert_exit, bucket, cell, reconcile_files, setup, text, usd_text, MODELS, UPSTREAMS,
};

/// The API key deployment `a` bills to here (it names `proj_a` in `reconcile.rs`'s config);
/// `b`'s key is `key_2`, which no deployment claims (its figures meet `*`).
const KEYS: [&str; 2] = ["key_1", "key_2"];

/// The seeded app, with deployment `a` claiming the API key `key_1`.
async fn setup_claiming_a_key() -> (TestApp, PathBuf) {
    let (app, config) = setup().await;
    let before = std::fs::read_to_string(&config).unwrap();
    let after = before.replace(
        "provider_account = \"proj_a\"\n",
        "provider_account = \"key_1\"\n",
    );
    assert_ne!(before, after);
    std::fs::write(&config, after).unwrap();
    (app, config)
}

/// Day `d`'s cell (model `m`, deployment `u`) as the Costs API's input and output results,
/// naming the deployment's API key only when the query grouped by it.
fn results(d: u32, by_key: bool) -> Vec<Value> {
    let mut out = Vec::new();
    for (m, model) in MODELS.iter().enumerate() {
        for (u, (_, project)) in UPSTREAMS.iter().enumerate() {
            let total = cell(d, m, u);
            let input = total / 4;
            for (kind, micros) in [("input", input), ("output", total - input)] {
                let value: Value = serde_json::from_str(&usd_text(micros)).unwrap();
                let mut r = json!({
                    "object": "organization.costs.result",
                    "amount": {"value": value, "currency": "usd"},
                    "line_item": format!("{model}-2024-07-18, {kind}"),
                    "project_id": project,
                });
                if by_key {
                    r["api_key_id"] = json!(KEYS[u]);
                }
                out.push(r);
            }
        }
    }
    out
}

/// One Costs API page of `days`, grouped by key (`group_by=api_key_id`) or not.
fn costs_page(days: &[u32], by_key: bool, more: bool) -> String {
    let data: Vec<Value> = days
        .iter()
        .map(|&d| bucket(d, results(d, by_key)))
        .collect();
    json!({"object": "page", "data": data, "has_more": more,
        "next_page": if more { json!("next") } else { Value::Null }})
    .to_string()
}

/// The same days as the dashboard's CSV, with an `api_key_id` column when grouped by key.
fn costs_csv(days: &[u32], by_key: bool) -> String {
    let mut out = String::from("start_time,end_time,amount_value,amount_currency,line_item,");
    out.push_str(if by_key {
        "project_id,api_key_id,organization_id\n"
    } else {
        "project_id,organization_id\n"
    });
    for &d in days {
        for (m, model) in MODELS.iter().enumerate() {
            for (u, (_, project)) in UPSTREAMS.iter().enumerate() {
                let total = cell(d, m, u);
                let input = total / 4;
                for (kind, micros) in [("input", input), ("output", total - input)] {
                    let key = if by_key {
                        format!("{},", KEYS[u])
                    } else {
                        String::new()
                    };
                    out.push_str(&format!(
                        "{},{},{},usd,\"{model}-2024-07-18, {kind}\",{},{key}org_1\n",
                        crate::reconcile::day(d),
                        crate::reconcile::day(d + 1),
                        usd_text(micros),
                        project.unwrap_or(""),
                    ));
                }
            }
        }
    }
    out
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Days 1–2 grouped by API key and day 3 by project only, read as one download while a
/// deployment claims `key_1`: day 3's figures would meet `*` and key_1's day 3 read as
/// unbilled. Each part is judged on its own — the second file (a JSON page, a CSV file),
/// and the second page of one file — and the run exits 2 naming it, its position and
/// `group_by=api_key_id`, storing nothing. Every part grouped by key: clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_and_page_must_be_grouped_by_the_kind_of_account_claimed() {
    let (app, config) = setup_claiming_a_key().await;
    let dir = app.dir.path();
    let run = |files: &[&Path]| reconcile_files(&config, "openai", files, true);

    let keyed = write(dir, "keyed.json", &costs_page(&[1, 2], true, true));
    let keyed_end = write(dir, "keyed-end.json", &costs_page(&[3], true, false));
    let out = run(&[&keyed, &keyed_end]);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["rows"].as_array().map(Vec::len),
        Some(12),
        "{report}"
    );

    let by_project = write(dir, "by-project.json", &costs_page(&[3], false, false));
    let out = run(&[&keyed, &by_project]);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    let expected = format!("error: {}: page 1: ", by_project.display());
    assert!(err.contains(&expected), "expected `{expected}` in {err}");
    assert!(
        err.contains("group_by=api_key_id") && err.contains("key_1"),
        "{err}"
    );
    assert!(!err.contains("keyed.json"), "only the part is named: {err}");

    // Both pages in one file: the second page is named.
    let both = write(
        dir,
        "both.json",
        &format!(
            "{}\n{}\n",
            costs_page(&[1, 2], true, true),
            costs_page(&[3], false, false)
        ),
    );
    let out = run(&[&both]);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    let expected = format!("error: {}: page 2: ", both.display());
    assert!(err.contains(&expected), "expected `{expected}` in {err}");

    // The dashboard's CSV: a file is one export, judged whole.
    let keyed_csv = write(dir, "keyed.csv", &costs_csv(&[1, 2], true));
    let keyed_csv_end = write(dir, "keyed-end.csv", &costs_csv(&[3], true));
    assert_exit(&run(&[&keyed_csv, &keyed_csv_end]), 0);
    let project_csv = write(dir, "by-project.csv", &costs_csv(&[3], false));
    let out = run(&[&keyed_csv, &project_csv]);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    let expected = format!("error: {}: ", project_csv.display());
    assert!(err.contains(&expected), "expected `{expected}` in {err}");
    assert!(
        err.contains("group_by=api_key_id") && !err.contains("keyed.csv"),
        "{err}"
    );

    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 2, "only the two clean runs are stored");
}
