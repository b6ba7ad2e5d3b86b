//! Admin sessions. The cookie carries a random 256-bit id; the database keeps only its
//! SHA-256, so replicas share sessions and a database copy cannot be replayed. A session ends
//! at logout, after `IDLE` without use, `ABSOLUTE` after login, when its owner is disabled,
//! and when its owner's password changes. A login always starts a new id (no fixation).

use actix_web::cookie::{Cookie, SameSite};
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::store::sessions::{self, AdminRow};
use crate::store::{Db, StoreError};

pub const IDLE: Duration = Duration::minutes(30);
pub const ABSOLUTE: Duration = Duration::hours(12);
/// `last_seen_at` is written at most this often, so browsing is not a stream of writes.
const TOUCH_EVERY: Duration = Duration::seconds(60);
/// How far a session's stamp may be ahead of the clock that judges it (the same clock that
/// wrote it) before the session is taken as stamped by a clock since stepped back.
const AHEAD: Duration = Duration::seconds(60);

/// Cookie names: the `__Host-` prefix (Secure, Path=/, no Domain) behind https.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-sluice_session"
    } else {
        "sluice_session"
    }
}

pub fn login_cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-sluice_login"
    } else {
        "sluice_login"
    }
}

/// Whether cookies must be `Secure` (the gateway is reached over https).
pub fn secure(public_url: &str) -> bool {
    public_url.to_ascii_lowercase().starts_with("https://")
}

/// A fresh random secret (session id or pre-session value), 64 hex characters.
pub fn new_secret() -> String {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    hex::encode(raw)
}

pub fn id_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

pub fn cookie(name: &'static str, value: String, secure: bool) -> Cookie<'static> {
    Cookie::build(name, value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .finish()
}

/// A cookie that tells the browser to forget `name`.
pub fn removal(name: &'static str, secure: bool) -> Cookie<'static> {
    let mut c = cookie(name, String::new(), secure);
    c.make_removal();
    c
}

/// The session's owner, if the id names a live session; an expired one is deleted.
pub async fn load(db: &Db, id: &str, now: DateTime<Utc>) -> Result<Option<AdminRow>, StoreError> {
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let hash = id_hash(id);
    let Some(s) = sessions::find_session(db, &hash).await? else {
        return Ok(None);
    };
    let parse = |t: &str| DateTime::parse_from_rfc3339(t).map(|d| d.with_timezone(&Utc));
    let (Ok(created), Ok(seen)) = (parse(&s.created_at), parse(&s.last_seen_at)) else {
        return Ok(None);
    };
    // Judged by the clock that stamped it: the database's on PostgreSQL (`SessionRow::now`).
    let now = match s.now.as_deref().map(parse) {
        Some(Ok(store)) => store,
        Some(Err(_)) => return Ok(None),
        None => now,
    };
    // A stamp ahead of that clock: it stepped back since (a host's, on SQLite), and the
    // session would outlive both its bounds by the step — ended (s30 identity attack F2).
    let ahead = seen - now > AHEAD || created - now > AHEAD;
    if s.admin.disabled || ahead || now - seen > IDLE || now - created > ABSOLUTE {
        let mut tx = db.begin().await?;
        sessions::delete_session(&mut tx, &hash).await?;
        tx.commit().await?;
        return Ok(None);
    }
    if now - seen > TOUCH_EVERY {
        sessions::touch_session(db, &hash, now).await?;
    }
    Ok(Some(s.admin))
}
