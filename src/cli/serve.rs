//! `sluice serve`: the gateway until a signal stops it; SIGHUP reads the config file again.

use std::path::PathBuf;

use super::signals::{run_until_signalled, Reload};
use crate::config::{Ladder, Settings};
use crate::startup::Application;

/// Serves `settings` (up to the benchmark `ladder` stage); `config` is the file SIGHUP reads
/// again.
pub async fn serve(
    mut settings: Settings,
    ladder: Ladder,
    config: Option<PathBuf>,
) -> anyhow::Result<()> {
    if ladder != Ladder::All {
        tracing::warn!(?ladder, "benchmark ladder: stages after this one are OFF (no auth below `auth`); never run this in production");
    }
    settings.ladder = ladder;
    crate::ops::fd_limit::raise();
    // Before the app: a bad endpoint stops the start. Read once; SIGHUP leaves it.
    crate::ops::traces::install(&settings.tracing)?;
    let app = Application::build(settings).await?;
    tracing::info!(port = app.port(), "sluice listening");
    let reload = reloader(&app, config);
    let result = run_until_signalled(app, Some(reload)).await;
    // The last spans (the drained requests'), within the exporter's timeout.
    if let Err(e) = tokio::task::spawn_blocking(crate::ops::traces::flush).await {
        tracing::warn!(error = %e, "trace flush did not run");
    }
    result
}

/// SIGHUP's action: the config file `config` read again (`ops::reload`).
fn reloader(app: &Application, config: Option<PathBuf>) -> Reload {
    let state = app.state();
    Box::new(move || {
        let state = state.clone();
        let config = config.clone();
        tokio::spawn(async move {
            crate::ops::reload::reload_config(&state, config.as_deref()).await;
        });
    })
}
