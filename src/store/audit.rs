//! The audit log: append-only (triggers refuse UPDATE and DELETE) and chained under a key
//! the database does not hold. Each row's `hash` is HMAC-SHA256, under the audit subkey of
//! the gateway's master key (`secrets`), over the previous row's hash and the row's fields;
//! so nobody without the key can edit a row, or rewrite the chain after it, and still have
//! it verify. What the chain cannot show — its newest rows deleted — the signed head shows
//! (`ops::audit_head`), which is kept outside the database.
//!
//! Rows written before the chain was keyed (`chain = 'sha256'`, plain SHA-256, migration
//! 0013) stay as they were: that migration sealed them with one keyed row, `audit.keyed`,
//! whose MAC covers their count and their last hash. They are valid only as a prefix
//! followed by that seal, so relabelling keyed rows as old ones does not verify either.

use futures_util::TryStreamExt;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use sqlx::{ColumnIndex, Decode, Row, Type};

use super::raw::Conn;
use super::{Result, StoreError};
use crate::clock::db_time;
use crate::secrets::{MasterKey, Subkey};

pub struct AuditEntry<'a> {
    pub actor: &'a str,
    pub address: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
}

/// The entry a stored audit row holds (borrowed from the row), on either engine.
pub(super) fn entry_of<R: Row>(r: &R) -> AuditEntry<'_>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    AuditEntry {
        actor: r.get("actor"),
        address: r.get("address"),
        action: r.get("action"),
        target: r.get("target"),
        before: r.get("before"),
        after: r.get("after"),
    }
}

/// The previous hash of the first row.
pub(super) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// `chain` of rows signed with the key; rows from before it are `LEGACY`.
pub const KEYED: &str = "hmac-sha256";
pub(super) const LEGACY: &str = "sha256";
/// Why a keyed row fails its MAC.
pub const UNSIGNED: &str =
    "it was changed after it was written, or signed without the gateway's key";
/// The action of the row that seals the legacy rows (migration 0013).
pub const SEAL: &str = "audit.keyed";
/// The action of the row written just before a signed head is started over the chain as it
/// stands (`ops::audit_head`): from then on a missing head is an alarm, not a first start.
/// Being in the chain, it cannot be removed without removing every row after it too.
pub const HEAD_STARTED: &str = "audit.head_started";

/// The audit subkeys and the wake-up of the head writer. Held by the write connections
/// (`audit_mac`) and by `Db` (to verify).
pub struct AuditKeys {
    chain: Subkey,
    head: Subkey,
    /// Keys the sign-in throttle's per-name counters (`auth::throttle`): what was typed
    /// into the name field is never stored, only its MAC.
    names: Subkey,
    appended: tokio::sync::Notify,
}

impl std::fmt::Debug for AuditKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditKeys(..)")
    }
}

/// A field, length-prefixed so no two different rows hash alike; NULL is its own marker.
fn absorb(mac: &mut Hmac<Sha256>, field: Option<&[u8]>) {
    match field {
        Some(b) => {
            mac.update(&(b.len() as u64).to_be_bytes());
            mac.update(b);
        }
        None => mac.update(&u64::MAX.to_be_bytes()),
    }
}

impl AuditKeys {
    pub fn derive(master: &MasterKey) -> AuditKeys {
        AuditKeys {
            chain: master.subkey("sluice/audit-chain/v1"),
            head: master.subkey("sluice/audit-head/v1"),
            names: master.subkey("sluice/throttle-names/v1"),
            appended: tokio::sync::Notify::new(),
        }
    }

    #[allow(clippy::expect_used)]
    fn mac(key: &Subkey) -> Hmac<Sha256> {
        // cannot fail: HMAC accepts keys of every length (`new_from_slice` returns a Result
        // only because it shares the `KeyInit` trait with fixed-key MACs).
        <Hmac<Sha256> as Mac>::new_from_slice(key.bytes()).expect("HMAC takes keys of any length")
    }

    /// The row MAC over (prev, actor, address, action, target, before, after, created_at).
    pub fn chain_mac(&self, fields: &[Option<&[u8]>]) -> String {
        let mut m = Self::mac(&self.chain);
        for f in fields {
            absorb(&mut m, *f);
        }
        hex::encode(m.finalize().into_bytes())
    }

