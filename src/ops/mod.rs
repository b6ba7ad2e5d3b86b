//! Running the gateway: the request log writer and background housekeeping.

pub mod alerts;
pub mod audit_head;
pub mod backup;
pub mod fd_limit;
pub mod housekeeping;
pub mod memory;
pub mod metrics;
pub mod migrate_store;
pub mod reload;
pub mod request_log;
pub mod rotate;
pub mod traces;
pub mod warn_gate;
