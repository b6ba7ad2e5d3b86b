//! `Input<T>`: one body extractor for both surfaces. A JSON body is parsed as it is; a form
//! body (htmx or plain) is first turned into a JSON object — a repeated key (checkboxes)
//! becomes an array — so the same `Deserialize` struct and the same validation serve the API
//! and the UI. The `de` helpers accept what either sends: numbers as numbers or text, an
//! empty field as absent, a checkbox as `on`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::error::PayloadError;
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::Stream;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::AdminError;
use crate::body::{BodyError, Coding};
use crate::state::AppState;

const MAX_BODY: usize = 256 * 1024;

pub struct Input<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for Input<T> {
    type Error = AdminError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, AdminError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        // The media type whatever its case (RFC 9110 §8.3.1) and parameters.
        let media = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            });
        let is_json = media
            .as_deref()
            .is_some_and(|m| m == "application/json" || m.ends_with("+json"));
        let api = super::guard::is_api(req.match_info().as_str());
        let (req, payload) = (req.clone(), payload.take());
        Box::pin(async move {
            let body = read_body(payload, &req, MAX_BODY).await?;
            let value = if is_json {
                if body.is_empty() {
                    Value::Object(Map::new())
                } else {
                    serde_json::from_slice(&body)
                        .map_err(|e| AdminError::invalid(format!("invalid JSON: {e}")))?
                }
            } else if api && !body.is_empty() {
                // A JSON body sent as a form (`curl -d`) read as one field of no known
                // name: a 200 that changed nothing (s32 edge attack F2).
                return Err(AdminError::Unsupported(format!(
                    "The admin API reads JSON bodies: send this one with content-type: application/json (it came as {}).",
                    media.as_deref().unwrap_or("no content-type")
                )));
            } else {
                form_to_json(&body)
            };
            refuse_nul(&value, "")?;
            parse(value, is_json).map(Input)
        })
    }
}

/// The query string read as `T` (`web::Query`'s job), a value it cannot read refused in
/// the admin's format naming its parameter: actix's own answer was plain text naming
/// neither (s32 edge attack F3).
pub struct Query<T>(pub T);

impl<T> Query<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Query<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned> FromRequest for Query<T> {
    type Error = AdminError;
    type Future = std::future::Ready<Result<Self, AdminError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let pairs = url::form_urlencoded::parse(req.query_string().as_bytes());
        let read = serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs));
        std::future::ready(read.map(Query).map_err(|e| {
            let at = e.path().to_string();
            let e = e.into_inner();
            AdminError::invalid(if at == "." {
                format!("query: {e}")
            } else {
                format!("{at}: {e}")
            })
        }))
    }
}

/// Reads an admin request's body whole (`body::read_decoded`): at most `limit` bytes, on
/// the wire and decoded, within `server.body_timeout_seconds`.
pub async fn read_body<S>(
    payload: S,
    req: &HttpRequest,
    limit: usize,
) -> Result<web::Bytes, AdminError>
where
    S: Stream<Item = Result<web::Bytes, PayloadError>> + Unpin,
{
    let within = req
        .app_data::<web::Data<AppState>>()
        .map(|state| Duration::from_secs(state.settings.server.body_timeout_seconds))
        .ok_or(AdminError::Internal)?;
    // Decoded as actix's own body extractors decode it (gzip, zlib `deflate`), held to the
    // limit as it is inflated (`body::read_decoded`); any other coding is named, not read
    // as garbage (s32 diff2 attack F3).
    let coding = Coding::of(req.headers()).map_err(AdminError::Unsupported)?;
    crate::body::read_decoded(payload, req.headers(), coding, limit, within)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge(_) => AdminError::TooLarge,
            BodyError::Unreadable => AdminError::invalid("The request body could not be read."),
            BodyError::TooSlow(within) => AdminError::invalid(BodyError::too_slow_message(within)),
        })
}

/// Reads the input into `T`, naming the field a value of which it cannot read. Sent as
/// JSON, a field `T` does not know is refused by name: a misspelt one (`disable`) was
/// dropped and the write answered 200, changing nothing (s32 edge attack F2). A form may
/// carry more than its fields (a submit button's name), so a form's are let be.
fn parse<T: DeserializeOwned>(value: Value, strict: bool) -> Result<T, AdminError> {
    let mut unknown = Vec::new();
    let read: Result<T, _> = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
        value,
        &mut |path: serde_ignored::Path| unknown.push(path.to_string()),
    ));
    match read {
        Err(e) => {
            let at = e.path().to_string();
            let e = e.into_inner();
            Err(AdminError::invalid(if at == "." {
                format!("invalid input: {e}")
            } else {
                format!("{at}: {e}")
            }))
        }
        Ok(_) if strict && !unknown.is_empty() => Err(AdminError::invalid(format!(
            "unknown field: {} (nothing was changed)",
            unknown.join(", ")
        ))),
        Ok(input) => Ok(input),
    }
}

