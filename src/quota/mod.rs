//! Budgets: what a request may cost at worst (`pricing`, `estimate`, `images`, `documents`,
//! the last two at the positions `parts` names), which period a balance belongs to
//! (`period`), and the reservation that holds the money between the CAS and the settlement (`reservation`). The CAS itself is `store::ledger`.

pub mod documents;
pub mod estimate;
pub mod fill;
pub mod images;
pub mod long_tiers;
mod parts;
mod pdf;
pub mod period;
pub mod pricing;
pub mod reservation;
pub mod schedule;
pub mod tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error("budget exhausted at the {level} level")]
    Insufficient {
        level: &'static str,
        retry_after: Option<u64>,
    },
    #[error("token revoked or expired")]
    TokenGone,
    /// The token was rotated after its request was authenticated (its successor named):
    /// nothing was reserved, and its text now works as the successor (`Refusal::Rotated`).
    #[error("token rotated to token {0}")]
    Rotated(i64),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}
