//! One module per wire format (the adapters of `canonical`).

pub mod responses;
