//! Finance: Sluice's figures held against the providers' bills (`reconcile`, from the cost
//! exports read by `exports`, amounts exact by `decimal`; `usage_reconcile`, tokens against
//! OpenAI's usage export), and budgets projected forward (`forecast`).

pub mod alerts;
pub mod budgets;
pub mod decimal;
pub mod digest;
pub mod exports;
pub mod forecast;
pub mod reconcile;
pub mod run;
pub mod usage_reconcile;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum FinanceError {
    /// The export could not be read: the message names the problem and where it is.
    #[error("{0}")]
    Unreadable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}
