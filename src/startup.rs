//! `Application::build(settings)` → a bound server and its port; used by `serve` and by the
//! tests (which bind port 0).

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::{Server, Service};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, App, HttpServer};

use crate::auth::oidc::Sso;
use crate::auth::password::Passwords;
use crate::auth::Authenticator;
use crate::cache::Cache;
use crate::clock::{Clock, SystemClock};
use crate::config::{ConfigError, Ladder, Settings};
use crate::ops::alerts::Alerter;
use crate::ops::{audit_head, housekeeping, metrics, request_log::RequestLog};
use crate::pipeline::drain::Drain;
use crate::queue::Queue;
use crate::quota::{estimate, reservation::Quota};
use crate::ratelimit::redis_window::RedisWindows;
use crate::ratelimit::Windows;
use crate::state::AppState;
use crate::store::ledger::{self, Orphans};
use crate::store::writer::Writer;
use crate::store::{processes, Db, StoreError};
use crate::upstream::client::UpstreamClient;
use crate::upstream::live::Live;
use crate::{admin, api, pipeline};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot listen on {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("invalid Redis URL: {0}")]
    Redis(String),
    #[error("cannot build the upstream client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("cannot set up single sign-on: {0}")]
    Sso(String),
    #[error(transparent)]
    Catalog(#[from] crate::upstream::live::LiveError),
}

pub struct Application {
    port: u16,
    server: Server,
    state: Arc<AppState>,
    drain: Drain,
    /// Held until the process table is left (`run_until_stopped`).
    liveness: processes::Liveness,
}

/// How long the workers get, after the shutdown ended the requests still running
/// (`Drain`), to settle them and close their connections before they are stopped.
pub const SETTLE_MARGIN: Duration = Duration::from_secs(3);

/// How long the exit waits to settle reservations of unknown outcome (`Quota::settle_unsure`).
const UNSURE_AT_EXIT: Duration = Duration::from_secs(10);

/// How long the exit waits for the queued request-log rows, cache entries and hit counts: on
/// PostgreSQL a batch is retried for minutes while the database is out of reach
/// (`pg::lingering`), and a supervisor's stop must not wait for that.
const ROWS_AT_EXIT: Duration = Duration::from_secs(10);

// A stream whose answer was whole at the drain is read on, and its client waited for, at
// most `AFTER_THE_FINISH` from the drain, its response stored by `STORED_BY`: done before
// its worker is stopped.
const _: () = {
    use crate::pipeline::{responses::STORED_BY, stream::AFTER_THE_FINISH};
    assert!(AFTER_THE_FINISH.as_millis() < STORED_BY.as_millis());
    assert!(STORED_BY.as_millis() < SETTLE_MARGIN.as_millis());
};

/// Stops a running server: see `Shutdown::stop`.
#[derive(Clone)]
pub struct Shutdown {
    server: actix_web::dev::ServerHandle,
    drain: Drain,
    timeout: Duration,
}

