//! A whole transaction in one hop to SQLite: statements run synchronously through the
//! connection's raw handle instead of one channel round trip each.
//!
//! Why: sqlx runs every SQLite connection on its own worker thread and sends each statement
//! there and back through channels. The reserve and settle transactions are ~16 statements,
//! and the profile of the gateway (docs/PERFORMANCE.md) showed ~46 context switches per
//! request on that worker thread while SQLite itself was ~3 % of the samples.
//! `SqliteConnection::lock_handle()` makes the worker hand over the connection (it waits
//! on the connection's mutex meanwhile), so the caller can run a whole batch on its own
//! thread: one hop per batch instead of one per statement. We stay with sqlx (pool,
//! migrations, every other query) and with SQLite; only the money path and the request log
//! use this module, through `store::writer`.
//!
//! Statements are prepared once per connection (`SQLITE_PREPARE_PERSISTENT`) when a
//! `Statements` cache is kept (`Statements::attach`), and always reset (bindings cleared)
//! after each use, so no statement stays active between calls.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Weak};

use libsqlite3_sys as ffi;
use parking_lot::Mutex;
use sqlx::sqlite::LockedSqliteHandle;

use super::{Result, StoreError};

/// A bound parameter. Text is bound without copying: it outlives the statement's use,
/// which ends (reset + cleared bindings) before `execute`/`query_row` return.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl From<i64> for Param<'_> {
    fn from(v: i64) -> Self {
        Param::Int(v)
    }
}
impl<'a> From<&'a str> for Param<'a> {
    fn from(v: &'a str) -> Self {
        Param::Text(v)
    }
}
impl<'a> From<&'a String> for Param<'a> {
    fn from(v: &'a String) -> Self {
        Param::Text(v)
    }
}
impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(v: &'a [u8]) -> Self {
        Param::Blob(v)
    }
}
impl<'a, T: Into<Param<'a>>> From<Option<T>> for Param<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Param::Null, Into::into)
    }
}

/// Prepared statements of one connection, keyed by the address of their `'static` SQL
/// text. Finalized on drop — which must happen before the connection closes (SQLite
/// refuses to close a connection with live statements).
pub struct Statements {
    db: *mut ffi::sqlite3,
    map: HashMap<(usize, usize), NonNull<ffi::sqlite3_stmt>>,
}

// SAFETY: the statements are only used while their connection is locked by the user (the
// raw handle of a `LockedSqliteHandle`), and SQLite is built thread-safe (sqlx checks).
unsafe impl Send for Statements {}

impl Drop for Statements {
    fn drop(&mut self) {
        for (_, s) in self.map.drain() {
            // SAFETY: each statement was prepared on `db` and is finalized once.
            unsafe { ffi::sqlite3_finalize(s.as_ptr()) };
        }
    }
}

/// A cache kept across batches, owned by the connection itself.
///
/// The strong reference lives in a rollback hook registered on the connection; sqlx drops
/// hooks (`ConnectionState::drop`) before it closes the handle, so our statements are
/// finalized exactly when the connection goes away — whoever closes it and whenever.
/// The keeper holds only a weak reference, so it never keeps statements of a closed
/// connection (nor a connection's statements past its close).
#[derive(Default)]
pub struct Keeper {
    cache: Option<Weak<Mutex<Statements>>>,
}

impl Keeper {
    /// The cache of the connection behind `handle`, created (and attached) if needed.
    pub fn attach(&mut self, handle: &mut LockedSqliteHandle<'_>) -> Arc<Mutex<Statements>> {
        let db = handle.as_raw_handle().as_ptr();
        if let Some(live) = self.cache.as_ref().and_then(Weak::upgrade) {
            if live.lock().db == db {
                return live;
            }
        }
        let fresh = Arc::new(Mutex::new(Statements::new(db)));
        let owned = fresh.clone();
        // The hook does nothing; it is only the owner (see above).
        handle.set_rollback_hook(move || {
            let _ = &owned;
        });
        self.cache = Some(Arc::downgrade(&fresh));
        fresh
    }
}

#[cfg(test)]
impl Keeper {
    /// Whether the cache it last attached is still alive (its connection is open).
    pub fn is_live(&self) -> bool {
        self.cache.as_ref().is_some_and(|w| w.strong_count() > 0)
    }
}

