//! Documents and files are reserved for what providers may bill, not for their strings: no
//! provider bounds a page's tokens (one page may hold ~190 000 tokens of text), so an
//! inline PDF — like a document the gateway cannot size (by URL, by file id, bytes whose
//! pages it cannot read) — reserves the model's `max_input_tokens`; where the gateway must
//! charge from its own count (no usage came back, the client left) a readable PDF is its
//! pages × `[finance] document_tokens_per_page` (3 000) and a document of unknown size
//! `UNKNOWN_DOCUMENT_PAGES` (10) such pages, the row marked `usage_estimated`. Hosted
//! Responses tools are refused by name, and a translated route refuses a document it
//! cannot carry rather than dropping it.

use base64::Engine;
use serde_json::{json, Value};
use sluice::config::{PriceKeys, Provider};
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

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A budget of exactly `micros` micro-dollars, as the token CLI reads it.
fn usd(micros: i64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// The worst case of a request whose input reserves `input` tokens (before the margin)
/// and whose output cap is `cap`, at the test price with the default margin.
fn worst(input: i64, cap: i64) -> i64 {
    priced(input_with_margin(input, 1.10, 16), cap)
}

/// `input` and `output` tokens at the test price.
fn priced(input: i64, output: i64) -> i64 {
    cost(
        Usage {
            input,
            output,
            ..Usage::default()
        },
        prices(),
    )
}

/// An app with an Anthropic upstream `c` (key `key`) serving Claude Sonnet 4.5 (long-context
/// tiered above 200 000 input tokens) as `sonnet`, at `price`, taking `max_input_tokens`.
async fn sonnet_app(key: &str, max_input_tokens: u32, price: PriceKeys) -> TestApp {
    spawn_app_with(|s, m| {
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "c", key, m));
        let mut sonnet = model("sonnet", &["c"]);
        sonnet.routes[0].model = "claude-sonnet-4-5".into();
        sonnet.price = price;
        sonnet.max_input_tokens = max_input_tokens;
        s.models.push(sonnet);
    })
    .await
}

/// A chat message asking about a 3-page PDF sent inline.
pub fn chat_pdf_message(pages: usize) -> Value {
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

/// One PDF page can hold ~190 000 tokens of text (compressed content streams, a form
/// reused on every page): pages × 3 000 was no worst case, and the excess was absorbed.
/// Now an inline PDF reserves the model's whole input (128 000 here): a budget one
/// micro-dollar under that is refused before the upstream (before: served, reserved at
/// pages × 3 000 and the text); an answer without usage is still charged the estimate,
/// pages × 3 000 and the text, and its row says the usage was estimated.
#[tokio::test]
async fn an_inline_pdf_is_reserved_at_the_models_whole_input_and_charged_its_pages() {
    let app = spawn_app().await;
    let message = chat_pdf_message(3);
    let text = chat_input(
        &[without(message.clone(), "/content/1/file", "file_data")],
        None,
    );
    let input = text + 3 * 3_000;
    let reserve = worst(128_000, 50);
    assert_eq!(
        reserve, 21_153,
        "(128 000 × 1.10 + 16) × 0.15 + 50 × 0.60, rounded up"
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [message]});

    let (_, short) = app.token("short", Some(&usd(reserve - 1))).await;
    let resp = app.chat(&short, &body).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        status, 429,
        "a budget under the model's whole input was served: {answer}"
    );
    assert_eq!(answer["error"]["code"], "insufficient_quota", "{answer}");
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached the upstream"
    );

    // Exactly the reservation: served; an answer without usage is charged the estimate
    // (pages × 3 000 and the text) and the counted output.
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
    let want = priced(input, count_text(said));
    assert_eq!(charged(&app, id).await, want);
    assert_eq!(estimated_rows(&app, id).await, 1);
    app.assert_invariant().await;
}

/// The rows of a token whose usage the gateway estimated (no usage came back).
async fn estimated_rows(app: &TestApp, token_id: i64) -> i64 {
    app.wait_for_log_rows(1).await;
    app.scalar(&format!(
        "SELECT COUNT(*) FROM requests WHERE token_id = {token_id} AND error_code = 'usage_estimated'"
    ))
    .await
}

