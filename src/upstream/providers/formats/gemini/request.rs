//! The internal form → a Gemini `GenerateContentRequest`. The model and the choice between
//! `generateContent` and `streamGenerateContent` travel in the URL, not the body.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use crate::upstream::providers::canonical::{
    Message, Part, Reasoning, Request, ResponseFormat, Role, Source, Tool, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

/// The body for `models/{upstream_model}:generateContent` (or the streamed variant).
/// `cap` is the output cap the gateway decided; it wins over the client's own.
pub fn write_request(
    r: &Request,
    _upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    _stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    refuse_unsupported(r)?;
    let mut out = Map::new();
    if !r.system.is_empty() {
        let parts = r
            .system
            .iter()
            .map(|p| match p {
                Part::Text { text, .. } => Ok(json!({ "text": text })),
                _ => Err(refuse(r, "system", "only text can be a system instruction")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("systemInstruction".into(), json!({ "parts": parts }));
    }
    out.insert("contents".into(), Value::Array(contents(r)?));
    if !r.tools.is_empty() {
        let decls = r
            .tools
            .iter()
            .map(|t| declaration(r, t))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("tools".into(), json!([{ "functionDeclarations": decls }]));
    }
    if let Some(choice) = &r.tool_choice {
        let config = match choice {
            ToolChoice::Auto => json!({ "mode": "AUTO" }),
            ToolChoice::None => json!({ "mode": "NONE" }),
            ToolChoice::Required => json!({ "mode": "ANY" }),
            ToolChoice::Named(name) => json!({ "mode": "ANY", "allowedFunctionNames": [name] }),
        };
        out.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": config }),
        );
    }
    let config = generation_config(r, cap);
    if !config.is_empty() {
        out.insert("generationConfig".into(), Value::Object(config));
    }
    Ok(out)
}

/// Fields of the internal form Gemini has no counterpart for, at a value that would
/// change the answer. `user` and `metadata` are the client's bookkeeping (abuse
/// monitoring ids, tags) and change no answer; prompt-cache marks neither (Gemini caches
/// on its own): those are not sent.
fn refuse_unsupported(r: &Request) -> Result<(), TranslateError> {
    if r.parallel_tool_calls == Some(false) {
        return Err(refuse(
            r,
            "parallel_tool_calls",
            "Gemini cannot be told to make at most one tool call",
        ));
    }
    if let Some(tier) = &r.service_tier {
        if !matches!(tier.as_str(), "auto" | "default") {
            return Err(refuse(r, "service_tier", "Gemini has no service tiers"));
        }
    }
    Ok(())
}

/// A refusal naming the field as the client sent it (`Request::names`).
pub(super) fn refuse(r: &Request, field: &'static str, why: &str) -> TranslateError {
    let param = r
        .names
        .iter()
        .find(|(_, ours)| *ours == field)
        .map_or(field, |(theirs, _)| *theirs);
    TranslateError {
        param: Some(param.into()),
        message: format!(
            "`{param}` cannot be sent to a Gemini model ({why}), and Sluice does not drop it."
        ),
    }
}

/// The conversation as Gemini `contents`: tool results are `user` turns of
/// `functionResponse` parts, the assistant is `model`, and consecutive turns of one role
/// are merged (a turn's parallel function responses must sit in one content).
fn contents(r: &Request) -> Result<Vec<Value>, TranslateError> {
    // Call id → function name, as of each point of the conversation: a later call that
    // reuses an id (another answer's) names the results after it.
    // Each with its call's ordinal in the conversation: a turn's function responses go in
    // the order of the calls they answer, since Gemini pairs them by name and position
    // (two calls of one function would otherwise swap results when the client answers
    // them in another order).
    let mut names: HashMap<&str, (&str, usize)> = HashMap::new();
    let mut calls = 0;
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in &r.messages {
        if m.name.is_some() {
            return Err(refuse(r, "name", "Gemini has no speaker names"));
        }
        let role = match m.role {
            Role::Assistant => "model",
            // A system turn reaches here marked as a user's (`dispatch::fit`).
            Role::User | Role::Tool | Role::System => "user",
        };
        let parts = message_parts(r, m, &mut names, &mut calls)?;
        if parts.is_empty() {
            // Nothing to say (an empty assistant turn): Google refuses a turn without parts.
            continue;
        }
        match out.last_mut() {
            Some((last, ps)) if *last == role => ps.extend(parts),
            _ => out.push((role, parts)),
        }
    }
    Ok(out
        .into_iter()
        .map(|(role, mut parts)| {
            order_responses(&mut parts);
            json!({ "role": role, "parts": parts })
        })
        .collect())
}

/// The turn's `functionResponse` parts, in their places among its parts, sorted by the
/// ordinal of the call each answers (stable: results of one call keep their order); the
/// ordinal (`ORDER`) is removed.
fn order_responses(parts: &mut [Value]) {
    let ord = |v: &Value| v.get(ORDER).and_then(Value::as_u64);
    let slots: Vec<usize> = (0..parts.len())
        .filter(|&i| ord(&parts[i]).is_some())
        .collect();
    let mut responses: Vec<Value> = slots.iter().map(|&i| parts[i].take()).collect();
    responses.sort_by_key(|v| ord(v));
    for (i, mut v) in slots.into_iter().zip(responses) {
        if let Some(o) = v.as_object_mut() {
            o.remove(ORDER);
        }
        parts[i] = v;
    }
}

/// The key a `functionResponse` part carries its call's ordinal under until its turn is
/// complete (`order_responses`); never sent.
const ORDER: &str = "\u{0}order";

fn message_parts<'a>(
    r: &Request,
    m: &'a Message,
    names: &mut HashMap<&'a str, (&'a str, usize)>,
    calls: &mut usize,
) -> Result<Vec<Value>, TranslateError> {
    let mut parts = Vec::new();
    // A signature read from a non-thought part, waiting for the part it belongs on.
    let mut pending: Option<&str> = None;
    for p in &m.content {
        let mut part = match p {
            Part::Reasoning {
                redacted: Some(_), ..
            } => {
                return Err(refuse(
                    r,
                    "redacted_thinking",
                    "Gemini has no redacted thoughts",
                ))
            }
            Part::Reasoning {
                text, signature, ..
            } if text.is_empty() => {
                pending = signature.as_deref();
                continue;
            }
            Part::Reasoning {
                text, signature, ..
            } => {
                let mut v = json!({ "text": text, "thought": true });
                if let Some(s) = signature {
                    v["thoughtSignature"] = json!(s);
                }
                parts.push(v);
                continue;
            }
            // Google refuses an empty text part; one carrying a signature stays.
            Part::Text { text, .. } | Part::Refusal { text }
                if text.is_empty() && pending.is_none() =>
            {
                continue
            }
            Part::Text { text, .. } | Part::Refusal { text } => json!({ "text": text }),
            Part::Image { source, detail, .. } => {
                if detail.as_deref().is_some_and(|d| d != "auto") {
                    return Err(refuse(r, "detail", "Gemini sets no resolution per image"));
                }
                image(r, source)?
            }
            // A file's name is a label for the client; the model reads the content.
            Part::File { source, .. } => media(r, source, "file")?,
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                names.insert(id, (name, *calls));
                *calls += 1;
                let args: Value = match serde_json::from_str(arguments) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(refuse(
                            r,
                            "tool_calls",
                            "a function call's arguments must be a JSON object",
                        ))
                    }
                };
                json!({ "functionCall": { "name": name, "args": args } })
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } => {
                let Some(&(name, ordinal)) = names.get(call_id.as_str()) else {
                    return Err(TranslateError {
                        param: Some("tool_call_id".into()),
                        message: format!(
                            "The tool result for call `{call_id}` answers no function call of this conversation."
                        ),
                    });
                };
                let text = result_text(r, content)?;
                // Google's convention: the output under `output`, a failure under `error`.
                let key = if *is_error { "error" } else { "output" };
                json!({ "functionResponse": { "name": name, "response": { key: text } },
                    ORDER: ordinal })
            }
        };
        if let Some(s) = pending.take() {
            part["thoughtSignature"] = json!(s);
        }
        parts.push(part);
    }
    if let Some(s) = pending {
        // A signature with nothing after it in its turn: it stands alone, as Gemini sent it.
        parts.push(json!({ "text": "", "thoughtSignature": s }));
    }
    Ok(parts)
}

