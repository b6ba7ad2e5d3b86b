//! Requests across formats: an OpenAI chat request for an Anthropic upstream
//! (`from_openai`), and an Anthropic Messages request for an OpenAI upstream
//! (`from_anthropic`). The rule both follow: every field and content block is translated
//! faithfully or refused with a 400 naming it — never dropped. Each side reads the client's
//! body against a list of the fields it knows; a field outside it is refused too. The table
//! of every field is in docs/DESIGN.md ("Two wire formats").

mod from_anthropic;
mod from_openai;

use serde_json::Value;

pub use from_anthropic::anthropic_to_openai;
pub use from_openai::openai_to_anthropic;

use super::TranslateError;

/// The line that marks an OpenAI tool message as a failed tool call: Anthropic's
/// `tool_result.is_error`, which OpenAI's tool messages have no field for. Read back when
/// such a message goes to an Anthropic upstream.
pub const TOOL_ERROR_MARK: &str = "[tool_result is_error=true]\n";

fn refuse(param: &'static str, message: impl Into<String>) -> TranslateError {
    TranslateError {
        param: Some(param),
        message: message.into(),
    }
}

/// A field that has no counterpart on the other side.
fn refuse_field(field: &'static str, upstream: &str) -> TranslateError {
    refuse(
        field,
        format!("`{field}` cannot be sent to an {upstream} model, and Sluice does not drop it."),
    )
}

/// True when a field is absent or holds its default (which the other side has anyway).
fn unset(v: Option<&Value>, default: &Value) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(v) => v == default || (v.is_number() && v.as_f64() == default.as_f64()),
    }
}

/// A `data:` URL's media type and base64 payload.
fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}
