//! The gateway's signals while it serves: SIGTERM stops gracefully, SIGINT and SIGQUIT at
//! once, SIGHUP reloads the config file.

use crate::startup::Application;

/// What SIGHUP runs.
pub type Reload = Box<dyn Fn() + Send>;

/// Serves until a signal: SIGTERM stops gracefully (requests and streams get
/// `server.shutdown_timeout_seconds`, then the ones still running are ended and settled);
/// SIGINT and SIGQUIT end them at once (settled all the same), also when they come during
/// the grace a SIGTERM gave (an operator's Ctrl-C, a supervisor escalating), and so does a
/// second SIGTERM. See `startup::Shutdown`. SIGHUP runs `reload`.
pub async fn run_until_signalled(app: Application, reload: Option<Reload>) -> anyhow::Result<()> {
    let shutdown = app.shutdown();
    tokio::spawn(async move {
        let mut signals = StopSignals::new(reload);
        let grace = match signals.next().await {
            Stop::Graceful => shutdown.timeout(),
            Stop::Now => std::time::Duration::ZERO,
        };
        tracing::info!(
            grace_seconds = grace.as_secs(),
            "shutdown: no longer accepting connections"
        );
        if !grace.is_zero() {
            let now = shutdown.clone();
            tokio::spawn(async move {
                signals.next().await;
                tracing::info!("shutdown: a second signal ends the grace");
                now.end_now();
            });
        }
        shutdown.stop(grace).await;
    });
    app.run_until_stopped().await?;
    Ok(())
}

/// What a stop signal asks for.
enum Stop {
    /// SIGTERM: the configured grace.
    Graceful,
    /// SIGINT, SIGQUIT: no grace.
    Now,
}

/// The stop signals, listened for from the start to the end of the process (once one is
/// handled here the default action — ending the process — is gone for good, so every
/// later one must be heard too). SIGHUP is heard too, and does not stop anything: it
/// reloads the config file (`reload`; without one, as in the demo, the log says it is not
/// reloaded).
struct StopSignals {
    #[cfg(unix)]
    unix: Option<[tokio::signal::unix::Signal; 4]>,
    reload: Option<Reload>,
}

impl StopSignals {
    fn new(reload: Option<Reload>) -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = || {
                Ok::<_, std::io::Error>([
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::quit())?,
                    signal(SignalKind::hangup())?,
                ])
            };
            match listen() {
                Ok(signals) => Self {
                    unix: Some(signals),
                    reload,
                },
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the gateway");
                    Self { unix: None, reload }
                }
            }
        }
        #[cfg(not(unix))]
        Self { reload }
    }

    /// Waits for the next stop signal.
    async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        if let Some([term, int, quit, hup]) = self.unix.as_mut() {
            loop {
                return tokio::select! {
                    _ = term.recv() => Stop::Graceful,
                    _ = int.recv() => Stop::Now,
                    _ = quit.recv() => Stop::Now,
                    _ = hup.recv() => {
                        match &self.reload {
                            Some(reload) => reload(),
                            None => tracing::warn!("SIGHUP: this gateway has no config file to reload; still serving the configuration read at start"),
                        }
                        continue;
                    }
                };
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        Stop::Now
    }
}
