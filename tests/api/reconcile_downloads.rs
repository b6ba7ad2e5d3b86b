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

/// The provider's figure of (day, model, account) in a JSON report.
fn provider_micros(report: &Value, day: &str, model: &str, account: &str) -> i64 {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["day"] == day && r["model"] == model && r["account"] == account)
        .and_then(|r| r["provider_micros"].as_i64())
        .unwrap_or_else(|| panic!("no row {day} {model} {account}: {report}"))
}

/// CSV rows equal in day, line item, account and amount are still different figures when
/// another organisation or another hour bills them: every one counts. A file given twice
/// whole counts once; any other repeat — a row of one file repeated, or an overlapping
/// export's — exits 2 naming both rows, rather than a figure dropped or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_rows_of_other_organisations_or_hours_all_count_and_a_repeat_is_refused() {
    let (app, config) = setup().await;
    // No account claimed: rows without a project are as good as any (every figure meets
    // `*`), as an organisation's export not grouped by project has them.
    let claimed = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        claimed.replace("provider_account = \"proj_a\"\n", ""),
    )
    .unwrap();
    let dir = app.dir.path();
    let run = |files: &[&Path]| reconcile_files(&config, "openai", files, true);
    let (d2, model, star) = ("2026-03-02", "gpt-4o-mini", "*");
    // Day 2, gpt-4o-mini: both deployments' cells meet `*`; deployment b's input line (no
    // project) is a quarter of its cell.
    let total = cell(2, 0, 0) + cell(2, 0, 1);
    let input = cell(2, 0, 1) / 4;
    let header = "start_time,end_time,amount_value,amount_currency,line_item,project_id,organization_id,project_name,organization_name";
    let row = |start: &str, end: &str, micros: i64, org: &str| {
        format!(
            "{start},{end},{},usd,\"gpt-4o-mini-2024-07-18, input\",,{org},,Acme",
            usd_text(micros)
        )
    };
    let org_1 = crate::reconcile::openai_dashboard_csv(|_, _, _| 0);
    let its_row = row("2026-03-02", "2026-03-03", input, "org_1");
    assert_eq!(org_1.matches(&its_row).count(), 1, "{org_1}");
    let costs = write(dir, "costs.csv", &org_1);

    // Another organisation's export holding a row equal to org_1's but for its
    // organisation: billed on top.
    let org_2 = write(
        dir,
        "org-2.csv",
        &format!(
            "{header}\n{}\n",
            row("2026-03-02", "2026-03-03", input, "org_2")
        ),
    );
    let out = run(&[&costs, &org_2]);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{}",
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        provider_micros(&report, d2, model, star),
        total + input,
        "{report}"
    );

    // The line billed by the hour in two files, half each: both halves count.
    let daily = write(
        dir,
        "daily.csv",
        &org_1.replace(&format!("{its_row}\n"), ""),
    );
    let hour = |h: u32| {
        format!(
            "{header}\n{}\n",
            row(
                &format!("2026-03-02T{h:02}:00:00Z"),
                &format!("2026-03-02T{:02}:00:00Z", h + 1),
                input / 2,
                "org_1"
            )
        )
    };
    let (h0, h1) = (
        write(dir, "h0.csv", &hour(0)),
        write(dir, "h1.csv", &hour(1)),
    );
    let out = run(&[&daily, &h0, &h1]);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(provider_micros(&report, d2, model, star), total, "{report}");

    // The same file given twice counts once.
    let copy = write(dir, "costs (1).csv", &org_1);
    let out = run(&[&costs, &copy]);
    assert_exit(&out, 0);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(provider_micros(&report, d2, model, star), total, "{report}");

    // An overlapping export (day 3 again): refused naming both rows. Day 3's first row is
    // costs.csv's row 18 (the header, then 8 rows a day).
    let day_3: Vec<&str> = org_1.lines().skip(17).collect();
    let overlap = write(
        dir,
        "day3.csv",
        &format!("{header}\n{}\n", day_3.join("\n")),
    );
    let out = run(&[&costs, &overlap]);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    let (here, there) = (
        format!("error: {}: row 2: ", overlap.display()),
        format!("{}: row 18", costs.display()),
    );
    assert!(
        err.contains(&here) && err.contains(&there),
        "expected `{here}` … `{there}` in {err}"
    );

    // A row repeated inside one file: refused naming both.
    let repeated = write(
        dir,
        "repeated.csv",
        &format!("{org_1}{}\n", org_1.lines().nth(1).unwrap()),
    );
    let out = run(&[&repeated]);
    let err = text(&out.stderr);
    assert_exit(&out, 2);
    let expected = format!("error: {}: row 26: ", repeated.display());
    assert!(
        err.contains(&expected) && err.contains("row 2"),
        "expected `{expected}` in {err}"
    );
}

