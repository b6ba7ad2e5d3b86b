//! What every handler shares: settings, database pools, the clock, and the stage objects.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::auth::password::Passwords;
use crate::auth::Authenticator;
use crate::cache::Cache;
use crate::clock::Clock;
use crate::config::Settings;
use crate::ops::alerts::Alerter;
use crate::ops::metrics;
use crate::ops::request_log::RequestLog;
use crate::queue::Queue;
use crate::quota::reservation::Quota;
use crate::ratelimit::Windows;
use crate::store::ledger::Balance;
use crate::store::{self, Db, StoreError};
use crate::upstream::catalog::Catalog;
use crate::upstream::client::UpstreamClient;
use crate::upstream::live::Live;
use crate::upstream::pool::Pool;

pub struct AppState {
    pub settings: Arc<Settings>,
    pub db: Db,
    pub clock: Arc<dyn Clock>,
    pub auth: Arc<Authenticator>,
    /// Every argon2 hash and verification of the admin surface, at most `PERMITS` at once.
    pub passwords: Passwords,
    pub quota: Arc<Quota>,
    /// The catalog and key pool in use, swapped whole when they change (`upstream::live`).
    pub live: Arc<Live>,
    pub upstream: Arc<UpstreamClient>,
    pub request_log: RequestLog,
    pub windows: Arc<Windows>,
    pub queue: Arc<Queue>,
    pub cache: Arc<Cache>,
    pub alerts: Arc<Alerter>,
    /// Single sign-on for the admin UI, when `[oidc]` is configured.
    pub sso: Option<Arc<crate::auth::oidc::Sso>>,
    /// The runtime that built the gateway, which outlives its workers (each stopped with
    /// its own runtime at the shutdown): where what must finish though its worker stopped
    /// runs — a stream's settlement, a departed request's row.
    pub runtime: tokio::runtime::Handle,
}

impl AppState {
    /// The catalog of the moment; a request keeps the one it started with.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.live.catalog()
    }

    /// The key pool of the moment. Its entries are shared with every later pool, and it
    /// has an entry for every deployment of any earlier catalog.
    pub fn pool(&self) -> Arc<Pool> {
        self.live.pool()
    }

    /// This host's time on the database's clock (`Authenticator::on_db_clock`; the host's
    /// own on SQLite): what cache entries are stamped, looked up and evicted by. Hosts share
    /// the entries on PostgreSQL, and one whose clock ran ahead evicted every host's live
    /// entries, one behind served them past their TTL (s31 cache attack F3).
    pub fn cache_now(&self) -> DateTime<Utc> {
        self.auth.on_db_clock(self.clock.now())
    }

    /// A token's budget as the ledger has it now (`GET /v1/usage`).
    pub async fn balance(&self, token_id: i64, now: DateTime<Utc>) -> Result<Balance, StoreError> {
        store::ledger::balance(&self.db, token_id, now).await
    }

    /// Whether every migration this binary knows is applied (`/readyz`); an error when the
    /// database does not answer.
    pub async fn migrations_applied(&self) -> Result<bool, StoreError> {
        store::migrations_applied(&self.db).await
    }

    /// `/metrics`: the scrape-time gauges from this moment's catalog, pool, queue and
    /// windows, then every metric in Prometheus's text format.
    pub fn metrics_text(&self) -> String {
        let live = self.live.snapshot();
        let depth = self.queue.depth();
        metrics::render(&metrics::Scrape {
            now_ms: self.clock.monotonic_ms(),
            live: &live,
            queue_depth: &depth,
            ratelimit_degraded: self.windows.degraded(),
            cache_rows_refused: crate::store::cache::refused_so_far(),
        })
    }
}
