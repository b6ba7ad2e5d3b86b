//! Admin passwords: argon2id with OWASP's parameters (19 MiB, 2 passes, 1 lane), hashed
//! on a blocking thread so logins never stall the async workers, and at most `PERMITS` at
//! once in a gateway (`Passwords`), so a flood of sign-ins cannot take its memory.
//!
//! Each computation runs in working memory the caller hands to argon2
//! (`hash_password_into_with_memory`): a gateway keeps one buffer per permit and reuses it.
//! Left to the allocator, every blocking thread's 19 MiB would be freed into that thread's
//! malloc arena and kept there (glibc raises its mmap threshold after the first free), so
//! peak memory grew with the number of threads that ever hashed, not with the permits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use argon2::password_hash::{
    rand_core::{OsRng, RngCore},
    Output, ParamsString, PasswordHash, Salt, SaltString,
};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::ops::metrics;

/// Longest password accepted; longer ones are refused before any hashing.
pub const MAX_PASSWORD_BYTES: usize = 1024;
pub const MIN_PASSWORD_CHARS: usize = 12;

/// argon2's memory per computation, in KiB (OWASP: 19 MiB).
pub const M_COST_KIB: u32 = 19 * 1024;

/// How many argon2 computations may run at once in one gateway process. Each holds its
/// 19 MiB (`M_COST_KIB`) while it runs, so 4 hold 76 MiB: a seventh of the 512 MiB the
/// compose file gives the gateway, leaving the rest to `/v1` traffic however many sign-ins
/// arrive. More permits would not sign anyone in sooner on the 2 cores the compose file
/// gives it (argon2 is CPU-bound); fewer would make one slow sign-in keep others waiting.
pub const PERMITS: usize = 4;

/// How long an attempt waits for a permit before it is answered 429 with `Retry-After`
/// (one computation takes tens of milliseconds, so only a flood waits this long).
pub const WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("password must be {MIN_PASSWORD_CHARS} to {MAX_PASSWORD_BYTES} characters")]
    Length,
    #[error("password hashing failed")]
    Hash,
    #[error("too many passwords are being checked right now; try again in {retry_after} seconds")]
    Busy { retry_after: u64 },
}

fn todays_params() -> Params {
    Params::new(M_COST_KIB, 2, 1, None).unwrap_or_default()
}

/// The length rule for a new password, checked before any hashing.
pub fn check_length(password: &str) -> Result<(), PasswordError> {
    if password.len() > MAX_PASSWORD_BYTES || password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(PasswordError::Length);
    }
    Ok(())
}

/// argon2 over `password` and `salt` in `memory` (grown to the parameters' size when
/// short; larger parameters than today's, from an old hash, use a buffer of their own).
fn compute(
    algorithm: Algorithm,
    version: Version,
    params: Params,
    password: &str,
    salt: Salt<'_>,
    memory: &mut Vec<Block>,
) -> Option<Output> {
    let mut raw = [0u8; Salt::MAX_LENGTH];
    let salt = salt.decode_b64(&mut raw).ok()?;
    let blocks = params.block_count();
    let len = params.output_len().unwrap_or(Params::DEFAULT_OUTPUT_LEN);
    let argon2 = Argon2::new(algorithm, version, params);
    let mut own = Vec::new();
    let memory = if blocks <= todays_params().block_count() {
        memory
    } else {
        &mut own
    };
    if memory.len() < blocks {
        memory.resize(blocks, Block::default());
    }
    Output::init_with(len, |out| {
        argon2
            .hash_password_into_with_memory(password.as_bytes(), salt, out, &mut memory[..])
            .map_err(|_| argon2::password_hash::Error::Crypto)
    })
    .ok()
}

fn hash_in(password: &str, memory: &mut Vec<Block>) -> Result<String, PasswordError> {
    check_length(password)?;
    let salt = SaltString::generate(&mut OsRng);
    let p = todays_params();
    let params_string = ParamsString::try_from(&p).map_err(|_| PasswordError::Hash)?;
    let (algorithm, version) = (Algorithm::Argon2id, Version::V0x13);
    let output = compute(algorithm, version, p, password, salt.as_salt(), memory)
        .ok_or(PasswordError::Hash)?;
    let phc = PasswordHash {
        algorithm: algorithm.ident(),
        version: Some(version.into()),
        params: params_string,
        salt: Some(salt.as_salt()),
        hash: Some(output),
    };
    Ok(phc.to_string())
}