/// The same on Anthropic's own format and upstream: a base64 `document` block.
#[tokio::test]
async fn an_anthropic_pdf_document_is_reserved_at_the_models_whole_input() {
    let app = spawn_app_with_claude().await;
    let message = json!({"role": "user", "content": [
        {"type": "document", "title": "manual.pdf",
         "source": {"type": "base64", "media_type": "application/pdf", "data": b64(&pdf(4))}},
        {"type": "text", "text": "Summarise the maintenance schedule."}]});
    let text = chat_input(
        &[without(message.clone(), "/content/0/source", "data")],
        None,
    );
    // The model's whole input, not its 4 pages × 3 000 and the text (before: 2 117).
    let reserve = worst(128_000, 64);
    assert!(text + 4 * 3_000 < 128_000);
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
        let resp = app.send(path, &short, body).await;
        let status = resp.status().as_u16();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 429, "{path} {body}: {answer}");
        assert_eq!(
            app.mock.state.total_count(),
            0,
            "{path}: reached the upstream"
        );

        let (id, enough) = app.token(&format!("enough-{i}"), Some(&usd(reserve))).await;
        let resp = app.send(path, &enough, body).await;
        assert_eq!(resp.status(), 200, "{path} {body}");
        resp.bytes().await.unwrap();
        assert_eq!(last_reserve(&app, id).await, reserve, "{path} {body}");
        app.wait_settled().await;
        app.mock.state.reset();
    }
    app.assert_invariant().await;
}

/// A document of unknown size, or an inline PDF, may push the prompt past a long-context
/// tier: reserved at the model's whole input (1 000 000 here, with the margin 1 100 016),
/// past the threshold of 200 000 even for the provider's tokenizer, it is reserved at the
/// tier's rates (2× input, 1.5× output) and served. The dearest input is the cache read at
/// 0.30 USD per Mtok (the bundled Sonnet 4.5 entry fills it in beside the configured
/// 0.15 / 0.60): 0.60 / 0.90 at the tier. Before, the same request was refused (400 naming
/// the input).
#[tokio::test]
async fn a_document_on_a_long_context_model_is_reserved_at_the_tiers_rates() {
    let app = sonnet_app(KEY_B, 1_000_000, PriceKeys::usd(0.15, 0.60)).await;
    // ceil((1 100 016 × 600 000 + 64 × 900 000) / 10⁶)
    let reserve = 660_068;
    let documents = [
        json!({"type": "document", "source": {"type": "url", "url": "https://example.com/book.pdf"}}),
        json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
            "data": b64(&pdf(2))}}),
    ];
    for (i, document) in documents.into_iter().enumerate() {
        let (id, token) = app.token(&format!("long-{i}"), Some("100")).await;
        let body = json!({"model": "sonnet", "max_tokens": 64, "messages": [{"role": "user",
            "content": [document, {"type": "text", "text": "Summarise it."}]}]});
        let resp = app.send_1m("/v1/messages", &token, &body).await;
        let status = resp.status().as_u16();
        let answer = resp.text().await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(last_reserve(&app, id).await, reserve, "{body}");
        app.wait_settled().await;
    }
    app.assert_invariant().await;
}

/// A document of unknown size was charged the model's whole input when no usage came back
/// — the reservation's bound, not a charge. Now an answer without usage is charged an
/// estimate: `UNKNOWN_DOCUMENT_PAGES` (10) pages × 3 000 and the text, streamed or not, and
/// its row says `usage_estimated`. A client that leaves before the answer pays the input
/// reserved for it (the model's whole input): the upstream had the whole request and may
/// bill all of it (`a_document_request_that_ends_before_its_answer_pays_the_reserved_input`).
#[tokio::test]
async fn a_document_of_unknown_size_without_usage_is_charged_an_estimate() {
    let app = spawn_app().await;
    let message = json!({"role": "user", "content": [
        {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
        {"type": "text", "text": "Summarise it."}]});
    let text = chat_input(
        &[without(message.clone(), "/content/0/file", "file_id")],
        None,
    );
    let input = text + 10 * 3_000;
    for stream in [false, true] {
        let (id, token) = app.token(&format!("unknown-{stream}"), Some("1")).await;
        app.mock.state.script(
            KEY_A,
            [sluice::mock::Script {
                omit_usage: true,
                text: Some("Done".into()),
                ..sluice::mock::Script::default()
            }],
        );
        let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "stream": stream,
            "messages": [message.clone()]});
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        assert_eq!(last_reserve(&app, id).await, worst(128_000, 50));
        let want = priced(input, count_text("Done"));
        assert_eq!(charged(&app, id).await, want, "stream={stream}");
        assert_eq!(estimated_rows(&app, id).await, 1, "stream={stream}");
    }

    // A client that leaves while the upstream works pays the reserved input, the model's
    // whole input (before: the estimate, 10 pages × 3 000 and the text).
    let (id, token) = app.token("left", Some("1")).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [message]});
    leave_while_upstream_works(&app, KEY_A, 3, app.chat(&token, &body)).await;
    let want = priced(128_000, 0);
    assert_eq!(want, 19_200, "128 000 × 0.15");
    assert!(input < 128_000);
    assert_eq!(charged(&app, id).await, want);
    app.mock.state.sticky(KEY_A, None);
    app.assert_invariant().await;
}

