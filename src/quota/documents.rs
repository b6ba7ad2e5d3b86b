//! What the documents of a request may cost in input tokens. A provider bills a PDF page as
//! its text plus an image of the page (Anthropic documents ~1 500–3 000 tokens a page;
//! OpenAI extracts text and page images alike), so a document's bytes say little and its
//! base64 characters nothing — and no provider bounds a page: one page of small text in a
//! compressed content stream, or a form reused on every page, may be billed ~190 000
//! tokens. So a request carrying a document is **reserved** at least the whole input the
//! serving model accepts (`max_input_tokens`), an inline PDF as much as a document the
//! gateway cannot size (by URL or provider file id, bytes it cannot read as a PDF). Where
//! the gateway must **charge** from its own count (no usage came back, the client left) it
//! charges an estimate instead: a readable PDF's pages (`pdf::pages`) × `[finance]
//! document_tokens_per_page`, a document of unknown size `UNKNOWN_DOCUMENT_PAGES` such
//! pages. A plain-text document is text: the token estimate counts it
//! (`estimate::count_message`), as it counts a document's title, context and file name;
//! only the payload sized here is left out of the estimate.
//!
//! The parts: Anthropic `{"type": "document", "source": {...}}` (`base64` sized, `text` /
//! `content` counted as text, `url` / `file` unknown), OpenAI chat `{"type": "file",
//! "file": {"file_data" | "file_id", "filename"}}` and Responses `{"type": "input_file",
//! "file_data" | "file_id" | "file_url"}`, at content-block positions only (`parts`: a
//! tool result's content too); elsewhere a document-shaped object is text to the provider
//! and to the estimate. Bytes are read as a PDF only when the part declares one (its media
//! type, its data URL's type, its file name — each given must say PDF) and names no file
//! by reference besides (`file_id`, `file_url`, `url`): else the provider reads them as
//! whatever they are declared, or bills the file referred to, and their size is unknown.

use base64::engine::{general_purpose::GeneralPurpose, DecodePaddingMode, GeneralPurposeConfig};
use base64::Engine;
use serde_json::{Map, Value};

use super::{parts, pdf};

/// The pages a document of unknown size is estimated at when the gateway must charge from
/// its own count (`Documents::estimated`): a typical report's length, well under the 100
/// pages Anthropic and OpenAI take in one request. It is an estimate, never a bound: the
/// reservation holds the model's whole input, and the row of a charge counted so says it
/// (`usage_estimated`, or `client_disconnected` for a client that left).
pub const UNKNOWN_DOCUMENT_PAGES: i64 = 10;

/// The documents of a request; `Documents::default()` for a request without any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Documents {
    /// Pages of the inline PDFs, all together.
    pages: i64,
    /// Tokens estimated per page (`[finance] document_tokens_per_page`).
    per_page: i64,
    /// Documents whose size is unknown.
    unknown: i64,
}

/// Where a document part keeps what `Documents` sizes (and the estimate leaves out).
enum Payload<'a> {
    /// Inline bytes of a declared PDF: base64, possibly in a `data:` URL.
    Inline(&'a str),
    /// By URL, by file id, bytes not declared a PDF, or a source the gateway does not know.
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
                None => self.unknown = self.unknown.saturating_add(1),
            },
            Some(Payload::Unknown) => self.unknown = self.unknown.saturating_add(1),
            Some(Payload::Text) | None => {}
        }
    }

    /// The input a request is reserved on a model accepting `max_input` tokens, its other
    /// input being `counted`: with any document, at least the model's whole input (no
    /// provider bounds what a page or a file is billed); never below the estimate.
    pub fn reserved(&self, counted: i64, max_input: i64) -> i64 {
        let estimated = self.estimated(counted);
        if self.pages > 0 || self.unknown > 0 {
            estimated.max(max_input)
        } else {
            estimated
        }
    }

    /// The input the gateway charges when it counts the usage itself (no usage came back,
    /// the client left): `counted` plus the PDFs' pages and `UNKNOWN_DOCUMENT_PAGES` for
    /// each document of unknown size, at the per-page figure.
    pub fn estimated(&self, counted: i64) -> i64 {
        let unknown_pages = self.unknown.saturating_mul(UNKNOWN_DOCUMENT_PAGES);
        let pages = self.pages.saturating_add(unknown_pages);
        counted.saturating_add(pages.saturating_mul(self.per_page))
    }
}

/// A document part's payload, `None` for anything else.
fn payload(part: &Map<String, Value>) -> Option<Payload<'_>> {
    match text(part, "type")? {
        "document" => {
            let source = part.get("source")?.as_object()?;
            Some(match text(source, "type") {
                Some("base64") => inline(source, "data", text(source, "media_type"), None),
                Some("text" | "content") => Payload::Text,
                _ => Payload::Unknown,
            })
        }
        "file" => {
            let file = part.get("file")?.as_object()?;
            Some(inline(file, "file_data", None, text(file, "filename")))
        }
        "input_file" => Some(inline(part, "file_data", None, text(part, "filename"))),
        _ => None,
    }
}

fn text<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    o.get(k).and_then(Value::as_str)
}

