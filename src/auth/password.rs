//! Admin passwords: argon2id with OWASP's parameters (19 MiB, 2 passes, 1 lane), hashed
//! on a blocking thread so logins never stall the async workers.

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::{Algorithm, Argon2, Params, Version};

/// Longest password accepted; longer ones are refused before any hashing.
pub const MAX_PASSWORD_BYTES: usize = 1024;
pub const MIN_PASSWORD_CHARS: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("password must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_BYTES} characters")]
    Length,
    #[error("password hashing failed")]
    Hash,
}

fn argon2() -> Argon2<'static> {
    let params = Params::new(19 * 1024, 2, 1, None).unwrap_or_default();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

pub fn hash(password: &str) -> Result<String, PasswordError> {
    if password.len() > MAX_PASSWORD_BYTES || password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(PasswordError::Length);
    }
    let salt = SaltString::generate(&mut OsRng);
    argon2()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|_| PasswordError::Hash)
}

pub fn verify(password: &str, phc: &str) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    PasswordHash::new(phc).is_ok_and(|h| argon2().verify_password(password.as_bytes(), &h).is_ok())
}

pub async fn hash_blocking(password: String) -> Result<String, PasswordError> {
    tokio::task::spawn_blocking(move || hash(&password))
        .await
        .map_err(|_| PasswordError::Hash)?
}

/// Whether a stored hash was made with other parameters than today's (raised parameters
/// are applied at the next successful login).
pub fn needs_rehash(phc: &str) -> bool {
    let Ok(h) = PasswordHash::new(phc) else {
        return true;
    };
    let current = argon2();
    let p = current.params();
    h.algorithm.as_str() != "argon2id"
        || h.params.get_decimal("m") != Some(p.m_cost())
        || h.params.get_decimal("t") != Some(p.t_cost())
        || h.params.get_decimal("p") != Some(p.p_cost())
}

/// A hash of a random password, verified against when the username is unknown, so an
/// unknown user costs the same time as a wrong password.
static DUMMY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let pw = crate::auth::token::generate().text;
    hash(&pw).unwrap_or_default()
});

/// Verifies on a blocking thread; `None` (unknown user) verifies against a dummy hash and
/// fails, in the same time.
pub async fn verify_blocking(password: String, phc: Option<String>) -> bool {
    tokio::task::spawn_blocking(move || match phc {
        Some(phc) => verify(&password, &phc),
        None => {
            let _ = verify(&password, &DUMMY);
            false
        }
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_phc_with_owasp_parameters() {
        let h = hash("correct horse battery").unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify("correct horse battery", &h));
        assert!(!verify("wrong horse battery", &h));
        assert!(matches!(hash("short"), Err(PasswordError::Length)));
        assert!(!needs_rehash(&h));
        assert!(needs_rehash(
            "$argon2id$v=19$m=4096,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
        ));
        assert!(matches!(
            hash(&"x".repeat(2000)),
            Err(PasswordError::Length)
        ));
    }
}