/// An empty file given with others is named as empty — whatever the others are (it was
/// read as a JSON page beside CSV files) — and nothing is stored; a CSV of its header only
/// (an export of days without spend) is zero rows beside the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_file_among_others_is_named_as_empty() {
    let (app, config) = setup().await;
    let dir = app.dir.path();
    let run = |files: &[&Path]| reconcile_files(&config, "openai", files, false);
    let csv = crate::reconcile::openai_dashboard_csv(|_, _, _| 0);
    let costs = write(dir, "costs.csv", &csv);
    let pages = crate::reconcile::openai_export(|_, _, _| 0);
    let mut pages = pages.lines();
    let (p1, p2) = (
        write(dir, "p1.json", pages.next().unwrap()),
        write(dir, "p2.json", pages.next().unwrap()),
    );
    for body in ["", " \n\r\n", "\u{feff}"] {
        let empty = write(dir, "empty.csv", body);
        for files in [
            vec![costs.as_path(), empty.as_path()],
            vec![empty.as_path(), costs.as_path()],
            vec![p1.as_path(), empty.as_path(), p2.as_path()],
        ] {
            let out = run(&files);
            let err = text(&out.stderr);
            assert_exit(&out, 2);
            let expected = format!("error: {}: the file is empty", empty.display());
            assert!(
                err.contains(&expected),
                "{body:?}: expected `{expected}` in {err}"
            );
            assert!(!err.contains("beside JSON"), "{err}");
        }
    }
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(runs, 0);

    let header = write(dir, "header.csv", csv.lines().next().unwrap());
    assert_exit(&run(&[&costs, &header]), 0);
    let out = run(&[&header]);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("no rows"),
        "{}",
        text(&out.stderr)
    );
}

