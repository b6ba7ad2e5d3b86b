//! Documents and files are reserved for what providers bill, not for their strings: a PDF
//! page is billed as its text plus an image of it (Anthropic documents ~1 500–3 000 tokens
//! a page), so an inline PDF reserves its pages × `[finance] document_tokens_per_page`
//! (3 000) and its base64 is not counted as text; a document the gateway cannot size (by
//! URL, by file id, bytes whose pages it cannot read) reserves the model's
//! `max_input_tokens`. Hosted Responses tools are refused by name, and a translated route
//! refuses a document it cannot carry rather than dropping it.

use base64::Engine;
use serde_json::{json, Value};
use sluice::quota::estimate::{chat_input, count_text};
use sluice::quota::pricing::{cost, input_with_margin, Prices};
use sluice::usage::Usage;

use crate::helpers::*;
use crate::responses::{charged, create, last_reserve, last_sent};

/// The test models' price: $0.15 / $0.60 per million tokens.
fn prices() -> Prices {
    Prices::plain(150_000, 600_000)
}

/// A minimal valid PDF of `pages` empty letter pages: a catalog, a pages tree, the page
/// objects, and a cross-reference table with their real offsets.
pub fn pdf(pages: usize) -> Vec<u8> {
    let mut objects = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} >>",
            (0..pages)
                .map(|i| format!("{} 0 R", i + 3))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    ];
    for _ in 0..pages {
        objects.push("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>".into());
    }
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend(format!("{} 0 obj\n{o}\nendobj\n", i + 1).bytes());
    }
    let xref = out.len();
    out.extend(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).bytes());
    for off in offsets {
        out.extend(format!("{off:010} 00000 n \n").bytes());
    }
    out.extend(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .bytes(),
    );
    out
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A budget of exactly `micros` micro-dollars, as the token CLI reads it.
fn usd(micros: i64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// The worst case of a request whose input reserves `input` tokens (before the margin)
/// and whose output cap is `cap`, at the test price with the default margin.
fn worst(input: i64, cap: i64) -> i64 {
    let usage = Usage {
        input: input_with_margin(input, 1.10, 16),
        output: cap,
        ..Usage::default()
    };
    cost(usage, prices())
}

/// A chat message asking about a 3-page PDF sent inline.
fn chat_pdf_message(pages: usize) -> Value {
    let data = format!("data:application/pdf;base64,{}", b64(&pdf(pages)));
    json!({"role": "user", "content": [
        {"type": "text", "text": "Summarise the maintenance schedule."},
        {"type": "file", "file": {"filename": "manual.pdf", "file_data": data}}]})
}

/// The same message without the document's bytes: what is counted as text.
fn without(mut message: Value, pointer: &str, key: &str) -> Value {
    message
        .pointer_mut(pointer)
        .and_then(Value::as_object_mut)
        .expect("the document part")
        .remove(key);
    message
}

/// Three PDF pages are billed up to ~9 000 tokens (text plus a page image each) while their
/// ~800 base64 characters count a few hundred: the reservation was far below what the
/// upstream bills, and the difference absorbed. Now a budget one micro-dollar under
/// pages × 3 000 (plus the text, with the margin) is refused before the upstream, and an
/// answer without usage is charged that input.
#[tokio::test]
async fn an_inline_pdf_is_reserved_at_its_pages_times_the_per_page_maximum() {
    let app = spawn_app().await;
    let message = chat_pdf_message(3);
    let text = chat_input(
        &[without(message.clone(), "/content/1/file", "file_data")],
        None,
    );
    let input = text + 3 * 3_000;
    let reserve = worst(input, 50);
    assert!(reserve > worst(3 * 1_500, 50), "{reserve}");
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [message]});

    let (_, short) = app.token("short", Some(&usd(reserve - 1))).await;
    let resp = app.chat(&short, &body).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        status, 429,
        "a budget under pages × 3 000 was served: {answer}"
    );
    assert_eq!(answer["error"]["code"], "insufficient_quota", "{answer}");
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached the upstream"
    );

    // Exactly the reservation: served; an answer without usage is charged the input
    // reserved for (pages × 3 000 and the text) and the counted output.
    let (id, enough) = app.token("enough", Some(&usd(reserve))).await;
    app.mock.state.script(
        KEY_A,
        [sluice::mock::Script {
            omit_usage: true,
            ..sluice::mock::Script::default()
        }],
    );
    let resp = app.chat(&enough, &body).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    let said = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(last_reserve(&app, id).await, reserve);
    let output = count_text(said);
    let want = cost(
        Usage {
            input,
            output,
            ..Usage::default()
        },
        prices(),
    );
    assert_eq!(charged(&app, id).await, want);
    app.assert_invariant().await;
}

