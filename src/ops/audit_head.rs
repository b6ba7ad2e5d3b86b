//! The signed head of the audit chain: its row count, newest row and hash, and when, signed
//! with the audit head subkey, kept outside the database — in `audit.head` in the backup
//! folder and as a JSON log line (target `sluice::audit`, its signature in a domain of its
//! own, so a logged head cannot be written back as the file) — after every audited action.
//! The keyed chain shows an edited or rewritten row; only a head kept elsewhere shows that
//! the newest rows were deleted (`verify`).
//!
//! Writing (`export`): one writer at a time, across processes too, under an advisory lock
//! (`audit.head.lock`); the database is read inside the lock, so a slower writer can never
//! put an older head over a newer one. The file is written to a temporary name (0600),
//! synced, and renamed over the old one. The gateway exports from a task of its own, woken
//! by every signed row (`AuditKeys::wait_appended`), so no admin request waits for the
//! file or its fsync; the CLI exports once after its command.
//!
//! A head is replaced only by one that extends it: when `audit.head` is forged, unreadable
//! or no longer a prefix of the database (rows removed), it is left as it is, the refusal
//! is logged (and raised as an alert by the gateway), and `sluice audit verify` keeps
//! failing until someone looks.
//!
//! A missing file is started afresh only when no head was ever started over this chain:
//! a head is started by first appending an `audit.head_started` row (first start, an
//! upgrade), so once one was, the chain itself says so — and, being in the chain, that row
//! cannot be removed without removing every row after it. A head missing after that is an
//! alarm, never silently re-created: whoever deletes the newest rows and the head together
//! would otherwise get a fresh head over the truncated chain. The operator re-arms after
//! looking (`sluice audit rearm --reason …`: the old head, if any, is kept aside, and a new
//! `audit.head_started` row records who re-armed and why); `sluice restore` does the same.
//!
//! Several hosts (PostgreSQL): each keeps its own head in its own backup folder. A
//! `audit.head_started` row names the head it started (`head_id`: host and folder), and on
//! PostgreSQL only rows naming this head count (`audit::head_started`), so a new host
//! starts its head rather than raising an alarm over another's. Every host's exporter is
//! also woken by the other hosts' appends (`Db::hear_changes`), so each head follows the
//! whole chain.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::clock::{db_time, Clock};
use crate::ops::alerts::Alerter;
use crate::store::audit::{self, AuditEntry, AuditKeys, ChainState};
use crate::store::{Db, StoreError};

pub const FILE: &str = "audit.head";
const LOCK: &str = "audit.head.lock";
/// How long a head export waits for another writer's lock before it fails (and raises
/// `audit_head`): writing a head takes milliseconds, so a longer hold is a hung process.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The actor of the `audit.head_started` row the gateway writes when it starts the first head.
const SYSTEM: &str = "system";

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("audit head in {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("not one row of the audit log is signed with this key: it is not the key the gateway signs with ({} set, unset or changed, or the key file replaced); run the command with the gateway's key — a row and a head signed with another would never verify", crate::secrets::ENV)]
    OtherKey,
}

/// The content of `audit.head` (one JSON object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub rows: i64,
    pub last_id: i64,
    pub last_hash: String,
    pub at: String,
    pub mac: String,
}

impl Head {
    fn text(rows: i64, last_id: i64, last_hash: &str, at: &str) -> String {
        format!("sluice audit head v1\n{rows}\n{last_id}\n{last_hash}\n{at}")
    }

    /// The signature the log line carries: over the same fields in a domain of its own, so
    /// a logged head cannot be written back as `audit.head`. Every head is in the log; if
    /// its lines were valid files, whoever reads the log could delete the newest rows and
    /// put back the head of that time.
    fn log_mac(&self, keys: &AuditKeys) -> String {
        keys.head_mac(&format!(
            "sluice audit head log v1\n{}\n{}\n{}\n{}",
            self.rows, self.last_id, self.last_hash, self.at
        ))
    }

    fn sign(keys: &AuditKeys, rows: i64, last_id: i64, last_hash: String, at: String) -> Head {
        let mac = keys.head_mac(&Head::text(rows, last_id, &last_hash, &at));
        Head {
            rows,
            last_id,
            last_hash,
            at,
            mac,
        }
    }

