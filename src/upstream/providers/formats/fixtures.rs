//! The golden fixtures' one loader for unit tests: `tests/fixtures/<provider>/<path>`
//! (shapes from the providers' API references), as text or JSON. A missing or malformed
//! file fails the test naming its path.

use serde_json::Value;

/// The fixture's text.
pub fn text(provider: &str, path: &str) -> String {
    let p = format!(
        "{}/tests/fixtures/{provider}/{path}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The fixture, parsed as JSON.
pub fn json(provider: &str, path: &str) -> Value {
    serde_json::from_str(&text(provider, path))
        .unwrap_or_else(|e| panic!("tests/fixtures/{provider}/{path}: {e}"))
}
