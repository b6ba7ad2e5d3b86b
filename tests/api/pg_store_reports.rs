//! Reports on PostgreSQL give SQLite's answers (issue 17): every grouping and scope over
//! whole days (read from the spend-by-day rollup), ragged edges and non-time bounds, the
//! request log's filters, and the audit filter's ASCII-only case folding.

use sluice::store;
use sluice::store::reports::{GroupBy, RequestFilter};

use crate::pg_store::{at, both, populate, request_rows, same};
use crate::{pool_write_both, read_both};

#[tokio::test]
async fn reports_give_the_same_answers_for_every_grouping() {
    let b = both().await;
    populate(&b).await;
    let rows = request_rows();
    let (l, p) = pool_write_both!(b, requests::insert_batch(&rows));
    l.unwrap();
    p.unwrap();
    // A batch written twice (a retried write) adds nothing to the spend by day.
    let (l, p) = pool_write_both!(b, requests::insert_batch(&rows[..20]));
    l.unwrap();
    p.unwrap();
    let day = |d: i64, h: u32| sluice::clock::db_time(at(h, 0) + chrono::Duration::days(d));
    // Whole days only, partial edges around whole days, partial days only, within one
    // day, and bounds that are not database times (read from the request log alone).
    let ranges = [
        (day(0, 3), day(1, 23)),
        (day(0, 0), day(3, 0)),
        (day(-1, 0), day(2, 0)),
        (day(0, 3), day(2, 5)),
        (day(0, 23), day(2, 1)),
        (day(1, 2), day(1, 9)),
        (day(2, 0), day(2, 0)),
        ("2026-03-14".to_string(), "2026-03-16".to_string()),
        (String::new(), "9".to_string()),
    ];
    for scope in [None, Some(1), Some(2)] {
        for (from, to) in &ranges {
            same("totals", read_both!(b, reports::totals(scope, from)));
            same(
                "top_tokens",
                read_both!(b, reports::top_tokens(scope, from, 2)),
            );
            for by in GroupBy::ALL {
                let spend = same("spend", read_both!(b, reports::spend(scope, by, from, to)));
                if scope.is_none() && from == &day(0, 0) {
                    assert!(!spend.is_empty(), "{by:?} has rows");
                }
            }
        }
    }
    // Whole days are read from the rollup (a change there shows in the report), and a
    // rollup rebuilt from the log is the one kept on write.
    let whole = |pool| {
        let (from, to) = (day(0, 0), day(3, 0));
        async move {
            store::pg_rest::reports::spend(pool, None, GroupBy::Team, &from, &to)
                .await
                .unwrap()
        }
    };
    let kept: Vec<(String, Option<i64>, i64)> =
        sqlx::query_as("SELECT day, token_id, cost_micros FROM request_days ORDER BY 1, 2, 3")
            .fetch_all(&b.pg)
            .await
            .unwrap();
    let before = whole(&b.pg).await;
    sqlx::query("UPDATE request_days SET cost_micros = cost_micros + 1")
        .execute(&b.pg)
        .await
        .unwrap();
    assert_ne!(
        format!("{before:?}"),
        format!("{:?}", whole(&b.pg).await),
        "whole days come from request_days"
    );
    let mut conn = b.pg.acquire().await.unwrap();
    store::pg_rest::requests::rebuild_days(&mut conn)
        .await
        .unwrap();
    let rebuilt: Vec<(String, Option<i64>, i64)> =
        sqlx::query_as("SELECT day, token_id, cost_micros FROM request_days ORDER BY 1, 2, 3")
            .fetch_all(&b.pg)
            .await
            .unwrap();
    assert_eq!(kept, rebuilt);
    assert_eq!(format!("{before:?}"), format!("{:?}", whole(&b.pg).await));
    drop(conn);
    let days = same(
        "spend by day",
        read_both!(b, reports::spend(None, GroupBy::Day, "", "9")),
    );
    assert_eq!(
        days.iter().map(|d| d.label.as_str()).collect::<Vec<_>>(),
        ["2026-03-14", "2026-03-15", "2026-03-16"]
    );
    let filters = [
        RequestFilter::default(),
        RequestFilter {
            team_id: Some(1),
            ..Default::default()
        },
        RequestFilter {
            token_id: Some(2),
            user_id: Some(2),
            ..Default::default()
        },
        RequestFilter {
            model: Some("gpt-4o-mini".into()),
            ..Default::default()
        },
        RequestFilter {
            model: Some("gpt-4o-mini-2024".into()),
            ..Default::default()
        },
        RequestFilter {
            status: Some((4, true)),
            ..Default::default()
        },
        RequestFilter {
            status: Some((502, false)),
            from: Some(day(0, 3)),
            to: Some(day(1, 23)),
            ..Default::default()
        },
    ];
    for f in &filters {
        for (limit, offset) in [(10, 0), (10, 10), (100, 55)] {
            same(
                "requests",
                read_both!(b, reports::requests(f, limit, offset)),
            );
        }
    }
    b.lite.close().await;
}

#[tokio::test]
async fn the_audit_filter_ignores_ascii_case_only_as_sqlite_like_does() {
    let b = both().await;
    let now = at(10, 0);
    for action in [
        "token.revoke",
        "TOKEN.issue",
        "tokens.x",
        "a_b",
        "axb",
        "50%",
        "500",
        "émile.x",
        "Émile.y",
        "back\\slash",
    ] {
        let e = store::audit::AuditEntry {
            actor: "root",
            address: "",
            action,
            target: "t",
            before: None,
            after: None,
        };
        store::audit::record(&b.lite.write, &e, now).await.unwrap();
        store::pg_rest::audit::record(&b.pg, &b.lite.audit, &e, now)
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    for filter in [
        "token.", "Token.", "TOKEN", "a_", "50%", "é", "É", "back\\", "x",
    ] {
        let rows = same(
            "audit",
            read_both!(b, reports::audit(Some(filter), None, 50, 0)),
        );
        seen.push((
            filter,
            rows.iter().map(|r| r.action.clone()).collect::<Vec<_>>(),
        ));
    }
    let expect = |f: &str| seen.iter().find(|(g, _)| *g == f).unwrap().1.clone();
    assert_eq!(
        expect("Token."),
        ["TOKEN.issue", "token.revoke"],
        "ASCII case ignored"
    );
    assert_eq!(expect("a_"), ["a_b"], "`_` is not a wildcard");
    assert_eq!(expect("50%"), ["50%"], "`%` is not a wildcard");
    assert_eq!(
        expect("é"),
        ["émile.x"],
        "non-ASCII case is not folded (SQLite's LIKE)"
    );
    assert_eq!(expect("back\\"), ["back\\slash"]);
    same(
        "audit by actor",
        read_both!(b, reports::audit(None, Some("root"), 3, 2)),
    );
    same(
        "audit by another actor",
        read_both!(b, reports::audit(None, Some("Root"), 3, 0)),
    );
    b.lite.close().await;
}
