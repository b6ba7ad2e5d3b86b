//! Integration tests: the real application over HTTP, real SQLite, the in-process mock.

mod admin_helpers;
mod helpers;

mod admin;
mod admin_reports;
mod admin_roles;
mod auth;
mod bad_input;
mod cache;
mod clocks;
mod money;
mod money_model;
mod operations;
mod processes;
mod proxy;
mod queue;
mod quota;
mod reasoning;
mod resilience;
mod retry_tiers;
mod streams;
mod translate;
mod translate_fuzz;
mod translate_roundtrip;
mod translate_wire;
mod windows;
mod windows_redis;
mod windows_tpm;
