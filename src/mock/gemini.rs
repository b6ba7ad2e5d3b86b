//! The mock's Google side: Gemini API (`/v1beta/models/{model}:generateContent`, key in
//! `x-goog-api-key`) and Vertex AI (`/v1/projects/…/publishers/google/models/{model}:…`,
//! a bearer token), streamed (`:streamGenerateContent?alt=sse`) or not, and the OAuth
//! token endpoint Vertex tokens come from (`/token`).
//!
//! `/token` checks the JWT-bearer assertion as Google does: signed RS256 by a service
//! account the test registered (its public key, `register_vertex_account`), `aud` this
//! endpoint's URL, `scope` cloud-platform, not expired, at most an hour long. Requests are
//! counted and scripted under the key `token`; a Vertex call under the service account's
//! email, a Gemini API call under its API key. Scripts and faults (`faults.rs`) apply as on
//! the other formats.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::responses::{pieces, sse, Event};
use super::{InFlightGuard, MockState, Script};

/// The OAuth scope a Vertex token must be asked for.
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

#[derive(Default)]
pub(super) struct GeminiState {
    /// Service-account email → its public key.
    accounts: HashMap<String, DecodingKey>,
    /// Access token → (the account it was issued to, when it expires).
    tokens: HashMap<String, (String, Instant)>,
    /// Lifetime of the tokens issued (default one hour).
    token_ttl: Option<Duration>,
}

impl MockState {
    /// Lets `/token` accept assertions signed by this account's key (`public_pem`), issuing
    /// tokens that live `ttl` (default 3600 s).
    pub fn register_vertex_account(
        &self,
        client_email: &str,
        public_pem: &str,
        ttl: Option<Duration>,
    ) -> Result<(), String> {
        let key = DecodingKey::from_rsa_pem(public_pem.as_bytes()).map_err(|e| e.to_string())?;
        let mut inner = self.inner.lock();
        inner.gemini.accounts.insert(client_email.to_string(), key);
        inner.gemini.token_ttl = ttl;
        Ok(())
    }

    /// Ends every issued token now (the next Vertex call with one gets a 401).
    pub fn expire_vertex_tokens(&self) {
        self.inner.lock().gemini.tokens.clear();
    }
}

pub(super) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1beta/models/{call}", web::post().to(gemini_api))
        .route(
            "/v1/projects/{project}/locations/{location}/publishers/google/models/{call}",
            web::post().to(vertex),
        )
        .route("/token", web::post().to(token))
        .route("/_mock/gemini/account", web::post().to(control_account));
}

fn google_error(status: u16, message: &str) -> Value {
    let name = match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    };
    json!({"error": {"code": status, "message": message, "status": name}})
}

fn status(code: u16) -> actix_web::http::StatusCode {
    actix_web::http::StatusCode::from_u16(code)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR)
}

async fn gemini_api(
    state: web::Data<MockState>,
    req: HttpRequest,
    call: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let key = req
        .headers()
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty());
    let Some(key) = key else {
        return HttpResponse::Unauthorized().json(google_error(
            401,
            "Method doesn't allow unregistered callers. Please use API Key or other form of API consumer identity to call this API.",
        ));
    };
    generate(state, &req, key.to_string(), &call, &body).await
}

async fn vertex(
    state: web::Data<MockState>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    body: web::Bytes,
) -> HttpResponse {
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let account = bearer.and_then(|t| {
        let inner = state.inner.lock();
        let (email, expires) = inner.gemini.tokens.get(t)?;
        (Instant::now() < *expires).then(|| email.clone())
    });
    let Some(account) = account else {
        return HttpResponse::Unauthorized().json(google_error(
            401,
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
        ));
    };
    generate(state, &req, account, &path.2, &body).await
}