impl Statements {
    /// A cache for the connection behind `db` (finalized on drop: keep it no longer than
    /// the lock on that connection unless it is attached with a `Keeper`).
    pub fn new(db: *mut ffi::sqlite3) -> Self {
        Statements {
            db,
            map: HashMap::new(),
        }
    }

    fn get(&mut self, sql: &'static str) -> Result<NonNull<ffi::sqlite3_stmt>> {
        let key = (sql.as_ptr() as usize, sql.len());
        if let Some(s) = self.map.get(&key) {
            return Ok(*s);
        }
        let mut stmt = ptr::null_mut();
        let len = c_int::try_from(sql.len())
            .map_err(|_| StoreError::Conflict("statement too long".into()))?;
        // SAFETY: `db` is the locked connection; `sql` is valid for `len` bytes.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db,
                sql.as_ptr().cast::<c_char>(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(self.db));
        }
        let stmt = NonNull::new(stmt)
            .ok_or_else(|| StoreError::Conflict(format!("empty statement: {sql}")))?;
        self.map.insert(key, stmt);
        Ok(stmt)
    }
}

/// The last error of a connection.
fn error(db: *mut ffi::sqlite3) -> StoreError {
    // SAFETY: `db` is a live, locked connection; errmsg is a NUL-terminated string it owns.
    let (code, message) = unsafe {
        (
            ffi::sqlite3_extended_errcode(db),
            CStr::from_ptr(ffi::sqlite3_errmsg(db))
                .to_string_lossy()
                .into_owned(),
        )
    };
    StoreError::Sqlite { code, message }
}

/// One row of a result, valid inside the `query_row` callback.
pub struct Row(NonNull<ffi::sqlite3_stmt>);

impl Row {
    pub fn int(&self, col: c_int) -> Option<i64> {
        // SAFETY: the statement is on a row (SQLITE_ROW) while the callback runs.
        unsafe {
            if ffi::sqlite3_column_type(self.0.as_ptr(), col) == ffi::SQLITE_NULL {
                None
            } else {
                Some(ffi::sqlite3_column_int64(self.0.as_ptr(), col))
            }
        }
    }

    pub fn text(&self, col: c_int) -> Option<String> {
        // SAFETY: as above; text is copied out before the next step.
        unsafe {
            let p = ffi::sqlite3_column_text(self.0.as_ptr(), col);
            if p.is_null() {
                return None;
            }
            let n = usize::try_from(ffi::sqlite3_column_bytes(self.0.as_ptr(), col)).unwrap_or(0);
            Some(String::from_utf8_lossy(std::slice::from_raw_parts(p, n)).into_owned())
        }
    }
}

/// A locked connection, ready to run statements on the calling thread.
pub struct Conn<'a> {
    db: *mut ffi::sqlite3,
    stmts: &'a mut Statements,
}

/// Resets a statement and clears its bindings when a use ends, also on an early return.
struct InUse(NonNull<ffi::sqlite3_stmt>);

impl Drop for InUse {
    fn drop(&mut self) {
        // SAFETY: a statement of the locked connection.
        unsafe {
            ffi::sqlite3_reset(self.0.as_ptr());
            ffi::sqlite3_clear_bindings(self.0.as_ptr());
        }
    }
}

impl<'a> Conn<'a> {
    /// `stmts` must belong to the connection `db` (checked), which the caller holds locked.
    pub fn new(db: *mut ffi::sqlite3, stmts: &'a mut Statements) -> Result<Self> {
        if stmts.db != db {
            return Err(StoreError::Conflict(
                "statement cache of another connection".into(),
            ));
        }
        Ok(Conn { db, stmts })
    }

    /// Whether a transaction is open (SQLite rolls one back by itself on some errors).
    pub fn in_transaction(&self) -> bool {
        // SAFETY: the locked connection.
        unsafe { ffi::sqlite3_get_autocommit(self.db) == 0 }
    }

