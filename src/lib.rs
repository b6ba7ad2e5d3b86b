//! Sluice: a self-hosted LLM API gateway for teams. See `docs/DESIGN.md` for the design as
//! built; `pipeline` is the request path stage by stage.

// No panic on any input: outside tests an `unwrap` or `expect` is refused, but where it
// cannot fail, allowed on its function with a `// cannot fail: …` comment saying why.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
pub mod api;
pub mod auth;
pub mod body;
pub mod cache;
pub mod cli;
pub mod client_addr;
pub mod clock;
pub mod config;
pub mod endpoint;
pub mod error;
pub mod finance;
pub mod mock;
pub mod ops;
pub mod pipeline;
pub mod private_fs;
pub mod queue;
pub mod quota;
pub mod ratelimit;
pub mod secrets;
pub mod startup;
pub mod state;
pub mod store;
pub mod tags;
pub mod upstream;
pub mod usage;
