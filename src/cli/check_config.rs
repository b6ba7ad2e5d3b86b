//! `sluice check-config`: the config validated, the effective settings printed masked.

use crate::config::Settings;

pub fn check_config(settings: &Settings) -> anyhow::Result<()> {
    settings.validate()?;
    // The admins' prices are in the database: a model of the file needs a price of
    // its own, a bundled one or `free = true`.
    settings.check_priced(&Default::default(), chrono::Utc::now())?;
    print!("{}", settings.to_masked_toml());
    eprintln!(
        "config ok: {} upstreams, {} models",
        settings.upstreams.len(),
        settings.models.len()
    );
    Ok(())
}
