//! The load checks (CHECKS L1, L2, L3, L5), at sizes that fit a 2-core CI machine: the real
//! binary as a child process, the in-process `sluice mock` upstream, real SQLite and (L3) a
//! real `redis-server`. One test at a time (`rig::one_at_a_time`), so each measures the
//! gateway alone; Cargo runs this binary after or before the api suite, never beside it.
//! L4 (slow readers) is in `tests/api/slow_reader.rs`.

#[allow(dead_code)]
#[path = "../api/gateway_proc.rs"]
mod gateway_proc;
#[allow(dead_code)]
#[path = "../api/helpers.rs"]
mod helpers;
#[allow(dead_code)]
#[path = "../api/pg_gateway_app.rs"]
mod pg_gateway_app;
#[allow(dead_code)]
#[path = "../api/pg_server.rs"]
mod pg_server;
mod rig;

mod admission;
mod fd_limit;
mod soak;
mod streams;
mod throughput;