    fn signed_by(&self, keys: &AuditKeys) -> bool {
        keys.head_mac_ok(
            &Head::text(self.rows, self.last_id, &self.last_hash, &self.at),
            &self.mac,
        )
    }

    fn same_tip(&self, rows: i64, last_id: i64, last_hash: &str) -> bool {
        self.rows == rows && self.last_id == last_id && self.last_hash == last_hash
    }
}

/// What `audit.head` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    Unreadable(String),
    /// Well-formed, but its signature is not the gateway's.
    Forged,
    Valid(Head),
}

/// A head is ~300 bytes; a file far larger is not one (and is not read into memory).
const MAX_LEN: u64 = 4096;

pub fn read(dir: &Path, keys: &AuditKeys) -> Found {
    let mut text = String::new();
    let read = std::fs::File::open(dir.join(FILE))
        .and_then(|f| f.take(MAX_LEN + 1).read_to_string(&mut text));
    match read {
        Ok(n) if n as u64 > MAX_LEN => {
            return Found::Unreadable(format!("larger than {MAX_LEN} bytes"))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Missing,
        Err(e) => return Found::Unreadable(e.to_string()),
    }
    match serde_json::from_str::<Head>(&text) {
        Ok(h) if h.signed_by(keys) => Found::Valid(h),
        Ok(_) => Found::Forged,
        Err(e) => Found::Unreadable(e.to_string()),
    }
}

/// What an export did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exported {
    Unchanged,
    Written(Head),
    /// The file was left as it is; the reason.
    Refused(String),
    /// A new head was started over a chain other heads were started over (PostgreSQL): it
    /// trusts the rows before it as they are, which no earlier head of this host checked;
    /// the head and what to tell the operator.
    Started(Head, String),
}

/// Takes the advisory lock of the head in `dir` (one writer at a time, across processes);
/// held until the file returned is dropped.
async fn lock(dir: &Path) -> Result<std::fs::File, HeadError> {
    let io = |e| HeadError::Io(dir.to_path_buf(), e);
    crate::private_fs::create_dir_all(dir).map_err(io)?;
    crate::private_fs::lock(&dir.join(LOCK), LOCK_WAIT)
        .await
        .map_err(io)
}

/// Why a missing head is not started afresh: the chain says one was started at row `id`.
fn missing_after_start(id: i64, at: &str) -> String {
    format!("audit.head is missing, but row {id} of the audit log says a head was started at {at}: it was deleted (perhaps with the newest rows) or the backup folder moved or changed; once you know why, `sluice audit rearm --reason …` starts a new one")
}