/// Whether `password` matches the PHC string `phc`, with `phc`'s own parameters; the
/// outputs are compared in constant time (`Output`'s equality).
fn verify_in(password: &str, phc: &str, memory: &mut Vec<Block>) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    let Ok(h) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (h.salt, h.hash) else {
        return false;
    };
    let Ok(algorithm) = Algorithm::try_from(h.algorithm) else {
        return false;
    };
    let version = match h.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let Ok(params) = Params::try_from(&h) else {
        return false;
    };
    compute(algorithm, version, params, password, salt, memory).is_some_and(|out| out == expected)
}

/// Hashes a new password (own working memory).
pub fn hash(password: &str) -> Result<String, PasswordError> {
    hash_in(password, &mut Vec::new())
}

/// Whether `password` matches `phc` (own working memory).
pub fn verify(password: &str, phc: &str) -> bool {
    verify_in(password, phc, &mut Vec::new())
}

/// Hashes on a blocking thread without the gateway's bound: for one-shot processes (the
/// CLI's `admin create`) that hash one password and exit. The gateway uses `Passwords`.
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
    let p = todays_params();
    h.algorithm.as_str() != "argon2id"
        || h.params.get_decimal("m") != Some(p.m_cost())
        || h.params.get_decimal("t") != Some(p.t_cost())
        || h.params.get_decimal("p") != Some(p.p_cost())
}

/// The gateway's bounded password hashing: every argon2 hash and verification of a
/// running gateway (sign-in, password change, creating a login, resetting a password) goes
/// through one of these, shared by the process.
pub struct Passwords {
    permits: Arc<Semaphore>,
    wait: Duration,
    /// Working memory, one buffer per computation that ever ran at once (≤ the permits),
    /// taken by a computation and put back when it ends.
    memory: Arc<Mutex<Vec<Vec<Block>>>>,
    /// What an unknown username is verified against, so it costs the same as a wrong
    /// password (`dummy_phc`).
    dummy: Arc<str>,
    /// Computations waiting for a permit now: what a test watches to know a sign-in has
    /// read its login and stands between that read and its verification.
    waiting: Arc<AtomicUsize>,
}

/// A PHC string with today's parameters, a random salt and a random output: verifying
/// against it costs one full argon2 computation and never matches (a 2^-256 chance), and
/// making it costs none — so not even the first unknown user pays for two.
fn dummy_phc() -> String {
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    OsRng.fill_bytes(&mut out);
    let salt = SaltString::generate(&mut OsRng);
    let p = todays_params();
    let (Ok(params), Ok(hash)) = (ParamsString::try_from(&p), Output::new(&out)) else {
        return String::new();
    };
    PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params,
        salt: Some(salt.as_salt()),
        hash: Some(hash),
    }
    .to_string()
}

impl Default for Passwords {
    fn default() -> Self {
        Passwords::new(PERMITS, WAIT)
    }
}

