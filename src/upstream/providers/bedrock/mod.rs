//! The `bedrock` provider's transport: where a Converse call goes, how it is
//! authenticated (SigV4 or a Bedrock API key), and how its binary event stream is framed.
//! The wire format itself (bodies, answers, events, errors) is `formats::bedrock`.

pub mod eventstream;
pub mod sigv4;
