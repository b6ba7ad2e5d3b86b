//! Text PostgreSQL cannot hold. Its `text` refuses NUL ('\0') — the statement fails with
//! an encoding error — where SQLite stores it like any other character. So, on PostgreSQL:
//! a lookup by text with a NUL finds nothing without asking (no stored row can hold it);
//! a write of one is refused with a `Conflict` that names the field (a 409 at the admin
//! edge) instead of a database error; and sign-in throttle keys, only ever compared with
//! each other, carry U+FFFD in its place.

use std::borrow::Cow;

use crate::store::{Result, StoreError};

/// Whether `s` can be stored or found on PostgreSQL.
pub fn storable(s: &str) -> bool {
    !s.contains('\0')
}

/// `Ok` when every value can be stored; else a `Conflict` naming the first field that cannot.
pub fn check(fields: &[(&str, Option<&str>)]) -> Result<()> {
    match fields.iter().find(|(_, v)| v.is_some_and(|v| !storable(v))) {
        Some((field, _)) => Err(StoreError::Conflict(format!(
            "{field} contains a NUL character, which the database cannot store"
        ))),
        None => Ok(()),
    }
}

/// A key that is only compared with other keys, made storable.
pub fn key(s: &str) -> Cow<'_, str> {
    if storable(s) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    }
}
