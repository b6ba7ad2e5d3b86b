//! The Anthropic Messages wire format: its adapter to and from the internal form.

mod read_request;
mod write_request;

pub use read_request::read_request;
pub use write_request::write_request;