/// The two kinds of document the gateway cannot bound: one of unknown size (by file id)
/// and a readable inline PDF (3 pages), each in a chat message with a question.
fn unbounded_documents() -> [(&'static str, Value); 2] {
    [
        (
            "by file id",
            json!({"role": "user", "content": [
                {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
                {"type": "text", "text": "Summarise it."}]}),
        ),
        ("a 3-page PDF", chat_pdf_message(3)),
    ]
}

/// The status, code, input tokens and cost of the one row of `token_id`.
async fn row_of(app: &TestApp, token_id: i64) -> (i64, Option<String>, i64, i64) {
    app.state.request_log.flush().await;
    sql_row(
        app.db(),
        &format!(
            "SELECT status, error_code, input_tokens, cost_micros FROM requests \
             WHERE token_id = {token_id}"
        ),
    )
    .await
}

/// Review finding (s15): a request with a document that reached the upstream and ended
/// before its answer — its client left, or its own deadline cut the attempt off — was
/// charged the document's *estimate* (10 pages × 3 000 for one of unknown size, pages ×
/// 3 000 for a readable PDF). The upstream had the whole request and may bill all of it,
/// which the gateway cannot know: it is charged the input reserved for it, the model's
/// whole input (128 000 × 0.15 = 19 200 µ$ here), streamed or not; its row says that
/// input and that cost.
#[tokio::test]
async fn a_document_request_that_ends_before_its_answer_pays_the_reserved_input() {
    let app = spawn_app().await;
    let want = priced(128_000, 0);
    assert_eq!(want, 19_200);
    let mut had = 0;
    for (what, message) in unbounded_documents() {
        for stream in [false, true] {
            let case = format!("{what}, stream={stream}");
            let body = json!({"model": "gpt-4o-mini", "max_tokens": 50, "stream": stream,
                "messages": [message.clone()]});

            // The client leaves while the upstream works on it.
            let (id, token) = app.token(&format!("left {case}"), Some("1")).await;
            had += 1;
            leave_while_upstream_works(&app, KEY_A, had, app.chat(&token, &body)).await;
            assert_eq!(charged(&app, id).await, want, "{case}: left");
            let (status, code, input, logged) = row_of(&app, id).await;
            assert_eq!(
                (status, code.as_deref(), input, logged),
                (499, Some("client_disconnected"), 128_000, want),
                "{case}: left"
            );

            // Its own deadline cuts the attempt off after the upstream had it.
            let (id, token) = app.token(&format!("cut {case}"), Some("1")).await;
            app.mock.state.sticky(
                KEY_A,
                Some(sluice::mock::Script {
                    delay_ms: 3_000,
                    ..sluice::mock::Script::default()
                }),
            );
            had += 1;
            let resp = app.chat_with_deadline(&token, &body, 300).await;
            let status = resp.status().as_u16();
            resp.bytes().await.unwrap();
            assert_eq!(
                app.mock.state.total_count(),
                had,
                "{case}: the upstream had it"
            );
            assert_eq!(charged(&app, id).await, want, "{case}: cut");
            let (row_status, _, input, logged) = row_of(&app, id).await;
            assert_eq!(
                (row_status, input, logged),
                (i64::from(status), 128_000, want),
                "{case}: cut"
            );
        }
    }
    app.mock.state.sticky(KEY_A, None);
    app.assert_invariant().await;
}

/// Review finding (s15): a departure's long-context tier was decided on the gateway's own
/// count alone, not as the reservation decides it (the provider's tokenizer may count up
/// to 1.5× as much on Claude). A Sonnet 4.5 that accepts 150 000 input tokens, asked
/// about a document: reserved (and, the client leaving, charged) its whole input, 150 000
/// — which Claude's tokenizer may count as 225 000, past the 200 000 threshold — so the
/// departure is priced at the tier's 6 USD per Mtok: 900 000 µ$ (before: 450 000, at 3).
#[tokio::test]
async fn a_departure_past_the_tier_for_the_providers_tokenizer_is_priced_at_its_rates() {
    const KEY: &str = "sk-departure-tier-anthropic";
    let app = sonnet_app(KEY, 150_000, PriceKeys::usd(3.0, 15.0)).await;
    let (id, token) = app.token("tier", Some("100")).await;
    let body = json!({"model": "sonnet", "max_tokens": 64, "messages": [{"role": "user",
        "content": [{"type": "document", "source": {"type": "url",
            "url": "https://example.com/book.pdf"}},
            {"type": "text", "text": "Summarise it."}]}]});
    leave_while_upstream_works(&app, KEY, 1, app.send_1m("/v1/messages", &token, &body)).await;
    assert_eq!(charged(&app, id).await, 900_000, "150 000 × 6");
    let (status, _, input, logged) = row_of(&app, id).await;
    assert_eq!((status, input, logged), (499, 150_000, 900_000));
    app.mock.state.sticky(KEY, None);
    app.assert_invariant().await;
}

/// A PDF fetched by `web_fetch` and echoed back in the history is a document the provider
/// reads again: reserved at the model's whole input like any other (before, its base64 was
/// counted as JSON text: 174 µ$ reserved for this 6-page PDF, now 21 161).
#[tokio::test]
async fn a_fetched_pdf_echoed_back_is_reserved_as_a_document() {
    let app = spawn_app_with_claude().await;
    let (id, token) = app.token("fetched", Some("1")).await;
    let body = json!({"model": "claude", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Fetch https://example.com/manual.pdf"},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch",
             "input": {"url": "https://example.com/manual.pdf"}},
            {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                "type": "web_fetch_result", "url": "https://example.com/manual.pdf",
                "content": {"type": "document", "source": {"type": "base64",
                    "media_type": "application/pdf", "data": b64(&pdf(6))}}}}]},
        {"role": "user", "content": "Summarise it."}]});
    let resp = app.messages(&token, &body).await;
    let status = resp.status();
    let answer = resp.text().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(last_reserve(&app, id).await, worst(128_000, 64));
    app.wait_settled().await;
    app.assert_invariant().await;
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

