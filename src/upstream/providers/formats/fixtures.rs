//! The golden fixtures the adapters' tests read: providers' documented answers, streams
//! and errors under `tests/fixtures/<provider>/`.

use serde_json::Value;

/// The text of `tests/fixtures/<provider>/<path>`.
pub fn text(provider: &str, path: &str) -> String {
    let p = format!(
        "{}/tests/fixtures/{provider}/{path}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The same, read as one JSON value.
pub fn json(provider: &str, path: &str) -> Value {
    serde_json::from_str(&text(provider, path)).unwrap_or_else(|e| panic!("{provider}/{path}: {e}"))
}
