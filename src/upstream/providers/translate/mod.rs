//! What translation between formats shares: the refusal (`TranslateError`) and the stream
//! converter (`stream`), which joins an upstream format's event reader to a client
//! format's event writer. The adapters themselves are `formats/`, the dispatch
//! `dispatch.rs`; fixtures under `tests/fixtures/{openai,anthropic}/` pin every case.

pub mod stream;

/// A request the other side cannot express; refused with a 400 naming the field (`param`;
/// `None` for a field neither format knows, as OpenAI answers an unrecognized argument).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct TranslateError {
    pub param: Option<&'static str>,
    pub message: String,
}
