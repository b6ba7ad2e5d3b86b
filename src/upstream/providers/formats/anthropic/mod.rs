//! The Anthropic Messages wire format: its adapter to and from the internal form.

mod answer;
mod read_request;
pub mod stream;
mod write_request;

pub use answer::{
    answer_usage, input_of, is_search_error, is_web_search_call, read_answer, read_error,
    read_usage, write_answer, write_error,
};
pub use read_request::read_request;
pub use stream::{EventReader, EventWriter};
pub use write_request::write_request;
