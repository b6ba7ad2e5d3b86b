//! What the documents of a request may cost in input tokens. A provider bills a PDF page as
//! its text plus an image of the page (Anthropic documents ~1 500–3 000 tokens a page;
//! OpenAI extracts text and page images alike), so a document's bytes say little and its
//! base64 characters nothing: an inline PDF is reserved at its pages (`pdf::pages`) ×
//! `[finance] document_tokens_per_page`, and a document whose size the gateway cannot know
//! — by URL or provider file id, or bytes whose pages it cannot read — at the whole input
//! the serving model accepts (`max_input_tokens`). A plain-text document is text: the
//! token estimate counts it (`estimate::count_message`), as it counts a document's title,
//! context and file name; only the payload sized here is left out of the estimate.
//!
//! The parts: Anthropic `{"type": "document", "source": {...}}` (`base64` sized, `text` /
//! `content` counted as text, `url` / `file` unknown), OpenAI chat `{"type": "file",
//! "file": {"file_data" | "file_id", "filename"}}` and Responses `{"type": "input_file",
//! "file_data" | "file_id" | "file_url"}`, at content-block positions only (`parts`: a
//! tool result's content too); elsewhere a document-shaped object is text to the provider
//! and to the estimate.

use base64::engine::{general_purpose::GeneralPurpose, DecodePaddingMode, GeneralPurposeConfig};
use base64::Engine;
use serde_json::{Map, Value};

use super::{parts, pdf};

/// The documents of a request; `Documents::default()` for a request without any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Documents {
    /// Pages of the inline PDFs, all together.
    pages: i64,
    /// Tokens reserved per page (`[finance] document_tokens_per_page`).
    per_page: i64,
    /// A document whose size is unknown: the model's whole input is reserved.
    unknown_size: bool,
}

/// Where a document part keeps what `Documents` sizes (and the estimate leaves out).
enum Payload<'a> {
    /// Inline bytes: base64, possibly in a `data:` URL.
    Inline(&'a str),
    /// By URL, by file id, or a source the gateway does not know.
    Unknown,
    /// A plain-text source: counted as text.
    Text,
}

impl Documents {
    /// The documents at the content-block positions of a request body (`parts`).
    pub fn read(body: &Map<String, Value>, per_page: u32) -> Documents {
        let mut out = Documents {
            per_page: i64::from(per_page),
            ..Documents::default()
        };
        parts::each(body, &mut |part| out.size(part));
        out
    }

    fn size(&mut self, part: &Map<String, Value>) {
        match payload(part) {
            Some(Payload::Inline(data)) => match decode(data).as_deref().and_then(pdf::pages) {
                Some(pages) => self.pages = self.pages.saturating_add(pages),
                None => self.unknown_size = true,
            },
            Some(Payload::Unknown) => self.unknown_size = true,
            Some(Payload::Text) | None => {}
        }
    }

    /// The input a request may be billed on a model accepting `max_input` tokens, its
    /// other input being `counted`: that plus its PDFs' pages at the per-page maximum;
    /// with a document of unknown size, at least the model's whole input.
    pub fn input(&self, counted: i64, max_input: i64) -> i64 {
        let sized = counted.saturating_add(self.pages.saturating_mul(self.per_page));
        if self.unknown_size {
            sized.max(max_input)
        } else {
            sized
        }
    }
}

/// A document part's payload, `None` for anything else.
fn payload(part: &Map<String, Value>) -> Option<Payload<'_>> {
    fn text<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
        o.get(k).and_then(Value::as_str)
    }
    match text(part, "type")? {
        "document" => {
            let source = part.get("source")?.as_object()?;
            Some(match text(source, "type") {
                Some("base64") => text(source, "data").map_or(Payload::Unknown, Payload::Inline),
                Some("text" | "content") => Payload::Text,
                _ => Payload::Unknown,
            })
        }
        "file" => {
            let file = part.get("file")?.as_object()?;
            Some(text(file, "file_data").map_or(Payload::Unknown, Payload::Inline))
        }
        "input_file" => Some(text(part, "file_data").map_or(Payload::Unknown, Payload::Inline)),
        _ => None,
    }
}

