//! The token figures of one answer, as the upstream reported them (or as counted): the
//! one type the wire adapters fill (`upstream::providers::canonical`) and the pricing
//! prices (`quota::pricing::cost`). A module of its own, below both, so the providers
//! know no money and the pricing no wire format.

/// Token figures as reported by the upstream. Each adapter in reads its format's names
/// into these; `input` is all input tokens, cached and cache-written included (formats
/// that report them apart — Anthropic — are summed by the adapter in). `input` and
/// `output` are the totals; the other figures are parts of them (web-search calls apart),
/// split by `quota::pricing`'s `Usage::parts` so no token is billed twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: i64,
    pub output: i64,
    /// Part of `input` read from the provider's prompt cache.
    pub cached_input: i64,
    /// Part of `input` written to the prompt cache at the five-minute rate.
    pub cache_write_5m: i64,
    /// Part of `input` written to the prompt cache at the one-hour rate.
    pub cache_write_1h: i64,
    /// Part of `cache_write_5m` the upstream reported without a split by lifetime
    /// (Bedrock, Anthropic without `cache_creation`): one-hour writes for all we know.
    pub cache_write_unsplit: i64,
    /// Part of `output` spent on reasoning.
    pub reasoning: i64,
    /// Part of `input` that was audio (OpenAI `prompt_tokens_details.audio_tokens`, Gemini's
    /// `AUDIO` modality).
    pub audio_input: i64,
    /// Part of `input` that was images (Gemini's `IMAGE` modality).
    pub image_input: i64,
    /// Part of `output` that was audio.
    pub audio_output: i64,
    /// Part of `output` that was images.
    pub image_output: i64,
    /// Server-side web-search calls (Anthropic `server_tool_use.web_search_requests`, the
    /// Responses API's `web_search_call` items), billed per call.
    pub web_search_calls: i64,
}
