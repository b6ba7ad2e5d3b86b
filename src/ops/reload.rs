//! `SIGHUP`: the config file is read again and its `[[upstreams]]` and `[[models]]` apply at
//! once, as an admin change does (`upstream::live`), and so do `[finance]`'s tag bounds
//! (`store::tag_bound`). A file that does not read or validate leaves everything as it was,
//! and the log says why. Every other setting is read at start only (the listen address, the
//! database, limits, Redis…): the log names the sections that changed and wait for a
//! restart. Reloads run one at a time, each reading the file when its turn comes
//! (`Live::reload_file`).

use std::path::Path;

use crate::state::AppState;

pub async fn reload_config(state: &AppState, file: Option<&Path>) {
    match state
        .live
        .reload_file(&state.db, || crate::config::load(file))
        .await
    {
        Ok(ignored) if ignored.is_empty() => {
            tracing::info!("SIGHUP: config reloaded; upstreams, models and tag bounds applied")
        }
        Ok(ignored) => tracing::warn!(
            sections = %ignored.join(", "),
            "SIGHUP: config reloaded; upstreams, models and tag bounds applied, but these sections changed and are read at start only: restart to apply them"
        ),
        Err(e @ crate::upstream::live::LiveError::Unreadable(_)) => {
            tracing::error!(error = %e, "SIGHUP: the config file does not read; still serving the configuration in use")
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: the new config is not valid; still serving the configuration in use")
        }
    }
}
