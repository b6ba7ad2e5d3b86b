//! The OpenAI chat-completions wire format (also vLLM, Ollama, llama.cpp): its adapter to
//! and from the internal form.

mod answer;
mod read_request;
pub mod stream;
mod write_request;

pub use answer::{
    cache_writes, output_tokens, read_answer, read_error, read_reported, read_usage,
    uncached_audio, write_answer, write_error,
};
pub use read_request::read_request;
pub use stream::{EventReader, EventWriter};
pub use write_request::write_request;
