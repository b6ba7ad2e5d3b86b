//! The client-facing endpoints Sluice serves. Its own module, below both the request path
//! (`pipeline`) and the upstream catalog (`upstream`), since both need it and neither
//! should import the other for it.

use crate::error::WireFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// OpenAI's Responses API, `/v1/responses`.
    Responses,
}

impl Endpoint {
    /// `gen_ai.operation.name` (OpenTelemetry GenAI semantic conventions) of the endpoint.
    pub fn gen_ai_operation(self) -> &'static str {
        match self {
            Endpoint::Completions => "text_completion",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Chat | Endpoint::Messages | Endpoint::Responses => "chat",
        }
    }

    /// The body field that carries the input (named by a refusal of its size).
    pub fn input_field(self) -> &'static str {
        match self {
            Endpoint::Chat | Endpoint::Messages => "messages",
            Endpoint::Completions => "prompt",
            Endpoint::Embeddings | Endpoint::Responses => "input",
        }
    }

    pub const ALL: [Endpoint; 5] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Messages,
        Endpoint::Responses,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completions",
            Endpoint::Completions => "completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Messages => "messages",
            Endpoint::Responses => "responses",
        }
    }

    /// The wire format the client speaks on this endpoint.
    pub fn format(self) -> WireFormat {
        match self {
            Endpoint::Messages => WireFormat::Anthropic,
            _ => WireFormat::OpenAi,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn operations_follow_the_semantic_conventions() {
        assert_eq!(Endpoint::Chat.gen_ai_operation(), "chat");
        assert_eq!(Endpoint::Messages.gen_ai_operation(), "chat");
        assert_eq!(Endpoint::Responses.gen_ai_operation(), "chat");
        assert_eq!(Endpoint::Completions.gen_ai_operation(), "text_completion");
        assert_eq!(Endpoint::Embeddings.gen_ai_operation(), "embeddings");
    }
}
