//! The spend rollup's tag bound cannot be flooded across tenants: a team's admin-set tags
//! are never rolled up, header values are bounded per team, and a request that costs
//! nothing (refused, failed) admits no new value (`store::tag_bound`); nor by combining
//! values that are each admitted.

use chrono::Utc;
use sluice::cli::IssueArgs;

use crate::admin_helpers::{login, make_login};
use crate::helpers::*;

const BOUND: u32 = 3;

async fn team(app: &TestApp, name: &str, tags: Option<&str>) {
    sluice::cli::team_create_tagged(app.db(), name, None, tags, Utc::now())
        .await
        .unwrap();
}

/// A user of `team` and a token of theirs with `budget`.
async fn member(app: &TestApp, team: &str, user: &str, budget: &str) -> String {
    let now = Utc::now();
    let args = sluice::cli::UserArgs {
        username: user,
        team: Some(team),
        rpm: None,
        tpm: None,
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(app.db(), &args, now)
        .await
        .unwrap();
    let args = IssueArgs {
        budget_usd: Some(budget),
        ..issue_args(user)
    };
    sluice::cli::token_issue_tagged(app.db(), &args, None, now)
        .await
        .unwrap()
        .text
}

async fn tagged(app: &TestApp, token: &str, tags: &str) -> u16 {
    app.http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(token)
        .header("x-sluice-tags", tags)
        .json(&chat_body(16))
        .send()
        .await
        .expect("request sent")
        .status()
        .as_u16()
}

/// The rollup's tag texts of the requests of `user`.
async fn rolled_tags(app: &TestApp, user: &str) -> Vec<String> {
    let sql = format!(
        "SELECT DISTINCT s.tags FROM spend_days s JOIN users u ON u.id = s.user_id
         WHERE u.username = '{user}' ORDER BY 1"
    );
    match app.db().postgres() {
        Some(pg) => sqlx::query_scalar(&sql).fetch_all(&pg.pool).await.unwrap(),
        None => sqlx::query_scalar(&sql)
            .fetch_all(&app.db().sqlite().read)
            .await
            .unwrap(),
    }
}

#[tokio::test]
async fn another_teams_flood_of_header_values_moves_no_admin_tag_nor_header_value_to_other() {
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = BOUND).await;
    team(&app, "core", Some("cc:42")).await;
    team(&app, "flood", None).await;
    team(&app, "third", None).await;
    let ana = member(&app, "core", "ana", "1").await;
    let bo = member(&app, "flood", "bo", "1").await;
    let cy = member(&app, "third", "cy", "1").await;
    // After midnight, one team sends more values of `cc` than the bound …
    for i in 0..2 * BOUND {
        assert_eq!(tagged(&app, &bo, &format!("cc:x{i}")).await, 200);
    }
    // … and neither another team's admin-set `cc:42` nor its own header value moves.
    assert_eq!(app.chat(&ana, &chat_body(16)).await.status(), 200);
    assert_eq!(tagged(&app, &cy, "cc:y").await, 200);
    app.wait_for_log_rows(i64::from(2 * BOUND) + 2).await;
    assert_eq!(rolled_tags(&app, "ana").await, ["cc:42"]);
    assert_eq!(rolled_tags(&app, "cy").await, ["cc:y"]);
    // The flooding team's own values are bounded.
    let bos = rolled_tags(&app, "bo").await;
    assert_eq!(bos.len(), BOUND as usize + 1, "{bos:?}");
    assert!(bos.contains(&"cc:(other)".to_string()), "{bos:?}");
}

#[tokio::test]
async fn refused_requests_admit_no_tag_values() {
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = BOUND).await;
    team(&app, "core", None).await;
    let ana = member(&app, "core", "ana", "1").await;
    let broke = member(&app, "core", "bo", "0").await;
    // A token that can spend nothing sends more values than the bound: each is refused
    // (429, charged 0) and logged with its tags …
    for i in 0..2 * BOUND {
        assert_eq!(tagged(&app, &broke, &format!("proj:z{i}")).await, 429);
    }
    // … and its team's paying request still gets its value's own row.
    assert_eq!(tagged(&app, &ana, "proj:real").await, 200);
    app.wait_for_log_rows(i64::from(2 * BOUND) + 1).await;
    assert_eq!(rolled_tags(&app, "ana").await, ["proj:real"]);
    // Its own rows roll up: as `proj:(other)`, or as `(other):(other)` where no paying
    // request had admitted the key `proj` yet (on SQLite, row by row).
    let bos = rolled_tags(&app, "bo").await;
    assert!(
        bos.iter()
            .all(|t| t == "proj:(other)" || t == "(other):(other)"),
        "{bos:?}"
    );
    let total = app
        .scalar("SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM requests")
        .await;
    let rolled = app
        .scalar("SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM spend_days")
        .await;
    assert_eq!(rolled, total);
}

