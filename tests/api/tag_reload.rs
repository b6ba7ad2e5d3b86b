//! SIGHUP applies the config file's `[finance]` tag bounds (`store::tag_bound`: values,
//! keys and texts per day) at once, without a restart and without naming `finance` as a
//! section that waits for one; two quick SIGHUPs leave the newest file's bounds, not the
//! older one's.

use std::time::{Duration, Instant};

use crate::gateway_proc::{open_dir_db, start_gateway_full, write_config, Gateway};
use crate::helpers::*;
use crate::pg_gateway_app::Engine;

fn hup(g: &Gateway) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &g.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn bounds(values: u32, keys: u32) -> String {
    // The bound on tag texts moves with the keys' (one more), so each step changes all three.
    let sets = keys + 1;
    format!(
        "[finance]\nmax_tag_values_per_day = {values}\nmax_tag_keys_per_day = {keys}\n\
         max_tag_sets_per_day = {sets}\n"
    )
}

/// Waits until the stored bounds are (values, keys, keys + 1 sets).
async fn until_bound(db: &sluice::store::Db, values: i64, keys: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = (
            scalar_on(db, "SELECT max_values FROM spend_tag_bound").await,
            scalar_on(db, "SELECT max_keys FROM spend_tag_bound").await,
            scalar_on(db, "SELECT max_sets FROM spend_tag_bound").await,
        );
        if now == (values, keys, keys + 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP never applied the bounds ({values}, {keys}, {}): still {now:?}",
            keys + 1
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sighup_applies_the_newest_files_tag_bounds() {
    let app = spawn_app().await;
    let dir = app.dir.path();
    if test_engine() == Engine::Postgres {
        std::fs::write(dir.join("pg-url"), &app.settings.database.url).unwrap();
    }
    let g = start_gateway_full(dir, &app.mock, &[], &bounds(5, 6)).await;
    let port: u16 = g.url.rsplit(':').next().unwrap().parse().unwrap();
    let db = open_dir_db(dir).await;
    until_bound(&db, 5, 6).await;

    write_config(dir, &app.mock, port, &bounds(7, 9));
    hup(&g);
    until_bound(&db, 7, 9).await;
    // The bounds are stored before the reload is logged: wait for the line, not assume it.
    let log = dir.join(format!("gateway-{port}.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("SIGHUP: config reloaded") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the reload was never logged: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !text.contains("finance"),
        "finance named as waiting for a restart: {text}"
    );

    // Two quick SIGHUPs: the newest file's bounds stay.
    write_config(dir, &app.mock, port, &bounds(11, 12));
    hup(&g);
    write_config(dir, &app.mock, port, &bounds(21, 22));
    hup(&g);
    until_bound(&db, 21, 22).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    until_bound(&db, 21, 22).await;
}
