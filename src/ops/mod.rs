//! Running the gateway: the request log writer and background housekeeping.

pub mod housekeeping;
pub mod request_log;