    /// The row MAC: the field list `audit_mac` hands to `chain_mac`.
    pub(super) fn row_mac(&self, prev: &str, e: &AuditEntry<'_>, created_at: &str) -> String {
        self.chain_mac(&[
            Some(prev.as_bytes()),
            Some(e.actor.as_bytes()),
            Some(e.address.as_bytes()),
            Some(e.action.as_bytes()),
            Some(e.target.as_bytes()),
            e.before.map(str::as_bytes),
            e.after.map(str::as_bytes),
            Some(created_at.as_bytes()),
        ])
    }

    /// The key the sign-in throttle counts a typed name under (hex): a password typed into
    /// the name field is not kept in clear, and names still count alike.
    pub fn name_mac(&self, name: &str) -> String {
        let mut m = Self::mac(&self.names);
        m.update(name.as_bytes());
        hex::encode(m.finalize().into_bytes())
    }

    /// The head's signature over its text.
    pub fn head_mac(&self, text: &str) -> String {
        let mut m = Self::mac(&self.head);
        m.update(text.as_bytes());
        hex::encode(m.finalize().into_bytes())
    }

    /// Whether `mac` (hex) signs `text`, compared in constant time.
    pub fn head_mac_ok(&self, text: &str, mac: &str) -> bool {
        let Ok(tag) = hex::decode(mac) else {
            return false;
        };
        let mut m = Self::mac(&self.head);
        m.update(text.as_bytes());
        m.verify_slice(&tag).is_ok()
    }

    /// Called by `sluice_audit_mac` for each row it signs (and by PostgreSQL's append for
    /// one it refuses over a tip this key did not sign, so the head's check runs).
    pub(crate) fn appended(&self) {
        self.appended.notify_one();
    }

    /// Resolves after a row was signed (on any write connection of this `Db`) since the last
    /// call; the row's transaction may still be open.
    pub async fn wait_appended(&self) {
        self.appended.notified().await;
    }
}

