//! What translation between formats shares: the refusal (`TranslateError`) and the stream
//! converter (`stream`), which joins an upstream format's event reader to a client
//! format's event writer. The adapters themselves are `formats/`, the dispatch
//! `dispatch.rs`; fixtures under `tests/fixtures/{openai,anthropic}/` pin every case.

pub mod stream;

use std::borrow::Cow;

/// A request the other side cannot express; refused with a 400 naming the field (`param`;
/// on chat `None` for a field neither format knows, as OpenAI's chat completions answer an
/// unrecognized argument; the Responses API names it, so its adapter does too, with the
/// client's own key — hence a `Cow`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct TranslateError {
    pub param: Option<Cow<'static, str>>,
    pub message: String,
}