/// The admitted tag texts of the day (`spend_tag_sets`), every tenant's.
async fn sets(app: &TestApp) -> i64 {
    app.scalar("SELECT COUNT(*) FROM spend_tag_sets").await
}

/// Two keys whose values each stay within their bounds still combine: `a:v<i%4>,b:v<i/4>`
/// is 16 texts, a rollup row each. Past `[finance] max_tag_sets_per_day` texts a day for
/// the team, a new one rolls up (to `a:(other),b:(other)` where that text holds a place,
/// else to `(other):(other)`), and spend by either key still sums to the total, which is the
/// ledger's; a request that costs nothing takes no place (s24 attack, finance F1).
#[tokio::test]
async fn combinations_of_admitted_tag_values_past_the_bound_roll_up_and_still_sum() {
    const SETS: u32 = 5;
    let app = spawn_app_with(|s, _| s.finance.max_tag_sets_per_day = SETS).await;
    team(&app, "core", None).await;
    let ana = member(&app, "core", "ana", "1").await;
    let broke = member(&app, "core", "bo", "0").await;
    // Two texts admit the values v0 and v1 of both keys …
    for tags in ["a:v0,b:v0", "a:v1,b:v1"] {
        assert_eq!(tagged(&app, &ana, tags).await, 200);
    }
    app.wait_for_log_rows(2).await;
    // … and a request charged nothing, with a new text of them, takes no place: with no
    // `a:(other),b:(other)` admitted, its pairs roll up to `(other):(other)`.
    assert_eq!(tagged(&app, &broke, "a:v0,b:v1").await, 429);
    app.wait_for_log_rows(3).await;
    assert_eq!(rolled_tags(&app, "bo").await, ["(other):(other)"]);
    assert_eq!(sets(&app).await, 2, "the $0 request admitted a text");

    // The flood: every combination of four values of each key.
    for i in 0..16 {
        let tags = format!("a:v{},b:v{}", i % 4, i / 4);
        assert_eq!(tagged(&app, &ana, &tags).await, 200, "{tags}");
    }
    app.wait_for_log_rows(19).await;
    // The team's rows of the day: its SETS admitted texts, ana's `a:(other),b:(other)` —
    // the rolled form has a room of its own, or it could never take a place, being tried
    // only once the day is full (s25 attack on the day's diff, #4: it went to
    // `(other):(other)`, and both keys read `(untagged)`) — and bo's `(other):(other)` (one
    // user, one model, one upstream each): not 17.
    let texts = rolled_tags(&app, "ana").await;
    assert_eq!(texts.len(), SETS as usize + 1, "{texts:?}");
    assert!(
        texts.contains(&"a:(other),b:(other)".to_string()),
        "{texts:?}"
    );
    assert!(!texts.contains(&"(other):(other)".to_string()), "{texts:?}");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM spend_days").await,
        i64::from(SETS) + 2
    );
    assert_eq!(sets(&app).await, i64::from(SETS) + 1);
    assert_eq!(
        app.scalar("SELECT COUNT(DISTINCT tags) FROM requests")
            .await,
        16,
        "the request rows keep their exact tags"
    );

    // Spend by either key sums to the total and the ledger; the months equal their days.
    make_login(&app, "root", "admin", None).await;
    let root = login(&app, "root").await;
    let today = Utc::now().date_naive();
    let range = format!("from={today}&to={}", today + chrono::Duration::days(1));
    let ledger = app
        .scalar(
            "SELECT CAST(SUM(amount_micros) AS BIGINT) FROM ledger WHERE kind IN ('reserve', 'settle', 'absorbed')",
        )
        .await;
    assert!(ledger > 0);
    for key in ["a", "b"] {
        let (s, v) = root
            .get_json(&format!(
                "/admin/api/v1/reports/spend?{range}&group_by=tag:{key}"
            ))
            .await;
        assert_eq!(s, 200, "{v}");
        let rows = v["rows"].as_array().unwrap();
        let sum = |f: &str| -> i64 { rows.iter().map(|r| r[f].as_i64().unwrap()).sum() };
        assert_eq!(
            sum("spend_micros"),
            v["total_micros"].as_i64().unwrap(),
            "{v}"
        );
        assert_eq!(sum("spend_micros"), ledger, "{key}: {v}");
        assert_eq!(sum("requests"), 19, "{key}: {v}");
        // Only bo's refused request is untagged for either key; ana's rolled requests
        // keep their key, as `(other)`.
        let untagged = rows
            .iter()
            .find(|r| r["keys"][0] == "(untagged)")
            .map_or(0, |r| r["requests"].as_i64().unwrap());
        assert_eq!(untagged, 1, "{key}: {v}");
    }
    let months = app
        .scalar("SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM spend_months")
        .await;
    assert_eq!(months, ledger, "the months are their days' sum");
    app.assert_invariant().await;
}