/// The chain before keying: plain SHA-256, as the rows from before migration 0013 hold it.
pub(super) fn legacy_hash(prev: &str, e: &AuditEntry<'_>, created_at: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        prev,
        e.actor,
        e.address,
        e.action,
        e.target,
        e.before.unwrap_or("\u{0}"),
        e.after.unwrap_or("\u{0}"),
        created_at,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

const LAST_HASH: &str = "SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1";
/// The MAC is computed by the connection (`audit_mac`): `?8` is the previous hash. The row
/// written comes back (`RETURNING`) for `written` to check against the tip.
const INSERT: &str = "INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash, chain)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, sluice_audit_mac(?8, ?1, ?2, ?3, ?4, ?5, ?6, ?7), 'hmac-sha256')
     RETURNING id, hash";
/// The newest row, read back after an append.
pub(super) const TIP: &str = "SELECT id, hash FROM audit_log ORDER BY id DESC LIMIT 1";

/// Whether the row an append wrote (`inserted`: what its INSERT returned, `None` when it
/// returned no row) is the tip of the log right after it (`tip`), unchanged. A trigger
/// planted on the table (S11: the database without the key) can skip the row (SQLite
/// `RAISE(IGNORE)`, a PostgreSQL BEFORE trigger returning NULL or a rule) or delete or edit
/// it as soon as it is written; the chain then links past it and the head counts without
/// it, so nothing after could tell. Refused here instead: the caller's transaction fails
/// and the action does not happen unaudited.
pub(super) fn written(
    action: &str,
    inserted: Option<(i64, String)>,
    tip: Option<(i64, String)>,
) -> Result<()> {
    let Some(row) = inserted else {
        return Err(StoreError::Audit(format!(
            "the audit row of `{action}` was not written (something on the audit_log table dropped it: `sluice audit verify` names its triggers); the action was not done"
        )));
    };
    if tip.as_ref() != Some(&row) {
        return Err(StoreError::Audit(format!(
            "the audit row of `{action}` (id {}) was removed or changed as it was written (something on the audit_log table did it: `sluice audit verify` names its triggers); the action was not done",
            row.0
        )));
    }
    Ok(())
}

/// Appends one row inside the caller's transaction, so the action and its audit row commit
/// together or not at all.
pub async fn append(
    tx: &mut super::Tx,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    if let Some((conn, keys)) = tx.pg() {
        return super::pg::audit::append(conn, keys, e, now).await;
    }
    let prev: Option<String> = sqlx::query_scalar(LAST_HASH)
        .fetch_optional(tx.sqlite()?)
        .await?;
    let prev = prev.unwrap_or_else(|| GENESIS.to_string());
    let inserted: Option<(i64, String)> = sqlx::query_as(INSERT)
        .bind(e.actor)
        .bind(e.address)
        .bind(e.action)
        .bind(e.target)
        .bind(e.before)
        .bind(e.after)
        .bind(db_time(now))
        .bind(&prev)
        .fetch_optional(tx.sqlite()?)
        .await?;
    let tip: Option<(i64, String)> = sqlx::query_as(TIP).fetch_optional(tx.sqlite()?).await?;
    written(e.action, inserted, tip)
}

/// `append` for a transaction run through the raw handle (`writer`).
pub fn append_tx(
    tx: &mut Conn<'_>,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let prev = tx
        .query_row(LAST_HASH, &[], |r| r.text(0))?
        .flatten()
        .unwrap_or_else(|| GENESIS.to_string());
    let created_at = db_time(now);
    let row = |r: &super::raw::Row| r.int(0).zip(r.text(1));
    let inserted = tx
        .query_row(
            INSERT,
            &[
                e.actor.into(),
                e.address.into(),
                e.action.into(),
                e.target.into(),
                e.before.into(),
                e.after.into(),
                (&created_at).into(),
                (&prev).into(),
            ],
            row,
        )?
        .flatten();
    let tip = tx.query_row(TIP, &[], row)?.flatten();
    written(e.action, inserted, tip)
}

/// Appends one row in its own transaction (for events outside an admin transaction, such
/// as the gateway disabling an upstream key).
pub async fn record(
    db: &super::Db,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let mut tx = db.begin().await?;
    append(&mut tx, e, now).await?;
    tx.commit().await?;
    Ok(())
}

/// What is wrong with the triggers that touch the audit log (`triggers`), each named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Triggers {
    /// Triggers (or, on PostgreSQL, rules) that are not the schema's, or the schema's
    /// altered: each can drop, delete or edit rows as they are written, which the chain
    /// and the head cannot show (a skipped row is simply not linked).
    pub unexpected: Vec<String>,
    /// The schema's append-only guards missing or disabled.
    pub missing: Vec<String>,
}

impl Triggers {
    /// Every problem, unexpected ones first; empty when the triggers are the schema's.
    pub fn problems(&self) -> Vec<String> {
        self.unexpected
            .iter()
            .chain(&self.missing)
            .cloned()
            .collect()
    }

    pub(super) fn unexpected(&mut self, name: &str, what: &str) {
        self.unexpected.push(format!(
            "audit log trigger `{name}` is not the schema's ({what}): it can drop or change audit rows as they are written, unseen by the chain; find out who added it, then drop it"
        ));
    }

    pub(super) fn missing(&mut self, name: &str, what: &str) {
        self.missing.push(format!(
            "audit log trigger `{name}` {what}: audit rows can be changed or deleted (the chain and the head still show it); put it back as the schema has it"
        ));
    }
}

/// The triggers migration 0004 put on `audit_log` (SQLite), as `sqlite_master` keeps
/// their text (compared with runs of whitespace as one space).
const SQLITE_GUARDS: [(&str, &str); 2] = [
    (
        "audit_no_update",
        "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit_log BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END",
    ),
    (
        "audit_no_delete",
        "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit_log BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END",
    ),
];