    fn bind(&mut self, sql: &'static str, params: &[Param<'_>]) -> Result<InUse> {
        let stmt = self.stmts.get(sql)?;
        let use_ = InUse(stmt);
        let s = stmt.as_ptr();
        // SAFETY: `s` is a reset statement of the locked connection; text parameters
        // outlive the use (see `Param`), so SQLITE_STATIC (no copy) is sound.
        unsafe {
            let wanted = usize::try_from(ffi::sqlite3_bind_parameter_count(s)).unwrap_or(0);
            if params.len() < wanted {
                return Err(StoreError::Conflict(format!(
                    "{sql}: {wanted} parameters, {} given",
                    params.len()
                )));
            }
            for (i, p) in params.iter().take(wanted).enumerate() {
                let i = c_int::try_from(i + 1).unwrap_or(c_int::MAX);
                let rc = match *p {
                    Param::Null => ffi::sqlite3_bind_null(s, i),
                    Param::Int(v) => ffi::sqlite3_bind_int64(s, i, v),
                    Param::Real(v) => ffi::sqlite3_bind_double(s, i, v),
                    Param::Text(t) => ffi::sqlite3_bind_text(
                        s,
                        i,
                        t.as_ptr().cast::<c_char>(),
                        c_int::try_from(t.len()).unwrap_or(c_int::MAX),
                        None, // SQLITE_STATIC
                    ),
                    Param::Blob(b) => ffi::sqlite3_bind_blob(
                        s,
                        i,
                        b.as_ptr().cast(),
                        c_int::try_from(b.len()).unwrap_or(c_int::MAX),
                        None, // SQLITE_STATIC
                    ),
                };
                if rc != ffi::SQLITE_OK {
                    return Err(error(self.db));
                }
            }
        }
        Ok(use_)
    }

    fn step(&self, stmt: &InUse) -> Result<bool> {
        // SAFETY: a bound statement of the locked connection.
        match unsafe { ffi::sqlite3_step(stmt.0.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            _ => Err(error(self.db)),
        }
    }

    /// Runs a statement to completion; returns the rows it changed.
    pub fn execute(&mut self, sql: &'static str, params: &[Param<'_>]) -> Result<u64> {
        let stmt = self.bind(sql, params)?;
        while self.step(&stmt)? {}
        // SAFETY: the locked connection.
        Ok(u64::try_from(unsafe { ffi::sqlite3_changes64(self.db) }).unwrap_or(0))
    }

    /// Runs a statement to completion, handing each row to `each`.
    pub fn query_rows(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
        mut each: impl FnMut(&Row),
    ) -> Result<()> {
        let stmt = self.bind(sql, params)?;
        while self.step(&stmt)? {
            each(&Row(stmt.0));
        }
        Ok(())
    }

    /// Runs a statement to completion and maps its first row, if any.
    pub fn query_row<T>(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
        map: impl FnOnce(&Row) -> T,
    ) -> Result<Option<T>> {
        let stmt = self.bind(sql, params)?;
        let first = if self.step(&stmt)? {
            Some(map(&Row(stmt.0)))
        } else {
            None
        };
        if first.is_some() {
            while self.step(&stmt)? {}
        }
        Ok(first)
    }
}

/// A read-only connection of its own, outside sqlx's pools, whose statements run on the
/// thread that holds it: no round trip to a worker thread per statement and none for
/// sqlx's ping when a pooled connection goes back, and no wait for a pooled connection that
/// slow reads (an export, a report) hold. For short reads on the request path, run on a
/// blocking thread: SQLite can sleep in a read (its busy timeout, and its WAL read retry,
/// up to ~10 s, while another process holds the read marks).
pub struct Reader {
    db: NonNull<ffi::sqlite3>,
    stmts: Statements,
}

// SAFETY: a `Reader` is used by one thread at a time (`&mut self`), and SQLite is built
// thread-safe (sqlx checks), so its connection may move between threads.
unsafe impl Send for Reader {}