/// The same on Anthropic's own format and upstream: a base64 `document` block.
#[tokio::test]
async fn an_anthropic_pdf_document_is_reserved_at_its_pages() {
    let app = spawn_app_with_claude().await;
    let message = json!({"role": "user", "content": [
        {"type": "document", "title": "manual.pdf",
         "source": {"type": "base64", "media_type": "application/pdf", "data": b64(&pdf(4))}},
        {"type": "text", "text": "Summarise the maintenance schedule."}]});
    let text = chat_input(
        &[without(message.clone(), "/content/0/source", "data")],
        None,
    );
    let reserve = worst(text + 4 * 3_000, 64);
    let (id, token) = app.token("anthropic-pdf", Some(&usd(reserve))).await;
    let body = json!({"model": "claude", "max_tokens": 64, "messages": [message]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(last_reserve(&app, id).await, reserve);
    app.wait_settled().await;
    app.assert_invariant().await;
}

/// A document by URL or by file id: the upstream reads the whole of it, the gateway sees
/// a name. Its size is unknown, so the request reserves the model's `max_input_tokens`
/// (128 000 on the test models) — before, the URL's few tokens.
#[tokio::test]
async fn a_document_by_url_or_file_id_reserves_the_models_max_input() {
    let app = spawn_app_with_claude().await;
    let reserve = worst(128_000, 64);
    let cases = [
        (
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "url", "url": "https://example.com/manual.pdf"}},
                {"type": "text", "text": "Summarise it."}]}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "file", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"}},
                {"type": "text", "text": "Summarise it."}]}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 64, "messages": [{"role": "user", "content": [
                {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
                {"type": "text", "text": "Summarise it."}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "max_output_tokens": 64, "input": [{"role": "user", "content": [
                {"type": "input_file", "file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"},
                {"type": "input_text", "text": "Summarise it."}]}]}),
        ),
        // Bytes that are no PDF whose pages can be read: the same as unknown.
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 64, "messages": [{"role": "user", "content": [
                {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQK"}}]}]}),
        ),
    ];
    for (i, (path, body)) in cases.iter().enumerate() {
        let (_, short) = app
            .token(&format!("short-{i}"), Some(&usd(reserve - 1)))
            .await;
        let resp = if *path == "/v1/messages" {
            app.messages(&short, body).await
        } else {
            app.post(path, &short, body).await
        };
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 429, "{path} {body}: {answer}");
        assert_eq!(
            app.mock.state.total_count(),
            0,
            "{path}: reached the upstream"
        );

        let (id, enough) = app.token(&format!("enough-{i}"), Some(&usd(reserve))).await;
        let resp = if *path == "/v1/messages" {
            app.messages(&enough, body).await
        } else {
            app.post(path, &enough, body).await
        };
        assert_eq!(resp.status(), 200, "{path} {body}");
        resp.bytes().await.unwrap();
        assert_eq!(last_reserve(&app, id).await, reserve, "{path} {body}");
        app.wait_settled().await;
        app.mock.state.reset();
    }
    app.assert_invariant().await;
}

/// A document of unknown size may push the prompt past a long-context tier the gateway
/// does not price: on a model whose `max_input_tokens` passes the threshold it is refused
/// (400 naming the input) before anything is sent.
#[tokio::test]
async fn a_document_of_unknown_size_on_a_long_context_model_is_refused() {
    let app = spawn_app_with(|s, m| {
        let mut c = upstream("c", KEY_B, m);
        c.provider = sluice::config::Provider::Anthropic;
        c.base_url = m.base_url();
        s.upstreams.push(c);
        let mut sonnet = model("sonnet", &["c"]);
        sonnet.routes[0].model = "claude-sonnet-4-5".into();
        sonnet.max_input_tokens = 1_000_000;
        s.models.push(sonnet);
    })
    .await;
    let (id, token) = app.token("long", Some("100")).await;
    let body = json!({"model": "sonnet", "max_tokens": 64, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/book.pdf"}},
        {"type": "text", "text": "Summarise it."}]}]});
    let resp = app.messages(&token, &body).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 400, "{answer}");
    assert_eq!(app.mock.state.total_count(), 0);
    assert_eq!(charged(&app, id).await, 0);
}

