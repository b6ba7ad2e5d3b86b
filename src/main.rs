//! The `sluice` command line: the arguments parsed (`sluice::cli::args`) and handed to
//! `sluice::cli::dispatch`, which runs each command's implementation under `sluice::cli`.

use clap::Parser;

use sluice::cli::{args::Cli, dispatch};

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        // The redis crate logs every failed node connect and slot refresh of a cluster
        // outage, dozens a second; the gateway's own "windows degraded" line says it once.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,redis=error"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    dispatch::run(Cli::parse()).await
}
