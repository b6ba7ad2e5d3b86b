//! A held reservation. `Quota::reserve` runs the CAS; the returned `Held` must be settled
//! with the actual cost. If it is dropped unsettled (the client went away while the
//! handler awaited the upstream), it settles itself in the background at the cost given
//! by `set_cost_if_dropped` (the counted input by default), so no reservation is left behind.

use std::sync::Arc;

use chrono::Duration;
use sqlx::SqlitePool;

use super::QuotaError;
use crate::clock::Clock;
use crate::store::ledger::{self, Owner, Refusal, Reservation, ReserveRequest, Settled};
use crate::store::writer::Writer;

pub struct Quota {
    /// The group-commit writer: reservations and settlements of concurrent requests share
    /// one transaction (see `store::writer`).
    writer: Writer,
    clock: Arc<dyn Clock>,
    /// This process's id, the owner of its reservations (see `store::processes`).
    process_id: String,
}

/// How long a reservation may stay open before a sweeper may treat it as abandoned.
const RESERVATION_DEADLINE: Duration = Duration::minutes(30);

impl Quota {
    /// Starts a writer of its own over the write pool.
    pub fn new(write: SqlitePool, clock: Arc<dyn Clock>, process_id: String) -> Arc<Self> {
        Self::with_writer(Writer::start(write), clock, process_id)
    }

    /// Shares a writer (the gateway shares it with the request log).
    pub fn with_writer(writer: Writer, clock: Arc<dyn Clock>, process_id: String) -> Arc<Self> {
        Arc::new(Self {
            writer,
            clock,
            process_id,
        })
    }

    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    pub fn process_id(&self) -> &str {
        &self.process_id
    }

    pub async fn reserve(
        self: &Arc<Self>,
        request_id: &str,
        owner: &Owner,
        amount: i64,
    ) -> Result<Held, QuotaError> {
        let now = self.clock.now();
        let req = ReserveRequest {
            request_id,
            owner,
            amount,
            process: &self.process_id,
            deadline: now + RESERVATION_DEADLINE,
            now,
        };
        match ledger::reserve_via(&self.writer, &req).await? {
            Ok(resv) => Ok(Held {
                resv: Some(resv),
                quota: self.clone(),
                cost_if_dropped: 0,
            }),
            Err(Refusal::TokenGone) => Err(QuotaError::TokenGone),
            Err(Refusal::Insufficient(level)) => {
                let reset = owner.resets[level as usize];
                Err(QuotaError::Insufficient {
                    level: level.as_str(),
                    retry_after: reset.seconds_to_reset(now),
                })
            }
        }
    }

    /// A `Held` with nothing reserved (the benchmark ladder's steps below `quota`).
    pub fn unreserved(self: &Arc<Self>) -> Held {
        Held {
            resv: None,
            quota: self.clone(),
            cost_if_dropped: 0,
        }
    }

    async fn settle(&self, resv: Reservation, actual: i64) -> Result<Option<Settled>, QuotaError> {
        Ok(ledger::settle_via(&self.writer, resv, actual, self.clock.now()).await?)
    }
}

pub struct Held {
    resv: Option<Reservation>,
    quota: Arc<Quota>,
    cost_if_dropped: i64,
}

impl Held {
    pub fn amount(&self) -> i64 {
        self.resv.as_ref().map(|r| r.amount).unwrap_or(0)
    }

    /// The tightest remaining balance right after reserving.
    pub fn remaining(&self) -> Option<i64> {
        self.resv.as_ref().and_then(|r| r.remaining)
    }

    /// The token's own remaining balance right after reserving.
    pub fn token_remaining(&self) -> Option<i64> {
        self.resv.as_ref().and_then(|r| r.token_remaining)
    }

    pub fn set_cost_if_dropped(&mut self, micros: i64) {
        self.cost_if_dropped = micros;
    }

    /// Settles at the actual cost (capped at the reservation by the ledger).
    pub async fn settle(mut self, actual: i64) -> Result<Settled, QuotaError> {
        let Some(resv) = self.resv.take() else {
            return Ok(Settled {
                charged: 0,
                absorbed: 0,
                remaining: None,
                token_remaining: None,
            });
        };
        let unchanged = Settled {
            charged: 0,
            absorbed: 0,
            remaining: resv.remaining,
            token_remaining: resv.token_remaining,
        };
        let settled = self.quota.settle(resv, actual).await?;
        Ok(settled.unwrap_or(unchanged))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(resv) = self.resv.take() else { return };
        let quota = self.quota.clone();
        let cost = self.cost_if_dropped;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let request_id = resv.request_id.clone();
                    if let Err(e) = quota.settle(resv, cost).await {
                        tracing::error!(request_id = %request_id, error = %e, "settling an abandoned reservation failed; it will be settled as an orphan at the next start");
                    }
                });
            }
            Err(_) => {
                tracing::error!(request_id = %resv.request_id, "reservation dropped outside a runtime; left for orphan recovery")
            }
        }
    }
}