/// Refuses a NUL character anywhere in the input, naming the field: SQLite would keep it
/// and PostgreSQL's text cannot, so one request would answer differently by engine (and a
/// NUL kept on SQLite would stop `sluice migrate-store`). No admin field needs one.
fn refuse_nul(value: &Value, field: &str) -> Result<(), AdminError> {
    let refused = |name: &str| AdminError::invalid(format!("{name}: no NUL character"));
    match value {
        Value::String(s) if s.contains('\0') => Err(refused(field)),
        Value::Array(items) => items.iter().try_for_each(|v| refuse_nul(v, field)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            if k.contains('\0') {
                return Err(refused("field name"));
            }
            refuse_nul(v, k)
        }),
        _ => Ok(()),
    }
}

/// A free-text name an admin gives (a token's, an API key's): at most 100 characters.
pub fn check_name(name: &str) -> Result<(), AdminError> {
    if name.chars().count() > 100 {
        return Err(AdminError::invalid("name: at most 100 characters"));
    }
    Ok(())
}

/// `a=1&b=x&b=y` → `{"a":"1","b":["x","y"]}`; the CSRF field is not input.
pub fn form_to_json(body: &[u8]) -> Value {
    let mut map = Map::new();
    for (k, v) in url::form_urlencoded::parse(body) {
        if k == crate::auth::csrf::FIELD {
            continue;
        }
        let v = Value::String(v.into_owned());
        match map.get_mut(k.as_ref()) {
            Some(Value::Array(a)) => a.push(v),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, v]);
            }
            None => {
                map.insert(k.into_owned(), v);
            }
        }
    }
    Value::Object(map)
}

pub mod de {
    //! `#[serde(default, deserialize_with = "...")]` helpers.
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    fn text(v: Value) -> Option<String> {
        match v {
            Value::Null => None,
            Value::String(s) => {
                let t = s.trim();
                (!t.is_empty()).then(|| t.to_string())
            }
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            other => Some(other.to_string()),
        }
    }

    /// Text, trimmed; empty is absent.
    pub fn opt_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(text(Value::deserialize(d)?))
    }

    /// A secret (a password) exactly as sent: sign-in compares it byte for byte, so a form
    /// that trimmed it would store a password nobody can type (s26 attack admin #2). Empty
    /// is absent.
    pub fn opt_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.filter(|s| !s.is_empty()))
    }

    /// An integer from a number or text; empty is absent.
    pub fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match text(Value::deserialize(d)?) {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a whole number"))),
        }
    }

    /// A boolean as either surface writes it: JSON's, a checkbox's `on`, and the words
    /// for yes and no in any case (`"True"` is a Python client's). Anything else is
    /// refused: read as `false`, `"True"` or `2` enabled a member being disabled (s32 edge
    /// attack F2).
    fn boolean<E: serde::de::Error>(v: Value) -> Result<bool, E> {
        let word = match &v {
            Value::Bool(b) => return Ok(*b),
            Value::Number(n) if n.as_i64() == Some(1) => return Ok(true),
            Value::Number(n) if n.as_i64() == Some(0) => return Ok(false),
            Value::String(s) => s.trim().to_ascii_lowercase(),
            _ => String::new(),
        };
        match word.as_str() {
            "on" | "true" | "1" | "yes" => Ok(true),
            "off" | "false" | "0" | "no" => Ok(false),
            // An empty value too (a script's unset variable enabled a member being
            // disabled: s32 diff2 attack F1); no page sends one for a flag.
            _ => Err(E::custom(format!("`{v}` is not true or false"))),
        }
    }

    /// A checkbox or a JSON boolean; null is absent (`false`).
    pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(false),
            v => boolean(v),
        }
    }

    /// For edits: absent → `None` (unchanged), empty or null → `Some(None)` (cleared).
    pub fn patch_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
        Ok(Some(text(Value::deserialize(d)?)))
    }

    pub fn patch_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
        opt_i64(d).map(Some)
    }

    /// A boolean for edits: absent or null → unchanged (a list of values is refused).
    pub fn opt_flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        match Value::deserialize(d)? {
            // A generated client writes every unset field as null: unchanged.
            Value::Null => Ok(None),
            v => boolean(v).map(Some),
        }
    }

    /// A list from an array, one value, or comma-separated text; empty text (a form's
    /// field left blank) is absent. An array with nothing in it is refused: "none of them"
    /// read as absent gave a token every model (s29 admin attack F4).
    pub fn opt_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
        let (items, array): (Vec<String>, bool) = match Value::deserialize(d)? {
            Value::Null => return Ok(None),
            Value::Array(a) => (a.into_iter().filter_map(text).collect(), true),
            other => (
                text(other)
                    .map(|s| s.split(',').map(|p| p.trim().to_string()).collect())
                    .unwrap_or_default(),
                false,
            ),
        };
        let items: Vec<String> = items.into_iter().filter(|s| !s.is_empty()).collect();
        if array && items.is_empty() {
            return Err(serde::de::Error::custom(
                // The one list field (`models`); serde's message would not name it.
                "an empty list names no model — leave it out (or null) for every model",
            ));
        }
        Ok((!items.is_empty()).then_some(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_become_json_with_arrays_for_repeats() {
        let v = form_to_json(b"name=a+b&models=x&models=y&csrf_token=zz&n=");
        assert_eq!(v["name"], "a b");
        assert_eq!(v["models"], serde_json::json!(["x", "y"]));
        assert!(v.get("csrf_token").is_none());
        assert_eq!(v["n"], "");
    }
}