/// Hosted Responses tools are billed per call apart from tokens: each is refused by name,
/// naming `tools`, before any upstream.
#[tokio::test]
async fn every_hosted_responses_tool_is_refused_naming_tools() {
    let app = spawn_app().await;
    let (id, token) = app.token("hosted", Some("10")).await;
    for tool in [
        json!({"type": "web_search"}),
        json!({"type": "web_search_preview"}),
        json!({"type": "file_search", "vector_store_ids": ["vs_1"]}),
        json!({"type": "code_interpreter", "container": {"type": "auto"}}),
        json!({"type": "image_generation"}),
        json!({"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp"}),
        json!({"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "browser"}),
    ] {
        let kind = tool["type"].as_str().unwrap().to_string();
        let body = json!({"model": "gpt-4o-mini", "input": "hi", "tools": [tool]});
        let (status, r) = create(&app, &token, &body).await;
        assert_eq!(status, 400, "{kind}: {r}");
        assert_eq!(r["error"]["param"], "tools", "{kind}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(&kind),
            "{kind}: {r}"
        );
    }
    assert_eq!(app.mock.state.total_count(), 0);
    assert_eq!(charged(&app, id).await, 0);
}

/// A translated route carries an inline PDF as the upstream's document and refuses, by
/// name, a document it cannot carry: never a silent drop.
#[tokio::test]
async fn a_translated_route_carries_a_pdf_or_refuses_the_document() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("translated", None).await;
    // An OpenAI chat client's PDF reaches Anthropic as a document block.
    let body = json!({"model": "claude", "max_tokens": 20, "messages": [chat_pdf_message(2)]});
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let sent = last_sent(&app, KEY_B);
    assert_eq!(
        sent["messages"][0]["content"][1]["type"], "document",
        "{sent}"
    );
    assert_eq!(
        sent["messages"][0]["content"][1]["source"]["data"],
        b64(&pdf(2))
    );
    // A Responses client's PDF too.
    let body = json!({"model": "claude", "max_output_tokens": 20, "input": [{"role": "user", "content": [
        {"type": "input_file", "filename": "m.pdf", "file_data": format!("data:application/pdf;base64,{}", b64(&pdf(2)))},
        {"type": "input_text", "text": "Summarise it."}]}]});
    let (status, r) = create(&app, &token, &body).await;
    assert_eq!(status, 200, "{r}");
    let sent = last_sent(&app, KEY_B);
    assert_eq!(
        sent["messages"][0]["content"][0]["type"], "document",
        "{sent}"
    );
    let sent_before = app.mock.state.total_count();
    // What the other side has no place for is refused naming the field.
    let refused = [
        (
            "/v1/chat/completions",
            json!({"model": "claude", "max_tokens": 20, "messages": [{"role": "user", "content": [
                {"type": "file", "file": {"file_id": "file-abc"}}]}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "file", "file_id": "file_011"}}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "claude", "max_output_tokens": 20, "input": [{"role": "user", "content": [
                {"type": "input_file", "file_id": "file-abc"}]}]}),
        ),
    ];
    for (path, body) in refused {
        let resp = if path == "/v1/messages" {
            app.messages(&token, &body).await
        } else {
            app.post(path, &token, &body).await
        };
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 400, "{path} {body}: {answer}");
        let named = answer["error"]["param"]
            .as_str()
            .or_else(|| answer["error"]["message"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(
            ["messages", "input", "file", "document"]
                .iter()
                .any(|f| named.contains(f)),
            "{path}: {answer}"
        );
    }
    assert_eq!(
        app.mock.state.total_count(),
        sent_before,
        "refused ones sent"
    );
    app.wait_settled().await;
    app.assert_invariant().await;
}

/// A document or image is one only where the provider reads parts: a content block. A
/// part-shaped object elsewhere — a `tool_use` input, a tool's schema — is JSON the
/// provider reads as text, but its payload was left out of the estimate (and an image
/// counted at the flat figure): ~600 000 characters of it passed the 128 000-token
/// `max_input_tokens` check and reserved a few thousand tokens. Now it counts as text and
/// the request is refused (400) before the upstream.
#[tokio::test]
async fn a_part_shaped_object_outside_the_content_counts_as_text() {
    let app = spawn_app_with_claude().await;
    // One real PDF page padded with bytes a tokenizer cannot compress.
    let mut bytes = pdf(1);
    let mut x: u32 = 0x9e37_79b9;
    bytes.extend((0..450_000).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as u8
    }));
    let big = b64(&bytes);
    assert!(
        count_text(&big) > 128_000,
        "the payload must exceed the model's input"
    );
    let data_url = format!("data:application/pdf;base64,{big}");
    let tool_turn = |input: Value| {
        json!({"model": "claude", "max_tokens": 64, "messages": [
            {"role": "user", "content": "Read the file."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]}]})
    };
    let schema = |default: Value| json!({"type": "object", "properties": {"f": {"type": "object", "default": default}}});
    let cases = [
        (
            "/v1/messages",
            tool_turn(json!({"type": "input_file", "file_data": big})),
        ),
        (
            "/v1/messages",
            tool_turn(json!({"type": "document", "source": {"type": "url", "x": big}})),
        ),
        (
            "/v1/messages",
            tool_turn(
                json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": big}}),
            ),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "f",
                    "parameters": schema(json!({"type": "file", "file": {"file_data": data_url}}))}}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "max_output_tokens": 64, "input": "hi",
                "tools": [{"type": "function", "name": "f",
                    "parameters": schema(json!({"type": "input_image", "image_url": data_url}))}]}),
        ),
    ];
    let (id, token) = app.token("shaped", Some("1")).await;
    for (path, body) in cases {
        let resp = if path == "/v1/messages" {
            app.messages(&token, &body).await
        } else {
            app.post(path, &token, &body).await
        };
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        let said = answer["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            status, 400,
            "{path}: served with the payload unseen: {answer}"
        );
        assert!(said.contains("accepts at most 128000"), "{path}: {answer}");
    }
    assert_eq!(app.mock.state.total_count(), 0, "reached the upstream");
    assert_eq!(charged(&app, id).await, 0);
}