async fn generate(
    state: web::Data<MockState>,
    req: &HttpRequest,
    key: String,
    call: &str,
    body: &[u8],
) -> HttpResponse {
    let (model, method) = call.split_once(':').unwrap_or((call, ""));
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" if req.query_string().contains("alt=sse") => true,
        _ => {
            return HttpResponse::NotFound()
                .json(google_error(404, &format!("unknown method `{method}`")))
        }
    };
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let headers: Map<String, Value> = (req.headers().iter())
        .map(|(k, v)| (k.as_str().to_string(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let script = state.begin(&key, req.path(), headers, &parsed);
    let guard = InFlightGuard {
        state: state.clone().into_inner(),
        key,
    };
    answer(&state, model, stream, &parsed, script, guard).await
}

async fn answer(
    state: &MockState,
    model: &str,
    stream: bool,
    body: &Value,
    s: Script,
    guard: InFlightGuard,
) -> HttpResponse {
    if s.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.delay_ms)).await;
    }
    let code = s.status.unwrap_or(200);
    let mut resp = HttpResponse::build(status(code));
    for (k, v) in &s.headers {
        resp.insert_header((k.as_str(), v.as_str()));
    }
    if let Some(raw) = &s.raw_body {
        return resp.content_type("application/json").body(raw.clone());
    }
    if let Some(b) = &s.body {
        return resp.json(b);
    }
    if !(200..300).contains(&code) {
        return resp.json(google_error(code, &format!("mock error {code}")));
    }
    if let Err(problem) = check(body) {
        return HttpResponse::BadRequest().json(google_error(400, &problem));
    }
    let cfg = &state.cfg;
    let text = s.text.clone().unwrap_or_else(|| cfg.text.clone());
    let (prompt, candidates) = (
        s.prompt_tokens.unwrap_or(cfg.prompt_tokens),
        s.completion_tokens.unwrap_or(cfg.completion_tokens),
    );
    let (thoughts, cached) = (
        s.reasoning_tokens.unwrap_or(0),
        s.cached_tokens.unwrap_or(0),
    );
    let mut usage = json!({"promptTokenCount": prompt, "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts});
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    if cached > 0 {
        usage["cachedContentTokenCount"] = json!(cached);
    }
    let id = format!("mock-{:016x}", rand::random::<u64>());
    let thought = (thoughts > 0
        && body.pointer("/generationConfig/thinkingConfig/includeThoughts") == Some(&json!(true)))
    .then(|| json!({"text": "Thinking it over.", "thought": true}));
    let call = tool_to_call(body).map(|name| {
        json!({"functionCall": {"name": name, "args": serde_json::from_str::<Value>(s.tool_arguments.as_deref().unwrap_or(super::responses::TOOL_ARGUMENTS)).unwrap_or_default()},
            "thoughtSignature": "bW9jay1zaWduYXR1cmU="})
    });
    let chunk = |parts: Vec<Value>, last: bool| {
        let mut c = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
            "modelVersion": model, "responseId": id});
        if last {
            c["candidates"][0]["finishReason"] = json!("STOP");
            if !s.omit_usage {
                c["usageMetadata"] = usage.clone();
            }
        }
        c
    };
    if !stream {
        let mut parts: Vec<Value> = thought.into_iter().collect();
        parts.push(call.unwrap_or_else(|| json!({"text": text})));
        let mut whole = chunk(parts, true);
        whole["usageMetadata"] = usage;
        return resp.json(whole);
    }
    if let Some(events) = &s.events {
        return sse(resp, events.iter().map(|e| e.event()).collect(), &s, guard);
    }
    let mut events: Vec<Event> = thought
        .map(|t| Event::data(chunk(vec![t], false)).content())
        .into_iter()
        .collect();
    match call {
        Some(c) => events.push(Event::data(chunk(vec![c], true)).content()),
        None => {
            let words = pieces(&text);
            let n = words.len();
            for (i, w) in words.into_iter().enumerate() {
                events.push(Event::data(chunk(vec![json!({"text": w})], i + 1 == n)).content());
            }
        }
    }
    sse(resp, events, &s, guard)
}

/// What Google insists on, so a translation that breaks it fails here as it would there.
fn check(body: &Value) -> Result<(), String> {
    let contents = (body.get("contents").and_then(Value::as_array))
        .filter(|c| !c.is_empty())
        .ok_or("* GenerateContentRequest.contents: contents is not specified")?;
    for (i, c) in contents.iter().enumerate() {
        match c.get("role").and_then(Value::as_str) {
            Some("user" | "model") => {}
            _ => {
                return Err(format!(
                    "* GenerateContentRequest.contents[{i}].role: must be user or model"
                ))
            }
        }
        if c.get("parts")
            .and_then(Value::as_array)
            .is_none_or(|p| p.is_empty())
        {
            return Err(format!(
                "* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
            ));
        }
    }
    for k in body.as_object().map(|o| o.keys()).into_iter().flatten() {
        if !matches!(
            k.as_str(),
            "contents"
                | "systemInstruction"
                | "tools"
                | "toolConfig"
                | "generationConfig"
                | "safetySettings"
                | "cachedContent"
                | "labels"
        ) {
            return Err(format!(
                "Invalid JSON payload received. Unknown name \"{k}\": Cannot find field."
            ));
        }
    }
    Ok(())
}

