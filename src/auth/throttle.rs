//! The guessing throttle for admin passwords, shared by the sign-in form and the password
//! change (a wrong current password is a guess like any other).
//!
//! Every attempt that will verify a password is first *admitted*: in one `BEGIN IMMEDIATE`
//! transaction the attempts of the last `WINDOW` are counted for `user:<name>` and
//! `addr:<peer ip>` (an IPv6 peer's /64), and only when both are under their limit is this
//! attempt recorded under both keys. The check and the record are one write transaction,
//! and SQLite lets one writer in at a time — among this process's connections and among
//! processes sharing the file — so N attempts at once are admitted exactly up to the
//! limit, never all of them.
//! A refusal records nothing (a flood of refused attempts does not prolong the wait).
//!
//! Clocks: every process stamps attempts with its own clock, and an attempt counts from
//! its stamp until the stamp plus `WINDOW` — also when the stamp is in the future (a
//! process whose clock runs ahead, or this host's before it stepped back): a lock is never
//! shortened by a clock, and `Retry-After` says how long it really lasts, which may be
//! more than a window. Old rows are swept only when they are both a day old by the
//! sweeper's clock and far down the table (`sessions::record_attempt`), so a process whose
//! clock runs a day ahead cannot sweep the attempts other processes still count.
//!
//! An admitted attempt counts as a failure unless it is withdrawn: when the password was
//! right, or when it was never evaluated (hashing busy). Withdrawing deletes only that
//! attempt's own rows, so a success never clears anyone else's count — not the guesses
//! an attacker made at the same name, not the address's.

use std::net::{IpAddr, Ipv6Addr};

use chrono::{DateTime, Duration, Utc};

use crate::clock::Clock;
use crate::store::audit::AuditKeys;
use crate::store::sessions;
use crate::store::{Db, StoreError, Tx};

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
/// The time is read again once the lock is held: attempts admitted while this one waited
/// for it are stamped later than a time read before, and a wait computed from that older
/// time would be longer than the lock really is.
pub async fn admit(
    db: &Db,
    username: &str,
    address: &str,
    clock: &dyn Clock,
) -> Result<Admission, StoreError> {
    let keys = [
        (name_key(&db.audit, username), USER_LIMIT),
        (format!("addr:{}", network(address)), ADDR_LIMIT),
    ];
    // A stale read can only under-count, which the locked check below corrects.
    let mut snapshot = db.begin_read().await?;
    let refused = over_limit(&mut snapshot, &keys, clock.now()).await?;
    drop(snapshot);
    if let Some(refused) = refused {
        return Ok(refused);
    }
    let mut tx = db.begin().await?;
    let now = clock.now();
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

/// Single sign-on refusals per peer address within `WINDOW` (identities the provider
/// vouches for that Sluice refuses, tokens failing their checks).
pub const SSO_REFUSALS: usize = 20;

/// Whether single sign-on callbacks from `address` are held back: `Some(retry_after)` once
/// its refusals reached `SSO_REFUSALS` within the window. Decided on the read pool, before
/// the provider is asked anything: an outsider with an account at a provider anyone may
/// join (a Google "External" client, GitLab.com) could otherwise script sign-ins, each
/// refused one a permanent audit row and a take of the write lock the money path shares
/// (s30 identity attack F3). Successful sign-ins count nothing.
pub async fn sso_held(
    db: &Db,
    address: &str,
    now: DateTime<Utc>,
) -> Result<Option<u64>, StoreError> {
    let keys = [(sso_key(address), SSO_REFUSALS)];
    let mut snapshot = db.begin_read().await?;
    Ok(match over_limit(&mut snapshot, &keys, now).await? {
        Some(Admission::Refused { retry_after }) => Some(retry_after),
        _ => None,
    })
}

/// Counts one single sign-on refusal from `address`, in the transaction that audits it.
pub async fn sso_refused(tx: &mut Tx, address: &str, now: DateTime<Utc>) -> Result<(), StoreError> {
    sessions::record_attempt(tx, &sso_key(address), now).await?;
    Ok(())
}

fn sso_key(address: &str) -> String {
    format!("sso:{}", network(address))
}

/// The key a name's attempts are counted under: its MAC, never the typed text — the
/// name field sometimes gets a password or a token pasted into it.
fn name_key(keys: &AuditKeys, username: &str) -> String {
    format!("user:{}", keys.name_mac(username))
}

/// Lifts the per-name lock on `username` (the operator's way back in when someone keeps
/// guessing at the name: `sluice admin unlock`, `reset-password`): every attempt counted at
/// the name is forgotten; the guessers' addresses keep theirs — except attempts stamped
/// after `now`, at any key: a clock that ran ahead stamped them, and the locks they make
/// last as long as it ran ahead (an address's too: the office's, or a proxy's). Returns how
/// many.
pub async fn unlock_name(
    (tx, keys): (&mut Tx, &AuditKeys),
    username: &str,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let name = sessions::delete_attempts_of(tx, &name_key(keys, username)).await?;
    Ok(name + sessions::delete_attempts_after(tx, now).await?)
}

/// The address an attempt is counted under: an IPv4 address itself, an IPv6 address's /64
/// (one subscriber's network: whoever holds one holds 2^64 addresses to rotate through).
fn network(address: &str) -> String {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        },
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Err(_) => address.to_string(),
    }
}

