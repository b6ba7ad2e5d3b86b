//! Provider wire formats. Only these files know what an OpenAI or Anthropic body looks like
//! on the wire.

pub mod openai;
