//! Integration tests: the real application over HTTP, real SQLite, the in-process mock.

mod admin_helpers;
mod helpers;

mod account;
mod admin;
mod admin_reports;
mod admin_roles;
mod audit_tamper;
mod audit_upgrade;
mod auth;
mod bad_input;
mod cache;
mod cache_guard;
mod cache_precision;
mod clocks;
mod files;
mod fuzz;
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
mod signin_attack;
mod ssrf;
mod streams;
mod translate;
mod windows;
mod windows_redis;
mod windows_tpm;
