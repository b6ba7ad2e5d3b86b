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
/// A refusal is decided on the read pool when it can be (a flood of throttled attempts
/// never takes the write lock the money path shares); an admission only under the lock.
pub async fn admit(
    read: &SqlitePool,
    write: &SqlitePool,
    username: &str,
    address: &str,
    now: DateTime<Utc>,
) -> Result<Admission, StoreError> {
    let keys = [
        (format!("user:{username}"), USER_LIMIT),
        (format!("addr:{address}"), ADDR_LIMIT),
    ];
    // A stale read can only under-count, which the locked check below corrects.
    if let Some(refused) = over_limit(&mut *read.acquire().await?, &keys, now).await? {
        return Ok(refused);
    }
    let mut tx = write.begin_with("BEGIN IMMEDIATE").await?;
    if let Some(refused) = over_limit(&mut tx, &keys, now).await? {
        tx.rollback().await?;
        return Ok(refused);
    }
    let mut rows = Vec::with_capacity(keys.len());
    for (key, _) in &keys {
        rows.push(sessions::record_attempt(&mut tx, key, now).await?);
    }
    tx.commit().await?;
    Ok(Admission::Admitted(Attempt { rows }))
}

/// `Refused` when any key has its limit of attempts within the window.
async fn over_limit(
    conn: &mut SqliteConnection,
    keys: &[(String, usize)],
    now: DateTime<Utc>,
) -> Result<Option<Admission>, StoreError> {
    let mut wait_ms = 0i64;
    for (key, limit) in keys {
        let recent = sessions::recent_attempts(conn, key, now - WINDOW, *limit).await?;
        if recent.len() >= *limit {
            let pivot = recent
                .last()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.with_timezone(&Utc));
            wait_ms = wait_ms.max((pivot + WINDOW - now).num_milliseconds().max(1));
        }
    }
    Ok((wait_ms > 0).then(|| Admission::Refused {
        retry_after: (wait_ms as u64).div_ceil(1000).max(1),
    }))
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