/// `text` with every run of whitespace one space (a trigger put back on one line is the
/// same trigger).
pub(super) fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks that the triggers on the audit log, and every trigger that names it, are
/// exactly the schema's append-only guards. The MAC chain shows a row changed and the
/// head rows deleted, but a trigger can drop a row before either sees it: `append` refuses
/// what it can see of that, and this names the trigger (startup, `sluice audit verify`).
pub async fn triggers(db: &super::Db) -> Result<Triggers> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::audit::triggers(&pg.pool).await,
    };
    // A trigger on another table can reach the log too (deleting its newest row after the
    // append): any whose text names it counts.
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT name, tbl_name, sql FROM sqlite_master
         WHERE type = 'trigger' AND (tbl_name = 'audit_log' OR sql LIKE '%audit_log%')
         ORDER BY name",
    )
    .fetch_all(&sqlite.read)
    .await?;
    let mut out = Triggers::default();
    for (name, table, sql) in &rows {
        let sql = squeeze(sql.as_deref().unwrap_or(""));
        match SQLITE_GUARDS.iter().find(|(n, _)| n == name) {
            Some((_, want)) if *want == sql => {}
            Some(_) => out.unexpected(name, "its text was changed"),
            None if table == "audit_log" => out.unexpected(name, "added on audit_log"),
            None => out.unexpected(name, &format!("added on {table}, it names audit_log")),
        }
    }
    for (name, _) in SQLITE_GUARDS {
        if !rows.iter().any(|(n, _, _)| n == name) {
            out.missing(name, "is missing");
        }
    }
    Ok(out)
}

/// The chain as the database holds it: how many rows, the newest, and the first row that
/// does not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainState {
    pub rows: i64,
    pub last_id: i64,
    pub last_hash: String,
    pub broken: Option<Broken>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub id: i64,
    pub why: &'static str,
}

/// Walks the whole chain. Every row must link to the one before it and carry its MAC (or,
/// for the sealed legacy prefix, its SHA-256).
pub async fn verify(db: &super::Db, keys: &AuditKeys) -> Result<ChainState> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::audit::verify(&pg.pool, keys).await,
    };
    let mut rows = sqlx::query(VERIFY_ROWS).fetch(&sqlite.read);
    let mut w = Walker::new(keys);
    while let Some(r) = rows.try_next().await? {
        if !w.step(&r) {
            break;
        }
    }
    Ok(w.finish())
}

/// Every row `walk` reads, in id order.
pub(super) const VERIFY_ROWS: &str = "SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain FROM audit_log ORDER BY id";

/// Checks the rows of the whole chain, in id order, as they are stored (either engine).
pub(super) fn walk<R: Row>(rows: &[R], keys: &AuditKeys) -> ChainState
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let mut w = Walker::new(keys);
    for r in rows {
        if !w.step(r) {
            break;
        }
    }
    w.finish()
}

/// `walk` a row at a time, so a verification streams the log: its memory does not grow
/// with the log, which anyone who can reach the sign-in form can lengthen (s26 attack
/// admin #3).
pub(super) struct Walker<'k> {
    keys: &'k AuditKeys,
    st: ChainState,
    legacy: i64,
    keyed: bool,
    first_legacy: Option<i64>,
}

impl<'k> Walker<'k> {
    pub(super) fn new(keys: &'k AuditKeys) -> Self {
        Self {
            keys,
            st: ChainState {
                rows: 0,
                last_id: 0,
                last_hash: GENESIS.to_string(),
                broken: None,
            },
            legacy: 0,
            keyed: false,
            first_legacy: None,
        }
    }

    /// Checks the next row; false once the chain is broken (later rows change nothing).
    pub(super) fn step<R: Row>(&mut self, r: &R) -> bool
    where
        for<'c> &'c str: ColumnIndex<R>,
        for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
        for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    {
        let id: i64 = r.get("id");
        let e = entry_of(r);
        let (stored_prev, stored, chain, created_at): (&str, &str, &str, &str) = (
            r.get("prev_hash"),
            r.get("hash"),
            r.get("chain"),
            r.get("created_at"),
        );
        let st = &mut self.st;
        let why = if stored_prev != st.last_hash {
            Some("it does not link to the row before it (a row was removed or inserted)")
        } else {
            match chain {
                LEGACY if self.keyed => Some("an unkeyed row after keyed ones"),
                LEGACY => {
                    self.legacy += 1;
                    self.first_legacy.get_or_insert(id);
                    (legacy_hash(&st.last_hash, &e, created_at) != stored)
                        .then_some("it was changed after it was written")
                }
                KEYED if !self.keyed && self.legacy > 0 && !seals(&e, self.legacy) => {
                    Some("the unkeyed rows before it are not sealed by an `audit.keyed` row")
                }
                KEYED => {
                    self.keyed = true;
                    (self.keys.row_mac(&st.last_hash, &e, created_at) != stored).then_some(UNSIGNED)
                }
                _ => Some("unknown chain kind"),
            }
        };
        if let Some(why) = why {
            st.broken = Some(Broken { id, why });
            return false;
        }
        st.rows += 1;
        st.last_id = id;
        st.last_hash = stored.to_string();
        true
    }

