//! `Input<T>`: one body extractor for both surfaces. A JSON body is parsed as it is; a form
//! body (htmx or plain) is first turned into a JSON object — a repeated key (checkboxes)
//! becomes an array — so the same `Deserialize` struct and the same validation serve the API
//! and the UI. The `de` helpers accept what either sends: numbers as numbers or text, an
//! empty field as absent, a checkbox as `on`.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::AdminError;

const MAX_BODY: usize = 256 * 1024;

pub struct Input<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for Input<T> {
    type Error = AdminError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, AdminError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let is_json = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let body = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            let body = body.await.map_err(|_| AdminError::TooLarge)?;
            if body.len() > MAX_BODY {
                return Err(AdminError::TooLarge);
            }
            let value = if is_json {
                if body.is_empty() {
                    Value::Object(Map::new())
                } else {
                    serde_json::from_slice(&body)
                        .map_err(|e| AdminError::invalid(format!("invalid JSON: {e}")))?
                }
            } else {
                form_to_json(&body)
            };
            refuse_nul(&value, "")?;
            serde_json::from_value(value)
                .map(Input)
                .map_err(|e| AdminError::invalid(format!("invalid input: {e}")))
        })
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

    /// A checkbox or a JSON boolean.
    pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Bool(b) => b,
            Value::String(s) => matches!(s.as_str(), "on" | "true" | "1" | "yes"),
            Value::Number(n) => n.as_i64() == Some(1),
            _ => false,
        })
    }

    /// For edits: absent → `None` (unchanged), empty or null → `Some(None)` (cleared).
    pub fn patch_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
        Ok(Some(text(Value::deserialize(d)?)))
    }

    pub fn patch_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
        opt_i64(d).map(Some)
    }

    /// A boolean for edits: absent → unchanged; the last of repeated values wins.
    pub fn opt_flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        let v = match Value::deserialize(d)? {
            Value::Array(mut a) => a.pop().unwrap_or(Value::Null),
            v => v,
        };
        Ok(Some(match v {
            Value::Bool(b) => b,
            Value::String(s) => matches!(s.as_str(), "on" | "true" | "1" | "yes"),
            Value::Number(n) => n.as_i64() == Some(1),
            _ => false,
        }))
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
                "models: an empty list names no model — leave it out (or null) for every model",
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