/// The first declared function, when the last turn is not a function response.
fn tool_to_call(body: &Value) -> Option<String> {
    let name = body
        .pointer("/tools/0/functionDeclarations/0/name")?
        .as_str()?;
    let last = body.get("contents")?.as_array()?.last()?;
    let answered = (last.get("parts").and_then(Value::as_array))
        .is_some_and(|ps| ps.iter().any(|p| p.get("functionResponse").is_some()));
    (!answered).then(|| name.to_string())
}

#[derive(Deserialize)]
struct TokenForm {
    grant_type: String,
    assertion: String,
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    scope: String,
    iat: i64,
    exp: i64,
}

fn oauth_error(code: u16, error: &str, description: &str) -> HttpResponse {
    HttpResponse::build(status(code))
        .json(json!({"error": error, "error_description": description}))
}

async fn token(
    state: web::Data<MockState>,
    req: HttpRequest,
    form: web::Form<TokenForm>,
) -> HttpResponse {
    let script = state.begin(
        "token",
        "/token",
        Map::new(),
        &json!({"grant_type": form.grant_type}),
    );
    let _guard = InFlightGuard {
        state: state.clone().into_inner(),
        key: "token".into(),
    };
    if script.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
    }
    if let Some(scripted) = super::scripted_token_answer(&script) {
        return scripted;
    }
    if let Some(code) = script.status.filter(|c| !(200..300).contains(c)) {
        return oauth_error(code, "internal_failure", "mock token endpoint failure");
    }
    if form.grant_type != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
        return oauth_error(400, "unsupported_grant_type", "Invalid grant_type");
    }
    let aud = format!(
        "{}://{}/token",
        req.connection_info().scheme(),
        req.connection_info().host()
    );
    match verify(&state, &form.assertion, &aud) {
        Ok(email) => {
            let access = format!("ya29.mock-{:032x}", rand::random::<u128>());
            let mut inner = state.inner.lock();
            let ttl = inner.gemini.token_ttl.unwrap_or(Duration::from_secs(3600));
            inner
                .gemini
                .tokens
                .insert(access.clone(), (email, Instant::now() + ttl));
            HttpResponse::Ok().json(json!({"access_token": access, "expires_in": ttl.as_secs(), "token_type": "Bearer"}))
        }
        Err(why) => oauth_error(400, "invalid_grant", &why),
    }
}

/// The account that signed a valid assertion for `aud`.
fn verify(state: &MockState, assertion: &str, aud: &str) -> Result<String, String> {
    // Which account claims to have signed: read unverified, then verified with its key.
    let mut peek = Validation::new(Algorithm::RS256);
    peek.insecure_disable_signature_validation();
    peek.validate_aud = false;
    peek.validate_exp = false;
    let claimed = jsonwebtoken::decode::<Claims>(assertion, &DecodingKey::from_secret(b""), &peek)
        .map_err(|e| format!("Invalid JWT: {e}"))?
        .claims
        .iss;
    let key = (state.inner.lock().gemini.accounts.get(&claimed).cloned())
        .ok_or_else(|| format!("Invalid JWT Signature: unknown account {claimed}"))?;
    let mut v = Validation::new(Algorithm::RS256);
    v.set_audience(&[aud]);
    v.set_issuer(&[&claimed]);
    v.set_required_spec_claims(&["exp", "iat", "aud", "iss"]);
    v.leeway = 0;
    let claims = jsonwebtoken::decode::<Claims>(assertion, &key, &v)
        .map_err(|e| format!("Invalid JWT: {e}"))?
        .claims;
    if !claims.scope.split(' ').any(|s| s == SCOPE) {
        return Err(format!("Invalid OAuth scope: {}", claims.scope));
    }
    if claims.exp - claims.iat > 3600 {
        return Err("Invalid JWT: exp is more than an hour after iat".into());
    }
    Ok(claims.iss)
}

#[derive(Deserialize)]
struct AccountReq {
    client_email: String,
    public_key_pem: String,
    token_ttl_seconds: Option<u64>,
}

async fn control_account(state: web::Data<MockState>, body: web::Json<AccountReq>) -> HttpResponse {
    let ttl = body.token_ttl_seconds.map(Duration::from_secs);
    match state.register_vertex_account(&body.client_email, &body.public_key_pem, ttl) {
        Ok(()) => HttpResponse::NoContent().finish(),
        Err(e) => HttpResponse::BadRequest().json(json!({"error": e})),
    }
}
