//! One module per wire format, each an adapter to and from the internal form
//! (`providers::canonical`).

pub mod bedrock;