fn result_text(r: &Request, content: &[Part]) -> Result<String, TranslateError> {
    let mut text = String::new();
    for p in content {
        match p {
            Part::Text { text: t, .. } => text.push_str(t),
            _ => {
                return Err(refuse(
                    r,
                    "tool_result",
                    "a function response holds text only",
                ))
            }
        }
    }
    Ok(text)
}

/// An image part: `media` of an image MIME type only. Gemini reads whatever the type says —
/// a PDF, a text file, audio — and bills all of it, while the gateway reserves an image
/// part as one image; a document goes as a file part, which the reservation sizes
/// (`quota::documents`). Other providers refuse a non-image in an image block themselves
/// (s27 attack, translated money #1: a book sent as an "image" was reserved at ~4 000
/// tokens and billed in full).
fn image(r: &Request, source: &Source) -> Result<Value, TranslateError> {
    let mime = match source {
        Source::Base64 { media_type, .. } => Some(media_type.as_str()),
        Source::Url(url) => mime_of(url),
        Source::FileId(_) => None,
    };
    if mime.is_some_and(|m| !m.to_ascii_lowercase().starts_with("image/")) {
        return Err(refuse(
            r,
            "image_url",
            "an image part must carry an image; send a document as a file part",
        ));
    }
    media(r, source, "image_url")
}