impl Reader {
    /// Opens `path` read-only; a lock held elsewhere is waited for up to `busy`.
    pub fn open(path: &std::path::Path, busy: std::time::Duration) -> Result<Reader> {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| StoreError::Conflict("a database path with a NUL byte".into()))?;
        let mut db = ptr::null_mut();
        // SAFETY: `name` is NUL-terminated; SQLite sets `db` (even on failure, when it is
        // then to be closed).
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                name.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READONLY | ffi::SQLITE_OPEN_NOMUTEX,
                ptr::null(),
            )
        };
        let Some(db) = NonNull::new(db) else {
            return Err(StoreError::Conflict(
                "SQLite could not allocate a connection".into(),
            ));
        };
        if rc != ffi::SQLITE_OK {
            let e = error(db.as_ptr());
            // SAFETY: the failed connection, closed once; it has no statements.
            unsafe { ffi::sqlite3_close(db.as_ptr()) };
            return Err(e);
        }
        let busy = c_int::try_from(busy.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: the connection just opened; it has no statements yet.
        unsafe { ffi::sqlite3_busy_timeout(db.as_ptr(), busy) };
        Ok(Reader {
            db,
            stmts: Statements::new(db.as_ptr()),
        })
    }

    /// The connection, to run statements on.
    pub fn conn(&mut self) -> Conn<'_> {
        Conn {
            db: self.db.as_ptr(),
            stmts: &mut self.stmts,
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // SQLite refuses to close a connection with live statements: finalized first.
        for (_, s) in self.stmts.map.drain() {
            // SAFETY: each statement was prepared on `db` and is finalized once.
            unsafe { ffi::sqlite3_finalize(s.as_ptr()) };
        }
        // SAFETY: the connection this reader opened, closed once, without statements.
        unsafe { ffi::sqlite3_close(self.db.as_ptr()) };
    }
}

/// Frees what every SQLite connection of the process keeps in its page cache, but the pages
/// a statement holds now: at rest (the heap-release thread, `ops::memory`) those are memory
/// no one uses — a burst's request log and ledger pages, up to `cache_size` per connection
/// (16 MB), 2.0 MB after 1 000 streams — and what is needed again is read from the file, in
/// the operating system's page cache. The bundled SQLite is built with
/// `SQLITE_ENABLE_MEMORY_MANAGEMENT`, under which every connection's cache is in one group
/// and this takes its least recently used pages, under that group's lock. Returns the bytes
/// freed.
pub fn release_page_caches() -> usize {
    // SAFETY: SQLite's own call, safe from any thread at any time.
    let freed = unsafe { ffi::sqlite3_release_memory(c_int::MAX) };
    usize::try_from(freed).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(db: *mut ffi::sqlite3, sql: &str) {
        let sql = std::ffi::CString::new(sql).unwrap();
        // SAFETY: an open connection, a NUL-terminated statement.
        let rc =
            unsafe { ffi::sqlite3_exec(db, sql.as_ptr(), None, ptr::null_mut(), ptr::null_mut()) };
        assert_eq!(rc, ffi::SQLITE_OK, "{}", error(db));
    }

    fn cache_used(db: *mut ffi::sqlite3) -> c_int {
        let (mut now, mut peak) = (0, 0);
        // SAFETY: an open connection; SQLite writes the two figures.
        let rc = unsafe {
            ffi::sqlite3_db_status(db, ffi::SQLITE_DBSTATUS_CACHE_USED, &mut now, &mut peak, 0)
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        now
    }

    /// A connection's page cache, filled by a scan of 4 MB, is freed by the release; a
    /// connection reads on afterwards from the file.
    #[test]
    fn the_release_frees_a_connections_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let name = std::ffi::CString::new(dir.path().join("pages.db").to_str().unwrap()).unwrap();
        let mut db = ptr::null_mut();
        // SAFETY: a NUL-terminated path; the connection is closed below.
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                name.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_CREATE,
                ptr::null(),
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        run(db, "PRAGMA cache_size = -16000");
        run(db, "CREATE TABLE t(x)");
        run(
            db,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
             INSERT INTO t SELECT randomblob(200) FROM n",
        );
        run(db, "SELECT sum(length(x)) FROM t");
        let filled = cache_used(db);
        assert!(filled > 4 << 20, "the scan filled {filled} bytes");
        assert!(release_page_caches() > 0);
        let left = cache_used(db);
        assert!(left < filled / 10, "{left} of {filled} bytes left");
        run(db, "SELECT sum(length(x)) FROM t");
        // SAFETY: the connection opened above, without statements.
        unsafe { ffi::sqlite3_close(db) };
    }
}