impl Shutdown {
    /// Stops accepting; lets requests and streams run for `grace` (the configured
    /// `shutdown_timeout_seconds` on SIGTERM, none on SIGINT); then ends the ones still
    /// running (`Drain`: each settles and writes its log row on its worker), and gives the
    /// workers `SETTLE_MARGIN` to finish before they are stopped. Resolves once the server
    /// stopped.
    pub async fn stop(&self, grace: Duration) {
        let grace = grace.min(self.timeout);
        let server = self.server.clone();
        let mut stopped = tokio::spawn(async move { server.stop(true).await });
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(grace) => {}
            // `end_now`: a second signal cut the grace short.
            _ = self.drain.started() => {}
        }
        tracing::info!("shutdown: ending the requests still running");
        self.drain.start();
        let _ = stopped.await;
    }

    /// Ends the grace of a `stop` under way at once (a second signal): the requests still
    /// running are ended and settled now.
    pub fn end_now(&self) {
        self.drain.start();
    }

    /// The configured grace (`server.shutdown_timeout_seconds`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Application, StartupError> {
        Self::build_with_clock(settings, Arc::new(SystemClock)).await
    }

    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Application, StartupError> {
        settings.validate()?;
        estimate::init();
        crate::ops::memory::release_after_bursts();
        metrics::install();
        let db = Db::connect(&settings).await?;
        crate::store::tag_bound::set_bound(&db, &settings.finance).await?;
        let me = processes::Me::new(
            uuid::Uuid::new_v4().simple().to_string(),
            processes::this_host(),
        );
        let process_id = me.id.clone();
        processes::heartbeat(&db, &me, clock.now()).await?;
        let liveness = processes::hold_liveness(&db, &me).await?;
        // Registered as running, `sluice secrets rotate` no longer starts; one that
        // committed since `Db::connect` checked the key is seen now.
        crate::store::managed::check_master_key_locked(&db).await?;

        let live = Arc::new(Live::start(&db, Arc::new(settings.clone()), clock.clone()).await?);
        // One group-commit writer for the money path and the request log.
        let writer = Writer::start(&db);
        let request_log = if settings.ladder.has(Ladder::Log) {
            RequestLog::start(writer.clone())
        } else {
            RequestLog::off()
        };
        let sso = match &settings.oidc {
            Some(o) => Some(Sso::new(o.clone()).map_err(StartupError::Sso)?),
            None => None,
        };
        let state = Arc::new(AppState {
            sso,
            auth: Authenticator::new(db.clone()),
            passwords: Passwords::default(),
            quota: Quota::with_writer(writer.clone(), clock.clone(), process_id),
            upstream: Arc::new(UpstreamClient::new(&settings.upstream)?),
            live,
            request_log,
            windows: windows(&settings).await?,
            queue: Queue::new(&settings.queue),
            alerts: Alerter::new(&settings.alerts),
            cache: Cache::new(
                &settings.cache,
                &settings.upstream,
                db.clone(),
                writer.clone(),
            )?,
            clock,
            db,
            settings: Arc::new(settings),
            runtime: tokio::runtime::Handle::current(),
        });
        if let Some(sso) = &state.sso {
            sso.spawn_discovery();
        }
        state.auth.refresh(&*state.clock).await?;
        state.cache.refresh(state.cache_now()).await?;
        housekeeping::recover_orphans(&state, &me).await?;
        housekeeping::spawn(state.clone(), me);
        audit_head::start(
            state.db.clone(),
            state.settings.backup.dir.clone().into(),
            state.settings.backup.head_name.clone(),
            state.clock.clone(),
            state.alerts.clone(),
        )
        .await;

        let listen = state.settings.server.listen.clone();
        let listener =
            TcpListener::bind(&listen).map_err(|e| StartupError::Bind(listen.clone(), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| StartupError::Bind(listen.clone(), e))?
            .port();
        let data = web::Data::from(state.clone());
        let workers = match state.settings.server.workers {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            n => n,
        };
        let stall = Duration::from_millis(state.settings.upstream.stream_idle_timeout_ms);
        let drain = Drain::default();
        let app_drain = drain.clone();
        let grace = Duration::from_secs(state.settings.server.shutdown_timeout_seconds);
        // Validated above; parsed once here for every request's client address.
        let client_addr =
            crate::client_addr::ClientAddr::new(&state.settings.server.trusted_proxies)
                .map_err(ConfigError::Invalid)?;
        let server = HttpServer::new(move || {
            App::new()
                .wrap_fn(|req, srv| {
                    // Every answer carries a request id; the pipeline sets its own first.
                    let fut = srv.call(req);
                    async move {
                        let mut res = fut.await?;
                        if !res.headers().contains_key("x-request-id") {
                            if let Ok(v) = HeaderValue::from_str(&pipeline::new_request_id()) {
                                res.headers_mut()
                                    .insert(HeaderName::from_static("x-request-id"), v);
                            }
                        }
                        Ok(res)
                    }
                })
                .app_data(data.clone())
                .app_data(app_drain.clone())
                .app_data(client_addr.clone())
                .configure(api::configure)
                .configure(admin::configure)
                .default_service(web::to(api::not_found))
        })
        .workers(workers)
        .on_connect(move |conn, _| stalled_clients_time_out(conn, stall))
        // The grace is ours (`Shutdown::stop`): actix-web's own timeout only backs it up,
        // after the requests still running were ended and settled. Signals are ours too.
        .shutdown_timeout((grace + SETTLE_MARGIN).as_secs())
        .disable_signals()
        // Stream chunks go out as they come, never held back to be coalesced.
        .tcp_nodelay(true)
        // A client that closes its connection is gone: its request stops (and leaves the
        // queue, releases its reservation, cancels its upstream call) at once.
        .h1_allow_half_closed(false)
        .backlog(4096)
        .max_connections(100_000)
        .listen(listener)
        .map_err(|e| StartupError::Bind(listen, e))?
        .run();
        Ok(Application {
            port,
            server,
            state,
            drain,
            liveness,
        })
    }

    /// What stops the server gracefully (see `Shutdown::stop`); `serve` calls it on SIGTERM.
    pub fn shutdown(&self) -> Shutdown {
        Shutdown {
            server: self.server.handle(),
            drain: self.drain.clone(),
            timeout: Duration::from_secs(self.state.settings.server.shutdown_timeout_seconds),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serves until stopped (`Shutdown::stop`), then settles what is left, flushes the
    /// request log and leaves the process table.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        let state = &self.state;
        let me = state.quota.process_id();
        // Settlements of the last answers may still be running; give them a moment, then
        // settle what is left at its reserved amount (flagged `orphan`), so no reservation
        // outlives the process.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while ledger::open_reservations(&state.db, me).await.unwrap_or(0) > 0
            && std::time::Instant::now() < until
        {
            // Settlements backing off from a store error try again now, not seconds on.
            state.quota.retry_settlements_now();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Reservations whose COMMIT went unanswered: their requests failed, they owe nothing.
        // All of them, within a bound: a store that hangs on COMMIT must not hold the exit.
        let all = tokio::time::timeout(UNSURE_AT_EXIT, state.quota.settle_unsure(usize::MAX));
        let failed = match all.await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("not done within {UNSURE_AT_EXIT:?}")),
        };
        if let Some(error) = failed {
            tracing::warn!(%error, left = state.quota.unsure_count(), "settling reservations of unknown outcome at shutdown failed; if they landed they are charged as orphans");
        }
        match ledger::settle_orphans(&state.db, Orphans::OfOwner(me), state.clock.now()).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                reservations = n,
                "settled reservations left open at shutdown at their reserved amount"
            ),
            Err(e) => {
                tracing::error!(error = %e, "settling reservations at shutdown failed; the next start will")
            }
        }
        let rows = async {
            state.request_log.flush().await;
            state.cache.flush().await;
        };
        if tokio::time::timeout(ROWS_AT_EXIT, rows).await.is_err() {
            tracing::error!(
                "request-log rows, cache entries and hit counts not written at shutdown within {ROWS_AT_EXIT:?} (is the database out of reach?); rows still queued at exit are lost"
            );
        }
        let _ = processes::unregister(&state.db, me).await;
        drop(self.liveness);
        tracing::info!("sluice stopped");
        result
    }
}