/// An image or document: inline data, or a URL Gemini fetches (`fileData`, whose MIME type
/// is required: taken from the URL's extension).
fn media(r: &Request, source: &Source, field: &'static str) -> Result<Value, TranslateError> {
    match source {
        Source::Base64 { media_type, data } => {
            Ok(json!({ "inlineData": { "mimeType": media_type, "data": data } }))
        }
        Source::Url(url) => match mime_of(url) {
            Some(mime) => Ok(json!({ "fileData": { "mimeType": mime, "fileUri": url } })),
            None => Err(refuse(
                r,
                field,
                "a URL's media type must show in its extension (.png, .jpg, .webp, .gif, .pdf…)",
            )),
        },
        Source::FileId(_) => Err(refuse(
            r,
            field,
            "another provider's file ids mean nothing to Google",
        )),
    }
}

fn mime_of(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        _ => return None,
    })
}

/// A function declaration; its parameters as full JSON Schema (`parametersJsonSchema`),
/// which takes the client's schema as it is, unlike the OpenAPI subset of `parameters`.
fn declaration(r: &Request, t: &Tool) -> Result<Value, TranslateError> {
    if t.strict == Some(true) {
        return Err(refuse(
            r,
            "strict",
            "Gemini does not guarantee arguments that match the schema",
        ));
    }
    let mut d = json!({ "name": t.name });
    if let Some(desc) = &t.description {
        d["description"] = json!(desc);
    }
    if !t.parameters.is_null() {
        d["parametersJsonSchema"] = t.parameters.clone();
    }
    Ok(d)
}

fn generation_config(r: &Request, cap: Option<(&'static str, i64)>) -> Map<String, Value> {
    let mut c = Map::new();
    if let Some(max) = cap.map(|(_, c)| c).or(r.max_output_tokens) {
        c.insert("maxOutputTokens".into(), json!(max));
    }
    if let Some(t) = r.temperature {
        c.insert("temperature".into(), json!(t));
    }
    if let Some(p) = r.top_p {
        c.insert("topP".into(), json!(p));
    }
    // Gemini's `GenerationConfig` takes these under its own names: never dropped.
    if let Some(k) = r.top_k {
        c.insert("topK".into(), json!(k));
    }
    if let Some(seed) = r.seed {
        c.insert("seed".into(), json!(seed));
    }
    if let Some(p) = r.frequency_penalty {
        c.insert("frequencyPenalty".into(), json!(p));
    }
    if let Some(p) = r.presence_penalty {
        c.insert("presencePenalty".into(), json!(p));
    }
    if !r.stop.is_empty() {
        c.insert("stopSequences".into(), json!(r.stop));
    }
    match &r.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            c.insert("responseMimeType".into(), json!("application/json"));
        }
        // The schema's name and description label it for the client; Gemini takes the
        // schema alone.
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            c.insert("responseMimeType".into(), json!("application/json"));
            c.insert("responseJsonSchema".into(), schema.clone());
        }
    }
    if let Some(reasoning) = &r.reasoning {
        c.insert("thinkingConfig".into(), Value::Object(thinking(reasoning)));
    }
    c
}

/// A budget in tokens (Gemini 2.5) or an effort (Gemini 3's `thinkingLevel`); the
/// thoughts' summaries are asked for, so a client that shows reasoning has it.
fn thinking(r: &Reasoning) -> Map<String, Value> {
    let mut t = Map::new();
    if let Some(b) = r.budget_tokens {
        t.insert("thinkingBudget".into(), json!(b));
    }
    if let Some(e) = &r.effort {
        t.insert("thinkingLevel".into(), json!(e.to_ascii_uppercase()));
    }
    t.insert("includeThoughts".into(), json!(true));
    t
}
