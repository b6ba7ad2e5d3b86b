//! Google's Gemini `generateContent` format (the Gemini API and Vertex AI speak the same
//! body), upstream side: the internal form → a `GenerateContentRequest` (`request`), a
//! `GenerateContentResponse` → an answer (`answer`), its SSE chunks → events (`stream`),
//! Google's error body → `ErrorInfo` (`error`).
//!
//! Two things Gemini does its own way, kept consistent here:
//! - **Function calls carry no id.** A function response is matched to its call by *name*.
//!   Answers get synthesized call ids (`call_<answer>_<n>`: stable for one answer, unique
//!   across answers); a tool result sent back names its call by id, and the request
//!   adapter finds the call's name in the conversation (an unknown id is refused).
//! - **Thought signatures ride on the part after the thought** (a function call, a text).
//!   Read, a signature on a part that is not a thought becomes a reasoning part of its own
//!   (empty text, the signature) just before it; written, such a part puts its signature
//!   back on the part that follows it, so a conversation keeps each signature where Gemini
//!   put it.
//!
//! Token figures (`usageMetadata`): `promptTokenCount` already includes the cached part
//! (`cachedContentTokenCount`); `toolUsePromptTokenCount` (tool-use prompts) is input on
//! top of it; `thoughtsTokenCount` is billed as output and is not in
//! `candidatesTokenCount`, so output = candidates + thoughts, reasoning = thoughts.

mod answer;
mod error;
mod request;
mod stream;

pub use answer::{answer_text, read_answer, read_reported, read_usage};
pub use error::{is_quota, names_a_fault, read_error, retry_delay};
pub use request::write_request;
pub use stream::EventReader;

#[cfg(test)]
mod tests;