/// `Refused` when any key has its limit of attempts within the window.
async fn over_limit(
    tx: &mut Tx,
    keys: &[(String, usize)],
    now: DateTime<Utc>,
) -> Result<Option<Admission>, StoreError> {
    let mut wait_ms = 0i64;
    for (key, limit) in keys {
        let recent = sessions::recent_attempts(tx, key, now - WINDOW, *limit).await?;
        if recent.len() >= *limit {
            let pivot = recent
                .last()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.with_timezone(&Utc));
            // The wait is what the attempts say, even past one window: an attempt stamped
            // by a clock that ran ahead (another process's, or this host's before a step
            // back) counts until its own time plus the window, so a shorter answer would
            // send the client back to be refused again. A lock is never shortened by a
            // clock; `sluice admin unlock` lifts one a bad clock made too long.
            let left = (pivot + WINDOW - now).num_milliseconds();
            wait_ms = wait_ms.max(left.max(1));
        }
    }
    Ok((wait_ms > 0).then(|| Admission::Refused {
        retry_after: (wait_ms as u64).div_ceil(1000).max(1),
    }))
}

impl Attempt {
    /// The attempt no longer counts (right password), inside the caller's transaction.
    pub async fn withdraw(self, tx: &mut Tx) -> Result<(), StoreError> {
        sessions::delete_attempts(tx, &self.rows).await
    }

    /// The attempt no longer counts because it was never evaluated (hashing busy).
    pub async fn withdraw_now(self, db: &Db) -> Result<(), StoreError> {
        let mut tx = db.begin().await?;
        self.withdraw(&mut tx).await?;
        tx.commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::Db;

    async fn admitted(db: &Db, user: &str, addr: &str, now: DateTime<Utc>) -> Option<Attempt> {
        match admit(db, user, addr, &ManualClock::new(now)).await.unwrap() {
            Admission::Admitted(a) => Some(a),
            Admission::Refused { .. } => None,
        }
    }

    #[tokio::test]
    async fn limits_per_name_and_address_withdrawal_and_the_longest_wait() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
        let now = Utc::now();
        // Five attempts stamped a second ahead (another process's clock, or a `now` read
        // before the lock): the sixth is refused until they leave the window, a window and
        // that second.
        let mut kept = Vec::new();
        for _ in 0..USER_LIMIT {
            kept.push(admitted(&db, "root", "10.0.0.1", now + Duration::seconds(1)).await);
        }
        assert!(kept.iter().all(Option::is_some));
        match admit(&db, "root", "10.0.0.2", &ManualClock::new(now))
            .await
            .unwrap()
        {
            Admission::Refused { retry_after } => assert_eq!(retry_after, 901),
            Admission::Admitted(_) => panic!("a sixth attempt at one name"),
        }
        // Withdrawing one attempt (a right password) frees exactly one place.
        let mut tx = db.begin().await.unwrap();
        kept.pop()
            .flatten()
            .unwrap()
            .withdraw(&mut tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert!(admitted(&db, "root", "10.0.0.3", now).await.is_some());
        assert!(admitted(&db, "root", "10.0.0.3", now).await.is_none());
        // The address: 20 attempts over any names (4 of root's still count), then nothing.
        for i in 0..ADDR_LIMIT - (USER_LIMIT - 1) {
            let user = format!("u{i}");
            assert!(admitted(&db, &user, "10.0.0.1", now).await.is_some(), "{i}");
        }
        assert!(admitted(&db, "someone", "10.0.0.1", now).await.is_none());
        assert!(admitted(&db, "someone", "10.0.0.9", now).await.is_some());
        // IPv6: one /64 is one address, however its last 64 bits rotate.
        for i in 0..ADDR_LIMIT {
            let addr = format!("2001:db8:1:2::{:x}", i + 1);
            assert!(admitted(&db, &format!("v{i}"), &addr, now).await.is_some());
        }
        assert!(admitted(&db, "v-next", "2001:db8:1:2:ffff::1", now)
            .await
            .is_none());
        assert!(admitted(&db, "v-next", "2001:db8:1:3::1", now)
            .await
            .is_some());
        assert_eq!(network("::ffff:10.0.0.1"), "10.0.0.1");
        // After the window, the name is free again.
        let later = now + WINDOW + Duration::seconds(2);
        assert!(admitted(&db, "root", "10.0.0.4", later).await.is_some());
    }
}
