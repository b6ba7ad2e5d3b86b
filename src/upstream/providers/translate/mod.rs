//! OpenAI ↔ Anthropic translation, in one place: requests (`request`), whole answers and
//! error bodies (`response`), and streams event by event (`stream`). Fixtures under
//! `tests/fixtures/{openai,anthropic}/` pin every case.

pub mod response;
pub mod stream;

/// A request the other side cannot express; refused with a 400 naming the field (`param`;
/// `None` for a field neither format knows, as OpenAI answers an unrecognized argument).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct TranslateError {
    pub param: Option<&'static str>,
    pub message: String,
}
