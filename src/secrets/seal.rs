//! Sealing of the secrets the database holds (upstream keys added in the admin UI or API):
//! AES-256-GCM under the master key's subkey `sluice/upstream-keys/v1`, a fresh random
//! 96-bit nonce per value, and the value's purpose (e.g. `upstream:<id>`) as associated
//! data, so a ciphertext copied to another row does not open there. A sealed value is
//! `nonce ‖ ciphertext ‖ tag`.
//!
//! A wrong master key must not be used: the database holds one sealed check value
//! (`CHECK_PURPOSE`), written at the first start; a start whose key does not open it stops
//! (`store::managed::check_master_key`).

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use secrecy::SecretString;

use super::MasterKey;

/// The subkey's label: the purpose and its version.
const LABEL: &str = "sluice/upstream-keys/v1";
const NONCE_LEN: usize = 12;
/// The associated data of the check value.
pub const CHECK_PURPOSE: &str = "sluice/seal-check";
const CHECK_TEXT: &[u8] = b"sluice sealed check v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// The value was sealed under another key or for another purpose, or altered.
    #[error("the value does not open under this master key (another key sealed it, or it was altered or moved to another row)")]
    DoesNotOpen,
    #[error("the opened value is not UTF-8 text")]
    NotText,
}

/// Seals and opens values under the upstream-keys subkey; tags keys under another.
pub struct Sealer {
    aead: Aes256Gcm,
    /// `TAG_LABEL`'s subkey, for `tag`.
    tags: [u8; 32],
}

/// The subkey of key tags (`Sealer::tag`).
const TAG_LABEL: &str = "sluice/key-tags/v1";

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub fn new(master: &MasterKey) -> Sealer {
        let sub = master.subkey(LABEL);
        let mut tags = [0u8; 32];
        tags.copy_from_slice(master.subkey(TAG_LABEL).bytes());
        Sealer {
            aead: Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(sub.bytes())),
            tags,
        }
    }

    /// A 32-bit tag of `data` (an upstream key) that every replica with the master key
    /// computes alike and no one without it can compute: HMAC-SHA256 under its own subkey,
    /// so a tag in Redis confirms no guess of a weak key (`Deployment::shared_name`).
    pub fn tag(&self, data: &[u8]) -> u32 {
        let out = self.digest(data);
        u32::from_be_bytes([out[0], out[1], out[2], out[3]])
    }

    /// The whole HMAC-SHA256 of `data` under the tags' subkey: an identity of secrets that
    /// can be compared (two catalogs' credentials, `Deployment::credential_id`) and printed
    /// without telling anything of them.
    #[allow(clippy::expect_used)]
    pub fn digest(&self, data: &[u8]) -> [u8; 32] {
        use hmac::Mac;
        // cannot fail: HMAC takes a key of any length.
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.tags)
            .expect("HMAC takes any key length");
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    /// `clear` sealed for `purpose` under a fresh random nonce.
    #[allow(clippy::expect_used)]
    pub fn seal(&self, purpose: &str, clear: &[u8]) -> Vec<u8> {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = self
            .aead
            .encrypt(
                &nonce,
                Payload {
                    msg: clear,
                    aad: purpose.as_bytes(),
                },
            )
            // cannot fail: AES-GCM refuses only messages over 64 GiB; what is sealed is an
            // upstream key (an admin request's field, under the body limit), far shorter.
            .expect("AES-256-GCM seals any value under 64 GiB");
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The value sealed for `purpose`, or an error if this key and purpose did not seal it.
    pub fn open(&self, purpose: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::DoesNotOpen);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        self.aead
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: purpose.as_bytes(),
                },
            )
            .map_err(|_| SealError::DoesNotOpen)
    }

    /// A sealed text value (an upstream key), opened.
    pub fn open_text(&self, purpose: &str, sealed: &[u8]) -> Result<SecretString, SealError> {
        let clear = self.open(purpose, sealed)?;
        String::from_utf8(clear)
            .map(SecretString::from)
            .map_err(|_| SealError::NotText)
    }

    /// The check value a database stores once, to tell a wrong master key at start.
    pub fn check_value(&self) -> Vec<u8> {
        self.seal(CHECK_PURPOSE, CHECK_TEXT)
    }

    /// Whether `sealed` is the check value of this key.
    pub fn opens_check(&self, sealed: &[u8]) -> Result<(), SealError> {
        match self.open(CHECK_PURPOSE, sealed)? {
            t if t == CHECK_TEXT => Ok(()),
            _ => Err(SealError::DoesNotOpen),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn key(byte: &str) -> MasterKey {
        MasterKey::from_hex(&byte.repeat(32)).unwrap()
    }

    #[test]
    fn a_sealed_value_opens_only_under_its_key_and_purpose() {
        let s = Sealer::new(&key("ab"));
        let sealed = s.seal("upstream:a", b"sk-secret-1234");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let opened = s.open_text("upstream:a", &sealed).unwrap();
        assert_eq!(opened.expose_secret(), "sk-secret-1234");
        // Moved to another row: refused.
        assert_eq!(s.open("upstream:b", &sealed), Err(SealError::DoesNotOpen));
        // Another master key: refused.
        let other = Sealer::new(&key("cd"));
        assert_eq!(
            other.open("upstream:a", &sealed),
            Err(SealError::DoesNotOpen)
        );
        // Altered: refused; truncated: refused.
        let mut bad = sealed.clone();
        bad[NONCE_LEN] ^= 1;
        assert_eq!(s.open("upstream:a", &bad), Err(SealError::DoesNotOpen));
        assert_eq!(
            s.open("upstream:a", &sealed[..5]),
            Err(SealError::DoesNotOpen)
        );
    }

    #[test]
    fn every_seal_takes_a_fresh_nonce() {
        let s = Sealer::new(&key("ab"));
        assert_ne!(s.seal("p", b"same"), s.seal("p", b"same"));
    }

    /// Replicas with the master key tag a key alike; without it the tag cannot be made
    /// (another master key tags otherwise), so a tag confirms no guess of the key.
    #[test]
    fn a_tag_is_the_master_keys_to_make() {
        let (a, b) = (Sealer::new(&key("ab")), Sealer::new(&key("cd")));
        assert_eq!(a.tag(b"sk-key"), Sealer::new(&key("ab")).tag(b"sk-key"));
        assert_ne!(a.tag(b"sk-key"), b.tag(b"sk-key"));
        assert_ne!(a.tag(b"sk-key"), a.tag(b"sk-kez"));
    }

    #[test]
    fn the_check_value_tells_the_key() {
        let s = Sealer::new(&key("ab"));
        let check = s.check_value();
        assert_eq!(s.opens_check(&check), Ok(()));
        assert_eq!(
            Sealer::new(&key("cd")).opens_check(&check),
            Err(SealError::DoesNotOpen)
        );
    }
}