/// A document part without the payload `Documents` sizes — its title, context, file name,
/// a plain-text source — for the estimate to count; `None` for anything else.
pub(crate) fn without_payload(part: &Map<String, Value>) -> Option<Map<String, Value>> {
    let kind = payload(part)?;
    let keep = |o: &Map<String, Value>, drop: &[&str]| -> Map<String, Value> {
        o.iter()
            .filter(|(k, _)| !drop.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    Some(match part.get("type").and_then(Value::as_str) {
        Some("document") if matches!(kind, Payload::Text) => part.clone(),
        Some("document") => keep(part, &["source"]),
        Some("file") => {
            let mut out = keep(part, &["file"]);
            if let Some(file) = part.get("file").and_then(Value::as_object) {
                out.insert(
                    "file".into(),
                    Value::Object(keep(file, &["file_data", "file_id"])),
                );
            }
            out
        }
        _ => keep(part, &["file_data", "file_id", "file_url"]),
    })
}

/// The bytes of base64 text, bare or in a `data:` URL; whitespace (MIME line breaks) and
/// missing padding are forgiven. `None` when it is not base64.
fn decode(data: &str) -> Option<Vec<u8>> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let b64 = match data.strip_prefix("data:") {
        Some(url) => url.split_once(";base64,")?.1,
        None => data,
    };
    let clean: Vec<u8> = b64.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    LENIENT.decode(clean).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(parts: Value) -> Documents {
        let body = json!({"messages": [{"role": "user", "content": parts}]});
        Documents::read(body.as_object().unwrap(), 3_000)
    }

    fn pdf_b64(pages: usize) -> String {
        let kids: Vec<String> = (0..pages).map(|i| format!("{} 0 R", i + 3)).collect();
        let mut s = format!(
            "%PDF-1.4\n2 0 obj << /Type /Pages /Kids [{}] /Count {pages} >> endobj\n",
            kids.join(" ")
        );
        for i in 0..pages {
            s.push_str(&format!(
                "{} 0 obj << /Type /Page /Parent 2 0 R >> endobj\n",
                i + 3
            ));
        }
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn every_clients_inline_pdf_is_sized_by_its_pages() {
        let d = pdf_b64(3);
        let parts = json!([
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": d}},
            {"type": "file", "file": {"filename": "a.pdf", "file_data": format!("data:application/pdf;base64,{d}")}},
            {"type": "input_file", "file_data": d.trim_end_matches('=')},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
        ]);
        let docs = read(parts);
        assert_eq!((docs.pages, docs.unknown_size), (9, false));
        assert_eq!(docs.input(100, 128_000), 100 + 9 * 3_000);
    }

    #[test]
    fn a_document_of_unknown_size_reserves_the_whole_input() {
        for part in [
            json!({"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}),
            json!({"type": "document", "source": {"type": "file", "file_id": "file_1"}}),
            json!({"type": "file", "file": {"file_id": "file-1"}}),
            json!({"type": "input_file", "file_id": "file-1"}),
            json!({"type": "input_file", "file_url": "https://x/a.pdf"}),
            json!({"type": "input_file", "file_data": "JVBERi0xLjQK"}),
            json!({"type": "file", "file": {"file_data": "not base64!"}}),
        ] {
            let docs = read(json!([part.clone()]));
            assert!(docs.unknown_size, "{part}");
            assert_eq!(docs.input(100, 128_000), 128_000, "{part}");
            assert_eq!(docs.input(200_000, 128_000), 200_000, "{part}");
        }
        assert_eq!(
            read(json!([{"type": "text", "text": "hi"}])).input(5, 128_000),
            5
        );
    }

    #[test]
    fn a_document_shape_outside_the_content_is_no_document() {
        let shaped = json!({"type": "document", "source": {"type": "url", "url": "https://x"}});
        let body = json!({"tools": [{"input_schema": {"default": shaped}}], "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": shaped}]}]});
        assert_eq!(
            Documents::read(body.as_object().unwrap(), 3_000).input(5, 128_000),
            5
        );
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [shaped]}]}]});
        assert!(Documents::read(body.as_object().unwrap(), 3_000).unknown_size);
        let body = json!({"input": [{"type": "function_call_output", "call_id": "c",
            "output": [{"type": "input_file", "file_id": "f"}]}]});
        assert!(Documents::read(body.as_object().unwrap(), 3_000).unknown_size);
    }

    #[test]
    fn the_estimate_keeps_a_documents_text_and_leaves_its_payload() {
        let part = json!({"type": "document", "title": "T", "context": "C",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "AAAA"}});
        let kept = without_payload(part.as_object().unwrap()).unwrap();
        assert_eq!(
            Value::Object(kept),
            json!({"type": "document", "title": "T", "context": "C"})
        );
        let part = json!({"type": "file", "file": {"filename": "a.pdf", "file_data": "AAAA"}});
        let kept = without_payload(part.as_object().unwrap()).unwrap();
        assert_eq!(
            Value::Object(kept),
            json!({"type": "file", "file": {"filename": "a.pdf"}})
        );
        let text = json!({"type": "document", "source": {"type": "text", "data": "every word"}});
        assert_eq!(
            without_payload(text.as_object().unwrap()).unwrap(),
            *text.as_object().unwrap()
        );
        assert!(
            without_payload(json!({"type": "text", "text": "x"}).as_object().unwrap()).is_none()
        );
    }
}