/// Which head a folder holds: this host's head name (`[backup] head_name`, or else its host
/// name) and the folder's path. On PostgreSQL every host keeps its own head in its own
/// folder, and an `audit.head_started` row names the head it started
/// (`audit::head_started`). Both parts must survive a re-creation of the host: under a new
/// name or in a new folder the host starts a new head, as a new host does.
pub fn head_id(name: &str, dir: &Path) -> String {
    let host = if name.is_empty() {
        std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    } else {
        name.to_string()
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    format!("{host}:{}", dir.display())
}

/// Appends the `audit.head_started` row that precedes a head started afresh in `dir`.
async fn mark_start(
    db: &Db,
    dir: &Path,
    name: &str,
    actor: &str,
    why: &str,
    now: DateTime<Utc>,
) -> Result<(), HeadError> {
    let mut tx = db.begin().await?;
    let (rows, last_id, _) = audit::tip(&mut tx).await?;
    let after = serde_json::json!({"rows_before": rows, "last_id_before": last_id, "why": why, "head": head_id(name, dir)})
        .to_string();
    let entry = AuditEntry {
        actor,
        address: "",
        action: audit::HEAD_STARTED,
        target: FILE,
        before: None,
        after: Some(&after),
    };
    audit::append(&mut tx, &entry, now).await?;
    tx.commit().await?;
    Ok(())
}

/// Signs the chain's tip as the database holds it now, logs it and writes it as the file.
async fn write_head(db: &Db, dir: &Path, now: DateTime<Utc>) -> Result<Head, HeadError> {
    let mut snapshot = db.begin_read_after_writes().await?;
    let (rows, last_id, last_hash) = audit::tip(&mut snapshot).await?;
    drop(snapshot);
    let head = Head::sign(&db.audit, rows, last_id, last_hash, db_time(now));
    log(&head, &db.audit, true);
    write_atomically(dir, &head).map_err(|e| HeadError::Io(dir.to_path_buf(), e))?;
    Ok(head)
}

/// Writes the head of the chain as the database holds it now into `dir/audit.head`, if it
/// extends the head already there (see the module doc), and logs it. A missing head is
/// started (after its `audit.head_started` row) only when none was ever started.
pub async fn export(
    db: &Db,
    dir: &Path,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Exported, HeadError> {
    let io = |e| HeadError::Io(dir.to_path_buf(), e);
    let _lock = lock(dir).await?;
    let keys = &db.audit;
    let found = read(dir, keys);
    // The write connection, not a reader: a row's signing wakes the exporter before its
    // transaction commits, and the connection is free only once it has.
    let mut conn = db.begin_read_after_writes().await?;
    let (rows, last_id, last_hash) = audit::tip(&mut conn).await?;
    let id = head_id(name, dir);
    // Other heads' start rows, when this one starts afresh (see the end).
    let mut others = 0;
    let refusal = match &found {
        Found::Valid(h) if h.same_tip(rows, last_id, &last_hash) => return Ok(Exported::Unchanged),
        Found::Valid(h) => (!audit::holds(&mut conn, h.rows, h.last_id, &h.last_hash).await?)
            .then(|| format!("audit.head (row count {}, last row {}) is not a prefix of the database (row count {rows}, last row {last_id}): rows were removed or replaced", h.rows, h.last_id)),
        Found::Missing => match audit::head_started(&mut conn, &id).await? {
            Some((row, at)) => Some(missing_after_start(row, &at)),
            None => {
                others = audit::others_started(&mut conn, &id).await?;
                None
            }
        },
        Found::Forged => Some("audit.head is not signed with this gateway's key".to_string()),
        Found::Unreadable(e) => Some(format!("audit.head is unreadable: {e}")),
    };
    drop(conn);
    if let Some(why) = refusal {
        let head = Head::sign(keys, rows, last_id, last_hash, db_time(now));
        log(&head, keys, false);
        tracing::error!(target: "sluice::audit", dir = %dir.display(), reason = %why, "audit.head left as it is; run `sluice audit verify`");
        return Ok(Exported::Refused(why));
    }
    if found == Found::Missing {
        tracing::info!(target: "sluice::audit", dir = %dir.display(), rows, "starting the audit head: no head was ever started over this audit log");
        mark_start(db, dir, name, SYSTEM, "the first head", now).await?;
        let head = write_head(db, dir, now).await?;
        if others == 0 {
            return Ok(Exported::Written(head));
        }
        // A host new to the chain, or one that lost its head together with its name (a
        // container re-created under a new host name with an empty folder): the head cannot
        // tell them apart, and the second may follow a deletion of the newest rows, which
        // no head then shows (s30 multi-host attack F2). The operator is told of every such
        // trust point.
        let why = format!("a new audit head ({id}) was started over the {rows} rows of the audit log, which {others} other head(s) were started over before: it trusts those rows as they are. Expected when a host is added or its host name or backup folder changed; otherwise this host lost its head and rows may have been removed before it: run `sluice audit verify` on every host");
        tracing::warn!(target: "sluice::audit", dir = %dir.display(), rows, others, "{why}");
        return Ok(Exported::Started(head, why));
    }
    let head = Head::sign(keys, rows, last_id, last_hash, db_time(now));
    log(&head, keys, true);
    write_atomically(dir, &head).map_err(io)?;
    Ok(Exported::Written(head))
}

/// What `rearm` did: where the head it replaced is kept, and the new head.
#[derive(Debug)]
pub struct Rearmed {
    pub kept: Option<PathBuf>,
    pub head: Head,
}

/// Starts a new head over the chain as it is now, whatever `audit.head` holds: the
/// operator's way back after looking into a missing, forged or mismatched head (`sluice
/// audit rearm`), and `sluice restore`'s (the restored database is older than the head).
/// The file there, if any, is kept aside as `audit.head.<aside>-<time>` (the evidence), and
/// an `audit.head_started` row records `actor` and `why` in the chain before the new head.
pub async fn rearm(
    db: &Db,
    dir: &Path,
    name: &str,
    now: DateTime<Utc>,
    actor: &str,
    why: &str,
    aside: &str,
) -> Result<Rearmed, HeadError> {
    let _lock = lock(dir).await?;
    // Under another key the new row and head would be signed without the log's key, for
    // good: refused before anything is moved or written.
    if audit::signed_with(db, &db.audit).await? == Some(false) {
        return Err(HeadError::OtherKey);
    }
    let kept = set_aside(dir, aside, now).map_err(|e| HeadError::Io(dir.to_path_buf(), e))?;
    mark_start(db, dir, name, actor, why, now).await?;
    let head = write_head(db, dir, now).await?;
    tracing::warn!(target: "sluice::audit", dir = %dir.display(), actor, why, kept = ?kept, "audit head re-armed");
    Ok(Rearmed { kept, head })
}

/// Signs the head again under the new master key after `sluice secrets rotate` (`db` is
/// opened under it): the chain was verified, with this head, under the old key just
/// before it was signed again, so the head is rewritten over the chain as it is now. A
/// log no head was ever started over gets its `audit.head_started` row first, as at a
/// gateway's first start (a head missing later is then an alarm).
pub async fn resign(
    db: &Db,
    dir: &Path,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Head, HeadError> {
    let _lock = lock(dir).await?;
    let mut conn = db.begin_read_after_writes().await?;
    let started = audit::head_started(&mut conn, &head_id(name, dir)).await?;
    drop(conn);
    if started.is_none() {
        mark_start(
            db,
            dir,
            name,
            SYSTEM,
            "the first head, at `sluice secrets rotate`",
            now,
        )
        .await?;
    }
    write_head(db, dir, now).await
}

/// The head as a structured log line: no secret in it (its `mac` is a signature in the
/// log's own domain, `Head::log_mac`).
fn log(h: &Head, keys: &AuditKeys, file_written: bool) {
    let mac = h.log_mac(keys);
    tracing::info!(target: "sluice::audit", rows = h.rows, last_id = h.last_id, last_hash = %h.last_hash, at = %h.at, mac = %mac, file_written, "audit head");
}

fn write_atomically(dir: &Path, head: &Head) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{FILE}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut text = serde_json::to_string(head).map_err(std::io::Error::other)?;
    text.push('\n');
    // Off the request path (the exporter's task or the CLI's end), so the sync is fine.
    crate::private_fs::publish_file(&tmp, text.as_bytes(), |tmp| {
        std::fs::rename(tmp, dir.join(FILE))
    })
}

/// Moves `audit.head` aside as `audit.head.<label>-<time>` (e.g. `before-restore`: the
/// evidence of what a restore rolled back), if there is one; where it went.
fn set_aside(dir: &Path, label: &str, now: DateTime<Utc>) -> std::io::Result<Option<PathBuf>> {
    let head = dir.join(FILE);
    if !head.exists() {
        return Ok(None);
    }
    let kept = dir.join(format!(
        "{FILE}.{label}-{}",
        now.format("%Y%m%dT%H%M%S%.3fZ")
    ));
    std::fs::rename(&head, &kept)?;
    crate::private_fs::sync_dir(dir)?;
    Ok(Some(kept))
}

/// One export, its refusal or failure raised as an alert (`audit_head`) as well as logged:
/// a head that can no longer be written (a folder put where its lock or file goes, a full
/// disk, lost permissions) falls behind the log as silently as a refused one.
async fn export_or_alert(db: &Db, dir: &Path, name: &str, now: DateTime<Utc>, alerts: &Alerter) {
    match export(db, dir, name, now).await {
        Ok(Exported::Refused(why) | Exported::Started(_, why)) => {
            alerts.raise("audit_head", &dir.display().to_string(), &why)
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(target: "sluice::audit", error = %e, "exporting the audit head failed");
            alerts.raise(
                "audit_head",
                &dir.display().to_string(),
                &format!("the audit head cannot be written, so it no longer follows the log: {e}"),
            );
        }
    }
}

/// The gateway's exporter: once at start, awaited (a first head's `audit.head_started` row
/// is in the chain before the gateway answers anyone; a missing or mismatched head is
/// raised before it serves), then from a task of its own after every signed row.
pub async fn start(
    db: Db,
    dir: PathBuf,
    name: String,
    clock: Arc<dyn Clock>,
    alerts: Arc<Alerter>,
) {
    export_or_alert(&db, &dir, &name, clock.now(), &alerts).await;
    tokio::spawn(async move {
        loop {
            db.audit.wait_appended().await;
            export_or_alert(&db, &dir, &name, clock.now(), &alerts).await;
        }
    });
}

/// What `sluice audit verify` and the admin page report.
#[derive(Debug, Clone)]
pub struct Report {
    pub chain: ChainState,
    pub head: Found,
    /// The newest `audit.head_started` row (id, time): a head was started over this chain.
    pub started: Option<(i64, String)>,
    /// The database's row count and newest hash (also past a broken row).
    pub tip: (i64, i64, String),
    /// Triggers on the log that are not the schema's, or its guards missing.
    pub triggers: audit::Triggers,
}

impl Report {
    /// Every problem found, each naming what broke; empty when all is well.
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.triggers.problems();
        if let Some(b) = &self.chain.broken {
            out.push(format!(
                "audit log chain broken at row {}: {} ({} rows before it verified)",
                b.id, b.why, self.chain.rows
            ));
        }
        let (rows, last_id, last_hash) = (&self.tip.0, &self.tip.1, &self.tip.2);
        match &self.head {
            Found::Missing => out.push(match &self.started {
                Some((id, at)) => format!(
                    "audit head missing: no {FILE} in the backup folder, though row {id} says a head was started at {at} — deleted (perhaps with the newest rows) or the backup folder moved; once you know why, `sluice audit rearm --reason …` starts a new one"
                ),
                None => format!("audit head missing: no {FILE} in the backup folder"),
            }),
            Found::Unreadable(e) => out.push(format!("audit head unreadable: {e}")),
            Found::Forged => {
                out.push("audit head forged: its signature is not this gateway's".into())
            }
            Found::Valid(h) if h.same_tip(*rows, *last_id, last_hash) => {}
            Found::Valid(h) => {
                let what = if h.rows != *rows {
                    format!(
                        "count: the head says {} rows, the database has {rows}",
                        h.rows
                    )
                } else {
                    format!("hash: the head's last row is {} with hash {}, the database's is {last_id} with hash {last_hash}", h.last_id, h.last_hash)
                };
                let why = if *rows < h.rows {
                    " (rows were deleted)"
                } else if *rows > h.rows {
                    " (rows were added after the head was written: a gateway may be writing it — run again — or the head is an old one)"
                } else {
                    ""
                };
                out.push(format!("audit head mismatch: {what}{why}"));
            }
        }
        // Both signatures failing at once is what another key looks like: the likeliest
        // cause is an accident with the key, not an edit (which leaves the head intact).
        let unsigned = self
            .chain
            .broken
            .as_ref()
            .is_some_and(|b| b.why == audit::UNSIGNED);
        if unsigned && self.head == Found::Forged {
            out.push(format!(
                "the rows and the head fail alike: probably not the key that signed them ({} set, unset or changed, or the key file replaced); verify with that key",
                crate::secrets::ENV
            ));
        }
        out
    }
}

/// Checks rows, chain, head, and the triggers on the log.
pub async fn verify(db: &Db, dir: &Path, name: &str) -> Result<Report, HeadError> {
    let chain = audit::verify(db, &db.audit).await?;
    let mut conn = db.begin_read().await?;
    let tip = audit::tip(&mut conn).await?;
    let started = audit::head_started(&mut conn, &head_id(name, dir)).await?;
    Ok(Report {
        chain,
        head: read(dir, &db.audit),
        started,
        tip,
        triggers: audit::triggers(db).await?,
    })
}
