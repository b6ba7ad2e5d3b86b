//! The Responses API as a client format over the internal form (`canonical`): a request
//! (validated, its input expanded with the stored history) read into a `Request`; an
//! `Answer` written as a response object; the internal form's stream events written as the
//! Responses stream events (each with its `sequence_number`); an error written in OpenAI's
//! shape. Used for every upstream that does not speak the Responses API itself.
//!
//! Reasoning items are carried as `Part::Reasoning` (`encrypted_content` as the signature,
//! the reasoning text or else the summary as the text): an upstream whose adapter can send
//! them back does, one that cannot refuses them by name (`check_upstream`), never drops
//! them.
//!
//! By file: the request in `read` and `items`, the answer, its usage and an error in
//! `answer`, the stream in `events`.

mod answer;
mod events;
mod items;
mod read;

pub use answer::{read_usage, usage_json, write_answer, write_error};
pub use events::EventWriter;
pub use read::{check_upstream, read_request};