/// The bytes at `holder[key]` when they are a PDF to the provider: declared one by every
/// declaration given (`media_type`, the data URL's type, `filename`; at least one), with
/// no file named by reference beside them — else of unknown size.
fn inline<'a>(
    holder: &'a Map<String, Value>,
    key: &str,
    media_type: Option<&str>,
    filename: Option<&str>,
) -> Payload<'a> {
    const BY_REFERENCE: [&str; 3] = ["file_id", "file_url", "url"];
    let Some(data) = text(holder, key) else {
        return Payload::Unknown;
    };
    if BY_REFERENCE
        .iter()
        .any(|k| holder.get(*k).is_some_and(|v| !v.is_null()))
    {
        return Payload::Unknown;
    }
    let url_type = data
        .strip_prefix("data:")
        .map(|url| url.split([';', ',']).next().unwrap_or_default());
    let is_pdf_type = |t: &str| t.trim().eq_ignore_ascii_case("application/pdf");
    let is_pdf_name = |n: &str| {
        let n = n.trim().as_bytes();
        n.len() >= 4 && n[n.len() - 4..].eq_ignore_ascii_case(b".pdf")
    };
    let declared = [
        media_type.map(is_pdf_type),
        url_type.map(is_pdf_type),
        filename.map(is_pdf_name),
    ];
    let mut said = declared.into_iter().flatten().peekable();
    if said.peek().is_some() && said.all(|pdf| pdf) {
        Payload::Inline(data)
    } else {
        Payload::Unknown
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
            {"type": "input_file", "filename": "a.pdf", "file_data": d.trim_end_matches('=')},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
        ]);
        let docs = read(parts);
        assert_eq!((docs.pages, docs.unknown), (9, 0));
        // Reserved at the model's whole input, charged from the gateway's count at pages.
        assert_eq!(docs.reserved(100, 128_000), 128_000);
        assert_eq!(docs.estimated(100), 100 + 9 * 3_000);
        // Pages past the model's input: reserved at them too.
        assert_eq!(docs.reserved(100, 20_000), 100 + 9 * 3_000);
    }

    #[test]
    fn a_document_of_unknown_size_reserves_the_whole_input_and_is_estimated_at_ten_pages() {
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
            assert_eq!(docs.unknown, 1, "{part}");
            assert_eq!(docs.reserved(100, 128_000), 128_000, "{part}");
            assert_eq!(docs.reserved(200_000, 128_000), 230_000, "{part}");
            assert_eq!(docs.estimated(100), 100 + 10 * 3_000, "{part}");
        }
        let none = read(json!([{"type": "text", "text": "hi"}]));
        assert_eq!((none.reserved(5, 128_000), none.estimated(5)), (5, 5));
    }

    /// Bytes that begin `%PDF-` are a PDF to the provider only when the part says so: a
    /// part declared as text (media type, data-URL type, file name) or declaring nothing
    /// is billed as the provider reads it, so its size is unknown; and a part naming a
    /// file by reference as well as carrying bytes may be billed for the reference.
    #[test]
    fn only_a_part_that_declares_a_pdf_and_carries_only_bytes_is_sized_by_its_pages() {
        let d = pdf_b64(3);
        for part in [
            json!({"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": d}}),
            json!({"type": "document", "source": {"type": "base64", "data": d}}),
            json!({"type": "file", "file": {"filename": "a.txt", "file_data": format!("data:application/pdf;base64,{d}")}}),
            json!({"type": "file", "file": {"filename": "a.pdf", "file_data": format!("data:text/plain;base64,{d}")}}),
            json!({"type": "input_file", "file_data": d}),
            json!({"type": "file", "file": {"filename": "a.pdf", "file_data": d, "file_id": "file-1"}}),
            json!({"type": "input_file", "filename": "a.pdf", "file_data": d, "file_url": "https://x/b.pdf"}),
            json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": d, "url": "https://x/b.pdf"}}),
        ] {
            let docs = read(json!([part.clone()]));
            assert_eq!((docs.pages, docs.unknown), (0, 1), "{part}");
        }
        let declared = json!({"type": "input_file", "filename": "A.PDF", "file_data": d});
        assert_eq!(read(json!([declared])).pages, 3);
    }

    /// A PDF fetched by `web_fetch` and echoed back in the history is a document the
    /// provider reads again; a content document's blocks are parts too.
    #[test]
    fn a_fetched_pdf_and_a_content_documents_blocks_are_sized() {
        let fetched = json!({"type": "web_fetch_tool_result", "tool_use_id": "s",
            "content": {"type": "web_fetch_result", "url": "https://x/a.pdf", "content": {
                "type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                    "data": pdf_b64(2)}}}});
        assert_eq!(
            (read(json!([fetched])).pages, read(json!([])).pages),
            (2, 0)
        );
        let content = json!({"type": "document", "source": {"type": "content", "content": [
            {"type": "document", "source": {"type": "url", "url": "https://x/b.pdf"}}]}});
        assert_eq!(read(json!([content])).unknown, 1);
    }

    #[test]
    fn a_document_shape_outside_the_content_is_no_document() {
        let shaped = json!({"type": "document", "source": {"type": "url", "url": "https://x"}});
        let body = json!({"tools": [{"input_schema": {"default": shaped}}], "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": shaped}]}]});
        assert_eq!(
            Documents::read(body.as_object().unwrap(), 3_000).reserved(5, 128_000),
            5
        );
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [shaped]}]}]});
        assert_eq!(Documents::read(body.as_object().unwrap(), 3_000).unknown, 1);
        let body = json!({"input": [{"type": "function_call_output", "call_id": "c",
            "output": [{"type": "input_file", "file_id": "f"}]}]});
        assert_eq!(Documents::read(body.as_object().unwrap(), 3_000).unknown, 1);
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