    pub(super) fn finish(mut self) -> ChainState {
        if self.st.broken.is_none() {
            if let (Some(id), false) = (self.first_legacy, self.keyed) {
                self.st.broken = Some(Broken {
                    id,
                    why: "unkeyed rows with no `audit.keyed` seal after them",
                });
            }
        }
        self.st
    }
}

/// One audit row's new links: its id, previous hash and hash under the new key.
pub(super) type Relinked = (i64, String, String);

/// The chain signed under a new key (`resign`): the rows whose links change, and how many
/// rows it has.
pub(super) struct Resigned {
    pub relinked: Vec<Relinked>,
    pub rows: i64,
}

/// The chain `rows` (all of it, in id order) signed again under `new`, after it verified
/// whole under `old` (`sluice secrets rotate`): each keyed row's new previous hash and MAC,
/// for the rows whose links change, and the row count; or the first row that does not
/// verify. The legacy prefix (plain SHA-256) keeps its hashes: they involve no key, and
/// nothing before them changes.
pub(super) fn resign<R: Row>(
    rows: &[R],
    old: &AuditKeys,
    new: &AuditKeys,
) -> std::result::Result<Resigned, Broken>
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let st = walk(rows, old);
    if let Some(b) = st.broken {
        return Err(b);
    }
    let mut prev = GENESIS.to_string();
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let (chain, stored, created_at): (&str, &str, &str) =
            (r.get("chain"), r.get("hash"), r.get("created_at"));
        let hash = match chain {
            KEYED => new.row_mac(&prev, &entry_of(r), created_at),
            _ => stored.to_string(),
        };
        if hash != stored || prev != r.get::<&str, _>("prev_hash") {
            out.push((r.get("id"), prev, hash.clone()));
        }
        prev = hash;
    }
    Ok(Resigned {
        relinked: out,
        rows: st.rows,
    })
}

/// Whether `keys` signed this log: `None` when it has no keyed row; else whether any keyed
/// row's MAC (over its own stored previous hash, links aside) verifies under them. Newest
/// first, so an intact log answers at its first row; `false` only when not one row does,
/// which is what another key looks like (an edit leaves the other rows verifying).
pub async fn signed_with(db: &super::Db, keys: &AuditKeys) -> Result<Option<bool>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::audit::signed_with(&pg.pool, keys).await,
    };
    let pool = &sqlite.read;
    use futures_util::TryStreamExt;
    let mut rows = sqlx::query(
        "SELECT actor, address, action, target, before, after, created_at, prev_hash, hash FROM audit_log WHERE chain = ? ORDER BY id DESC",
    )
    .bind(KEYED)
    .fetch(pool);
    let mut any = false;
    while let Some(r) = rows.try_next().await? {
        any = true;
        if signs(keys, &r) {
            return Ok(Some(true));
        }
    }
    Ok(any.then_some(false))
}

/// Whether `keys` signed the stored keyed row `r` (its MAC over its own stored previous
/// hash, links aside), on either engine.
pub(super) fn signs<R: Row>(keys: &AuditKeys, r: &R) -> bool
where
    for<'c> &'c str: ColumnIndex<R>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    let e = entry_of(r);
    let (prev, stored, created_at): (&str, &str, &str) =
        (r.get("prev_hash"), r.get("hash"), r.get("created_at"));
    keys.row_mac(prev, &e, created_at) == stored
}

/// Whether `e` is the seal of exactly `legacy` unkeyed rows.
pub(super) fn seals(e: &AuditEntry<'_>, legacy: i64) -> bool {
    e.action == SEAL
        && e.after
            .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
            .and_then(|v| v.get("legacy_rows").and_then(|n| n.as_i64()))
            == Some(legacy)
}