/// The window store: Redis when configured (warning when its eviction policy could drop
/// limiter keys), else in-process.
async fn windows(settings: &Settings) -> Result<Arc<Windows>, StartupError> {
    let rl = &settings.ratelimit;
    let window = Duration::from_secs(rl.window_seconds);
    let Some(r) = &settings.redis else {
        return Ok(Windows::new(window, None, rl.expected_replicas));
    };
    let topology = r
        .topology()
        .map_err(|e| StartupError::Redis(e.to_string()))?;
    let redis = RedisWindows::with_topology(&topology, Duration::from_millis(rl.redis_timeout_ms))
        .map_err(|e| StartupError::Redis(e.to_string()))?;
    tracing::info!(
        topology = redis.topology_kind(),
        "rate-limit windows in Redis"
    );
    if let Ok(Some(warning)) = redis.topology_mismatch().await {
        tracing::warn!(target: "sluice::alert", "{warning}");
    }
    match redis.eviction_policy().await {
        Ok(p) if p == "noeviction" => {}
        Ok(p) => {
            tracing::warn!(policy = %p, "Redis maxmemory-policy may evict rate-limit keys; set it to noeviction")
        }
        Err(e) => {
            tracing::warn!(error = %e, "Redis is not reachable at start; rate limiting starts degraded")
        }
    }
    Ok(Windows::new(window, Some(redis), rl.expected_replicas))
}

/// A client connection whose sent data stays unacknowledged — above all one that keeps its
/// receive window shut, not reading — for `stall` is aborted by the kernel
/// (`TCP_USER_TIMEOUT`, Linux). Its next write fails, so actix-http drops the connection
/// and the response body with it: the stream's pump sees the client gone. Without it such
/// a connection can sit forever, and actix-http's dispatcher spins on it while the client
/// pipelines more than it buffers (`tests/api/slow_reader.rs`).
fn stalled_clients_time_out(conn: &dyn std::any::Any, stall: Duration) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        if let Err(e) = socket2::SockRef::from(tcp).set_tcp_user_timeout(Some(stall)) {
            tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT on a client connection");
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (conn, stall);
}