/// An inline "image" whose data says it is something else — a PDF, a text file, audio — is
/// refused by name on every route, in the client's format, before anything is reserved or
/// sent: the estimate counts it as one image, while a provider reading what its type says
/// (Gemini, and relays to it behind an OpenAI-compatible route) bills the document's pages
/// (s28 diff attack F5: a PDF in `image_url` reached an OpenAI-compatible route). One that
/// declares an image type is served.
#[tokio::test]
async fn an_inline_image_that_declares_another_type_is_refused_on_every_route() {
    let app = spawn_app_with_claude().await;
    let (id, token) = app.token("pictures", Some("10")).await;
    let pdf = format!("data:application/pdf;base64,{}", b64(&pdf(3)));
    let chat = |url: &str| {
        json!({"model": "gpt-4o-mini", "max_tokens": 20, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "Summarise."},
                        {"type": "image_url", "image_url": {"url": url}}]}]})
    };
    let resp = app.chat(&token, &chat(&pdf)).await;
    assert_eq!(resp.status(), 400);
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["error"]["param"], "image_url", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("application/pdf"),
        "{r}"
    );
    let body = json!({"model": "claude", "max_tokens": 20, "messages": [{"role": "user",
        "content": [{"type": "image", "source": {"type": "base64",
            "media_type": "text/plain", "data": "aGVsbG8="}}]}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 400);
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["type"], "error", "Anthropic's error shape: {r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text/plain"),
        "{r}"
    );
    assert_eq!(app.mock.state.total_count(), 0, "nothing sent");
    assert_eq!(charged(&app, id).await, 0);
    let png = "data:image/png;base64,iVBORw0KGgo=";
    assert_eq!(app.chat(&token, &chat(png)).await.status(), 200);
    app.assert_invariant().await;
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
        let resp = app.send(path, &token, &body).await;
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
        let resp = app.send(path, &token, &body).await;
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