/// The row count and the newest row, as a head exports them (no MAC checked). One
/// statement, so one snapshot: another process committing in between cannot pair one
/// state's count with another's newest row.
pub async fn tip(tx: &mut super::Tx) -> Result<(i64, i64, String)> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::audit::tip(conn).await;
    }
    let row: (i64, Option<i64>, Option<String>) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM audit_log),
                (SELECT id FROM audit_log ORDER BY id DESC LIMIT 1),
                (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1)",
    )
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok((
        row.0,
        row.1.unwrap_or(0),
        row.2.unwrap_or_else(|| GENESIS.to_string()),
    ))
}

/// The newest `HEAD_STARTED` row of the head `head` names (`ops::audit_head::head_id`): its
/// id and time (`None`: no head was ever started there). On SQLite, one host's database,
/// every such row counts whatever head it names. On PostgreSQL each host keeps a head of
/// its own (its own backup folder): only rows naming `head` count — so a new host starts its
/// head instead of raising an alarm over another host's (rows that name no head come from a
/// SQLite install copied by `migrate-store`: that host's head stays behind with it).
pub async fn head_started(tx: &mut super::Tx, head: &str) -> Result<Option<(i64, String)>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::audit::head_started(conn, head).await;
    }
    Ok(sqlx::query_as(
        "SELECT id, created_at FROM audit_log WHERE action = ? ORDER BY id DESC LIMIT 1",
    )
    .bind(HEAD_STARTED)
    .fetch_optional(tx.sqlite()?)
    .await?)
}

/// How many `HEAD_STARTED` rows name a head other than `head` (or none: a SQLite install's,
/// copied by `migrate-store`): on PostgreSQL, each a trust point a new head would not
/// extend (`ops::audit_head::export`). On SQLite every such row is this host's, and
/// `head_started` finds it: 0.
pub async fn others_started(tx: &mut super::Tx, head: &str) -> Result<i64> {
    match tx.pg() {
        Some((conn, _)) => super::pg::audit::others_started(conn, head).await,
        None => Ok(0),
    }
}

/// Whether a `HEAD_STARTED` row whose `after` is `after` names the head `head`.
pub(crate) fn started_here(after: Option<&str>, head: &str) -> bool {
    after
        .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .and_then(|v| v.get("head").and_then(|h| h.as_str()).map(|n| n == head))
        .unwrap_or(false)
}

/// Whether the database still holds an earlier head's newest row, with as many rows up to
/// it: the head is a prefix of the chain as it is now (one statement, as `tip`).
pub async fn holds(tx: &mut super::Tx, rows: i64, last_id: i64, last_hash: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::audit::holds(conn, rows, last_id, last_hash).await;
    }
    if rows == 0 {
        return Ok(true);
    }
    let (hash, upto): (Option<String>, i64) = sqlx::query_as(
        "SELECT (SELECT hash FROM audit_log WHERE id = ?1),
                (SELECT COUNT(*) FROM audit_log WHERE id <= ?1)",
    )
    .bind(last_id)
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok(hash.as_deref() == Some(last_hash) && upto == rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{writer, Db};

    fn entry(action: &str) -> AuditEntry<'_> {
        AuditEntry {
            actor: "test",
            address: "",
            action,
            target: "t",
            before: None,
            after: Some("{}"),
        }
    }

    #[tokio::test]
    async fn rows_signed_through_sqlx_and_the_raw_writer_make_one_chain() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("a.db"), false).await.unwrap();
        let now = chrono::Utc::now();
        record(&db, &entry("one"), now).await.unwrap();
        writer::once(&db.sqlite().write, |tx| append_tx(tx, &entry("two"), now))
            .await
            .unwrap();
        record(&db, &entry("three"), now).await.unwrap();
        let st = verify(&db, &db.audit).await.unwrap();
        assert_eq!((st.rows, st.broken), (3, None));
        // Another key (another database's) does not verify these rows.
        let other = Db::open(&dir.path().join("b.db"), false).await.unwrap();
        let st = verify(&db, &other.audit).await.unwrap();
        assert_eq!(st.broken.map(|b| b.id), Some(1));
    }
}
