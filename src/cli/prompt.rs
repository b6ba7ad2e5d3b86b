//! The password of a new or reset admin login, as the operator gives it or generated.

use std::io::Read;

/// A new admin password: from standard input, else `SLUICE_ADMIN_PASSWORD`, else a
/// generated one (the flag says whether to print it).
pub fn new_password(stdin: bool) -> anyhow::Result<(String, bool)> {
    Ok(if stdin {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        (s.trim_end_matches(['\n', '\r']).to_string(), false)
    } else if let Ok(p) = std::env::var("SLUICE_ADMIN_PASSWORD") {
        (p, false)
    } else {
        (crate::auth::token::generate().text[6..30].to_string(), true)
    })
}
