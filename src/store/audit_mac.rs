//! The audit chain's key, held by the write connections themselves: `Db::open` registers
//! the SQL function `sluice_audit_mac(prev, actor, address, action, target, before, after,
//! created_at)` on every write connection, and `audit::append` signs each new row with it.
//!
//! Why a SQL function: audit rows are written from many places — admin handlers, the CLI,
//! and inside the money path's own transactions (a period reset, through the raw writer)
//! — and each of them must sign with the gateway's key. Held by the connection, the key
//! reaches every one of them without being passed through the money path, and a connection
//! opened without it (the `sqlite3` shell of someone who has only the database file) has
//! no such function: it cannot sign a row at all.
//!
//! Each call also wakes the audit head writer (`ops::audit_head`), which then waits for the
//! write connection — that is, for the transaction that signed the row to end — and exports
//! the new head.

use std::ffi::c_void;
use std::os::raw::{c_char, c_int};
use std::sync::Arc;

use libsqlite3_sys as ffi;
use sqlx::sqlite::LockedSqliteHandle;

use super::audit::AuditKeys;

const NAME: &std::ffi::CStr = c"sluice_audit_mac";
const ARGS: c_int = 8;

/// Registers `sluice_audit_mac` on the locked connection.
pub fn register(handle: &mut LockedSqliteHandle<'_>, keys: Arc<AuditKeys>) -> Result<(), String> {
    let db = handle.as_raw_handle().as_ptr();
    let data = Arc::into_raw(keys) as *mut c_void;
    // SAFETY: `db` is the locked, live connection. `data` is an `Arc` SQLite owns from here
    // on: `destroy` releases it when the function is replaced, the connection closes, or
    // registration fails (SQLite calls xDestroy then too). SQLITE_DIRECTONLY: the function
    // cannot be called from a trigger or view a database file could carry.
    let rc = unsafe {
        ffi::sqlite3_create_function_v2(
            db,
            NAME.as_ptr(),
            ARGS,
            ffi::SQLITE_UTF8 | ffi::SQLITE_DIRECTONLY,
            data,
            Some(call),
            None,
            None,
            Some(destroy),
        )
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(format!("cannot register {NAME:?} (SQLite code {rc})"))
    }
}

unsafe extern "C" fn destroy(data: *mut c_void) {
    // SAFETY: `data` came from `Arc::into_raw` in `register`; SQLite calls this once.
    drop(unsafe { Arc::from_raw(data as *const AuditKeys) });
}

unsafe extern "C" fn call(
    ctx: *mut ffi::sqlite3_context,
    argc: c_int,
    argv: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: SQLite passes the `data` of `register` (alive until `destroy`) and `argc`
    // values, each valid for this call. Text is read as UTF-8 bytes, NULL as `None`; a
    // NULL pointer for a value that is not NULL is SQLite out of memory, and fails the
    // call (never a MAC over the wrong bytes).
    let result = std::panic::catch_unwind(|| unsafe {
        let keys = &*(ffi::sqlite3_user_data(ctx) as *const AuditKeys);
        let args = std::slice::from_raw_parts(argv, usize::try_from(argc).unwrap_or(0));
        let mut fields: Vec<Option<&[u8]>> = Vec::with_capacity(args.len());
        for &v in args {
            if ffi::sqlite3_value_type(v) == ffi::SQLITE_NULL {
                fields.push(None);
                continue;
            }
            let p = ffi::sqlite3_value_text(v);
            if p.is_null() {
                return None;
            }
            let n = usize::try_from(ffi::sqlite3_value_bytes(v)).unwrap_or(0);
            fields.push(Some(std::slice::from_raw_parts(p, n)));
        }
        keys.appended();
        Some(keys.chain_mac(&fields))
    });
    // SAFETY: `ctx` is this call's context; SQLITE_TRANSIENT makes SQLite copy the text.
    unsafe {
        match result {
            Ok(Some(hex)) => ffi::sqlite3_result_text(
                ctx,
                hex.as_ptr().cast::<c_char>(),
                c_int::try_from(hex.len()).unwrap_or(0),
                ffi::SQLITE_TRANSIENT(),
            ),
            Ok(None) => ffi::sqlite3_result_error_nomem(ctx),
            Err(_) => {
                let msg = c"sluice_audit_mac failed";
                ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1);
            }
        }
    }
}
