//! The PostgreSQL versions of the store's modules that are not money (the money path is
//! `pg::ledger`, `pg::processes`, `pg::writer`). Each mirrors the SQLite module of the same
//! name function for function: same names, same argument and result types (the row structs
//! are the SQLite modules'), `&PgPool` / `&mut PgConnection` in place of SQLite's.
//! Temporary home of this list: folded into `pg/mod.rs` at merge.

pub mod admins;
pub mod audit;
pub mod cache;
pub mod directory;
pub mod lingering;
pub mod notify;
pub mod reports;
pub mod requests;
pub mod sessions;
pub mod tenants;
pub mod text;
pub mod token_admin;
pub mod tokens;
