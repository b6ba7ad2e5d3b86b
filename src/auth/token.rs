//! The sub-token format. `sk-sl-` + 43 base62 characters (256 bits of randomness) + a
//! 6-character base62 CRC-32 checksum. The checksum lets a malformed or mistyped token be
//! refused without touching the database; only the SHA-256 of the whole text is stored.

use rand::RngCore;
use sha2::{Digest, Sha256};

pub const PREFIX: &str = "sk-sl-";
pub const ADMIN_PREFIX: &str = "sk-sl-admin-";
const BODY_LEN: usize = 43;
const CHECK_LEN: usize = 6;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

pub type TokenHash = [u8; 32];

/// A freshly issued token: the text (shown once) and what is stored.
pub struct NewToken {
    pub text: String,
    pub hash: TokenHash,
    pub display_prefix: String,
}

pub fn generate() -> NewToken {
    generate_with(PREFIX)
}

pub fn generate_admin_key() -> NewToken {
    generate_with(ADMIN_PREFIX)
}

fn generate_with(prefix: &str) -> NewToken {
    let mut raw = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let body = base62_fixed(&raw, BODY_LEN);
    let check = checksum(&body);
    let text = format!("{prefix}{body}{check}");
    NewToken {
        hash: hash(&text),
        display_prefix: body[..8].to_string(),
        text,
    }
}

/// Checks the shape and checksum only; `None` means "refuse without a database query".
pub fn parse(text: &str) -> Option<TokenHash> {
    let body = text.strip_prefix(PREFIX)?;
    well_formed(body).then(|| hash(text))
}

/// Same as `parse` for admin API keys (`sk-sl-admin-…`).
pub fn parse_admin(text: &str) -> Option<TokenHash> {
    let body = text.strip_prefix(ADMIN_PREFIX)?;
    well_formed(body).then(|| hash(text))
}

/// The display prefix of an admin key's text (`NewToken::display_prefix` when it was
/// made); `None` for a text that is no admin key.
pub fn admin_display_prefix(text: &str) -> Option<&str> {
    text.strip_prefix(ADMIN_PREFIX)?.get(..8)
}

fn well_formed(body: &str) -> bool {
    if body.len() != BODY_LEN + CHECK_LEN || !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return false;
    }
    let (payload, check) = body.split_at(BODY_LEN);
    checksum(payload) == check
}

pub fn hash(text: &str) -> TokenHash {
    Sha256::digest(text.as_bytes()).into()
}

fn checksum(payload: &str) -> String {
    let crc = crc32fast::hash(payload.as_bytes());
    base62_fixed(&crc.to_be_bytes(), CHECK_LEN)
}

/// Big-endian bytes to exactly `len` base62 digits (zero-padded, high digits dropped).
fn base62_fixed(bytes: &[u8], len: usize) -> String {
    let mut digits = bytes.to_vec();
    let mut out = vec![b'0'; len];
    for slot in out.iter_mut().rev() {
        let mut rem: u32 = 0;
        for d in digits.iter_mut() {
            let acc = (rem << 8) | u32::from(*d);
            *d = (acc / 62) as u8;
            rem = acc % 62;
        }
        *slot = ALPHABET[rem as usize];
    }
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_parse_and_typos_do_not() {
        let t = generate();
        assert!(t.text.starts_with(PREFIX));
        assert_eq!(t.text.len(), PREFIX.len() + BODY_LEN + CHECK_LEN);
        assert_eq!(parse(&t.text), Some(t.hash));
        let mut typo = t.text.clone().into_bytes();
        let i = PREFIX.len() + 5;
        typo[i] = if typo[i] == b'a' { b'b' } else { b'a' };
        assert_eq!(parse(std::str::from_utf8(&typo).unwrap()), None);
        assert_eq!(parse("sk-sl-short"), None);
        assert_eq!(parse("Bearer x"), None);
        assert!(!t.text.contains(&hex::encode(t.hash)));
    }

    #[test]
    fn admin_keys_are_a_separate_namespace() {
        let k = generate_admin_key();
        assert!(parse_admin(&k.text).is_some());
        assert!(parse(&k.text).is_none());
        assert!(parse_admin(&generate().text).is_none());
    }
}
