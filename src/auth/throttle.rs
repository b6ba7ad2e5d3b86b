//! The guessing throttle for admin passwords, shared by the sign-in form and the password
//! change (a wrong current password is a guess like any other).
//!
//! Every attempt that will verify a password is first *admitted*: in one `BEGIN IMMEDIATE`
//! transaction the attempts of the last `WINDOW` are counted for `user:<name>` and
//! `addr:<peer ip>`, and only when both are under their limit is this attempt recorded
//! under both keys. The check and the record are one write transaction, and SQLite lets one
//! writer in at a time — among this process's connections and among processes sharing the
//! file — so N attempts at once are admitted exactly up to the limit, never all of them.
//! A refusal records nothing (a flood of refused attempts does not prolong the wait).
//!
//! An admitted attempt counts as a failure unless it is withdrawn: when the password was
//! right, or when it was never evaluated (hashing busy). Withdrawing deletes only that
//! attempt's own rows, so a success never clears anyone else's count — not the guesses
//! an attacker made at the same name, not the address's.

use chrono::{DateTime, Duration, Utc};
use sqlx::{SqliteConnection, SqlitePool};

use crate::store::sessions;
use crate::store::StoreError;

/// Attempts per username within `WINDOW`.
pub const USER_LIMIT: usize = 5;
/// Attempts per peer address within `WINDOW` (spraying one password over many names).
pub const ADDR_LIMIT: usize = 20;
pub const WINDOW: Duration = Duration::minutes(15);

/// An admitted attempt: its rows in `login_failures`, which count until withdrawn.
#[must_use = "an attempt counts as a failure unless withdrawn"]
pub struct Attempt {
    rows: Vec<i64>,
}

pub enum Admission {
    Admitted(Attempt),
    /// Over a limit: come back in `retry_after` seconds (when the limit-th most recent
    /// attempt leaves the window).
    Refused {
        retry_after: u64,
    },
}

/// Admits one attempt for `username` from `address`, or refuses it (see the module doc).
pub async fn admit(
    write: &SqlitePool,
    username: &str,
    address: &str,
    now: DateTime<Utc>,
) -> Result<Admission, StoreError> {
    let keys = [
        (format!("user:{username}"), USER_LIMIT),
        (format!("addr:{address}"), ADDR_LIMIT),
    ];
    let mut tx = write.begin_with("BEGIN IMMEDIATE").await?;
    let mut wait_ms = 0i64;
    for (key, limit) in &keys {
        let recent = sessions::recent_attempts(&mut tx, key, now - WINDOW, *limit).await?;
        if recent.len() >= *limit {
            let pivot = recent
                .last()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.with_timezone(&Utc));
            wait_ms = wait_ms.max((pivot + WINDOW - now).num_milliseconds().max(1));
        }
    }
    if wait_ms > 0 {
        tx.rollback().await?;
        return Ok(Admission::Refused {
            retry_after: (wait_ms as u64).div_ceil(1000).max(1),
        });
    }
    let mut rows = Vec::with_capacity(keys.len());
    for (key, _) in &keys {
        rows.push(sessions::record_attempt(&mut tx, key, now).await?);
    }
    tx.commit().await?;
    Ok(Admission::Admitted(Attempt { rows }))
}

impl Attempt {
    /// The attempt no longer counts (right password), inside the caller's transaction.
    pub async fn withdraw(self, conn: &mut SqliteConnection) -> Result<(), StoreError> {
        sessions::delete_attempts(conn, &self.rows).await
    }

    /// The attempt no longer counts because it was never evaluated (hashing busy).
    pub async fn withdraw_now(self, write: &SqlitePool) -> Result<(), StoreError> {
        let mut conn = write.acquire().await?;
        self.withdraw(&mut conn).await
    }
}
