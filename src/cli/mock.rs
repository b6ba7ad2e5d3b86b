//! `sluice mock`: the scriptable fake upstream until Ctrl-C.

use crate::mock::{MockConfig, MockServer};

/// Serves the mock on `listen` with `workers` threads, answering `text` (else its fixed
/// sentence).
pub async fn run(listen: &str, workers: usize, text: Option<&str>) -> anyhow::Result<()> {
    let mut cfg = MockConfig {
        workers,
        ..MockConfig::default()
    };
    if let Some(t) = text {
        cfg.text = t.to_string();
    }
    let mock = MockServer::start(listen, cfg)?;
    println!("sluice mock listening on {}", mock.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
