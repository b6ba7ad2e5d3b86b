//! Integration tests: the real application over HTTP, real SQLite, the in-process mock.

mod admin_helpers;
mod helpers;

mod admin;
mod admin_reports;
mod admin_roles;
mod auth;
mod bad_input;
mod processes;
mod proxy;
mod quota;
mod streams;
mod windows;
