//! One adapter per wire format, to and from the internal form (`super::canonical`).

pub mod gemini;