impl Passwords {
    pub fn new(permits: usize, wait: Duration) -> Self {
        Passwords {
            permits: Arc::new(Semaphore::new(permits)),
            wait,
            memory: Arc::new(Mutex::new(Vec::new())),
            dummy: dummy_phc().into(),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A permit, or `Busy` after waiting `wait`.
    async fn permit(&self) -> Result<OwnedSemaphorePermit, PasswordError> {
        // Counted down when the wait ends, also when the request is dropped while waiting.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(&self.waiting);
        let got = tokio::time::timeout(self.wait, self.permits.clone().acquire_owned()).await;
        drop(waiting);
        match got {
            Ok(Ok(p)) => Ok(p),
            _ => {
                metrics::password_busy();
                Err(PasswordError::Busy {
                    retry_after: self.wait.as_secs().max(1),
                })
            }
        }
    }

    /// Runs `work` on a blocking thread with a permit and a buffer. Both move into the
    /// thread and are given back when the computation ends — not when the request does:
    /// a client that hangs up does not free a permit whose argon2 still runs.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Vec<Block>) -> T + Send + 'static,
    ) -> Result<T, PasswordError> {
        let permit = self.permit().await?;
        let pool = self.memory.clone();
        tokio::task::spawn_blocking(move || {
            let mut memory = pool.lock().pop().unwrap_or_default();
            let out = work(&mut memory);
            pool.lock().push(memory);
            drop(permit);
            out
        })
        .await
        .map_err(|_| PasswordError::Hash)
    }

    /// Hashes a new password (its length is checked before any permit is taken).
    pub async fn hash(&self, password: String) -> Result<String, PasswordError> {
        check_length(&password)?;
        self.run(move |memory| hash_in(&password, memory)).await?
    }

    /// Whether `password` matches `phc`. `None` (an unknown user) is verified against a
    /// dummy hash and fails, at the same cost; either way one verification is counted in
    /// `gateway_password_verifications_total`. `Busy` when no permit came in time.
    pub async fn verify(
        &self,
        password: String,
        phc: Option<String>,
    ) -> Result<bool, PasswordError> {
        if password.len() > MAX_PASSWORD_BYTES {
            return Ok(false);
        }
        let dummy = self.dummy.clone();
        self.run(move |memory| {
            metrics::password_verified();
            match phc {
                Some(phc) => verify_in(&password, &phc, memory),
                None => {
                    let _ = verify_in(&password, &dummy, memory);
                    false
                }
            }
        })
        .await
    }

    /// How many computations wait for a permit now (for tests of what happens meanwhile).
    #[doc(hidden)]
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Holds every permit until the guard is dropped, as a flood of sign-ins would: for
    /// tests of the busy answer.
    #[doc(hidden)]
    pub async fn occupy(&self) -> Option<OwnedSemaphorePermit> {
        let all = u32::try_from(self.permits.available_permits()).ok()?;
        self.permits.clone().acquire_many_owned(all).await.ok()
    }
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

    /// Hashes stored before the buffers were the caller's, and argon2's own verifier, agree
    /// with ours — including another memory size than today's.
    #[test]
    fn agrees_with_argon2s_own_hasher_and_verifier() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let salt = SaltString::generate(&mut OsRng);
        for m in [M_COST_KIB, 4096] {
            let theirs = Argon2::new(
                Algorithm::Argon2id,
                Version::V0x13,
                Params::new(m, 2, 1, None).unwrap(),
            )
            .hash_password(b"correct horse battery", &salt)
            .unwrap()
            .to_string();
            assert!(verify("correct horse battery", &theirs));
            assert!(!verify("correct horse batterz", &theirs));
        }
        let ours = hash("correct horse battery").unwrap();
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(Argon2::default()
            .verify_password(b"correct horse battery", &parsed)
            .is_ok());
        assert!(!verify("correct horse battery", "not a phc string"));
    }

    /// The dummy costs what a real hash of today's parameters costs, and matches nothing.
    #[test]
    fn the_dummy_is_a_well_formed_hash_of_todays_parameters() {
        let d = dummy_phc();
        assert!(d.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{d}");
        assert!(!needs_rehash(&d));
        assert!(!verify("", &d));
        assert_ne!(d, dummy_phc());
    }

    #[tokio::test]
    async fn a_full_bound_answers_busy_after_the_wait_and_counts_nothing() {
        let p = Passwords::new(1, Duration::from_millis(20));
        let h = p.hash("correct horse battery".into()).await.unwrap();
        assert!(p
            .verify("correct horse battery".into(), Some(h.clone()))
            .await
            .unwrap());
        let held = p.occupy().await.unwrap();
        assert!(matches!(
            p.verify("correct horse battery".into(), Some(h.clone()))
                .await,
            Err(PasswordError::Busy { retry_after: 1 })
        ));
        assert!(matches!(
            p.hash("another good passphrase".into()).await,
            Err(PasswordError::Busy { .. })
        ));
        // A bad length is refused without waiting for a permit.
        assert!(matches!(
            p.hash("short".into()).await,
            Err(PasswordError::Length)
        ));
        drop(held);
        assert!(!p
            .verify("wrong horse battery".into(), Some(h))
            .await
            .unwrap());
        assert!(!p.verify("anything at all".into(), None).await.unwrap());
    }
}