/// The flagged rows of a JSON report on `day`, each with Sluice's and the provider's figure.
fn flagged_on(report: &Value, day: &str) -> Vec<(String, String, i64, i64)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["day"] == day && r["flagged"] == json!(true))
        .map(|r| {
            (
                r["model"].as_str().unwrap().to_string(),
                r["account"].as_str().unwrap().to_string(),
                r["sluice_micros"].as_i64().unwrap(),
                r["provider_micros"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// A day the export covers with an empty bucket (`results: []`: the provider billed
/// nothing) is compared like any other: Sluice's spend on it is a flagged row against 0,
/// and the stored run covers it. Before, the compared days were the figures' first to
/// last, so an empty first or last day fell out of the comparison and the run was clean
/// (s29 finance attack F1). An export of empty buckets only covers its days too; one of
/// no bucket at all covers none and exits 2, storing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn days_the_export_covers_without_figures_are_still_compared() {
    let (app, config) = setup().await;
    let dir = app.dir.path();
    let run = |provider: &str, file: &Path| reconcile_files(&config, provider, &[file], true);
    let page =
        |data: Vec<Value>| json!({"object": "page", "data": data, "has_more": false}).to_string();
    // Sluice's figures of day `d` on deployment a (proj_a) and b (`*`), per model.
    let sluice = |d: u32| -> Vec<(String, String, i64, i64)> {
        let mut out = Vec::new();
        for (m, model) in MODELS.iter().enumerate() {
            for (u, account) in ["proj_a", "*"].iter().enumerate() {
                out.push((model.to_string(), account.to_string(), cell(d, m, u), 0));
            }
        }
        out.sort();
        out
    };

    // The last day billed nothing.
    let last_empty = write(
        dir,
        "last-empty.json",
        &page(vec![
            bucket(1, results(1, false)),
            bucket(2, results(2, false)),
            bucket(3, vec![]),
        ]),
    );
    let out = run("openai", &last_empty);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["reconciliation"]["first_day"], "2026-03-01",
        "{report}"
    );
    assert_eq!(
        report["reconciliation"]["last_day"], "2026-03-03",
        "{report}"
    );
    let mut day_3 = flagged_on(&report, "2026-03-03");
    day_3.sort();
    assert_eq!(day_3, sluice(3), "{report}");
    assert!(flagged_on(&report, "2026-03-01").is_empty(), "{report}");
    let id = report["reconciliation"]["id"].as_i64().unwrap();
    let stored = crate::helpers::scalar_on(
        app.db(),
        &format!(
            "SELECT COUNT(*) FROM reconciliations WHERE id = {id} AND first_day = '2026-03-01' AND last_day = '2026-03-03'"
        ),
    )
    .await;
    assert_eq!(stored, 1, "the stored run covers day 3");
    let stored_rows = crate::helpers::scalar_on(
        app.db(),
        &format!(
            "SELECT COUNT(*) FROM reconciliation_rows WHERE run_id = {id} AND day = '2026-03-03' AND provider_micros = 0 AND sluice_micros > 0 AND flagged"
        ),
    )
    .await;
    assert_eq!(
        stored_rows, 4,
        "day 3's four cells are stored flagged against 0"
    );

    // The first day billed nothing.
    let first_empty = write(
        dir,
        "first-empty.json",
        &page(vec![
            bucket(1, vec![]),
            bucket(2, results(2, false)),
            bucket(3, results(3, false)),
        ]),
    );
    let out = run("openai", &first_empty);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["reconciliation"]["first_day"], "2026-03-01",
        "{report}"
    );
    let mut day_1 = flagged_on(&report, "2026-03-01");
    day_1.sort();
    assert_eq!(day_1, sluice(1), "{report}");

    // Anthropic's report of empty buckets only: Sluice's $7 on day 2 is unbilled.
    let anthropic_bucket = |d: u32| {
        json!({"starting_at": format!("{}T00:00:00Z", crate::reconcile::day(d)),
               "ending_at": format!("{}T00:00:00Z", crate::reconcile::day(d + 1)),
               "results": []})
    };
    let nothing_billed = write(
        dir,
        "anthropic-empty.json",
        &page((1..=3).map(anthropic_bucket).collect()),
    );
    let out = run("anthropic", &nothing_billed);
    assert_exit(&out, 3);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["reconciliation"]["last_day"], "2026-03-03",
        "{report}"
    );
    assert_eq!(
        flagged_on(&report, "2026-03-02"),
        vec![(
            "claude-3-5-haiku".to_string(),
            "wrkspc_1".to_string(),
            7_000_000,
            0
        )],
        "{report}"
    );

    // No bucket at all: no day covered, nothing to compare.
    let runs = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    let no_bucket = write(dir, "no-bucket.json", &page(vec![]));
    let out = run("openai", &no_bucket);
    assert_exit(&out, 2);
    assert!(
        text(&out.stderr).contains("no-bucket.json"),
        "{}",
        text(&out.stderr)
    );
    let after = crate::helpers::scalar_on(app.db(), "SELECT COUNT(*) FROM reconciliations").await;
    assert_eq!(after, runs, "nothing stored");
}
