//! `sluice team …` and `sluice user …`: what each prints.

use chrono::{DateTime, Utc};

use super::UserArgs;
use crate::store::Db;

/// `team create`.
pub async fn team_create(
    db: &Db,
    name: &str,
    budget_usd: Option<&str>,
    tags: Option<&str>,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let id = super::team_create_tagged(db, name, budget_usd, tags, now).await?;
    println!("team {name} created (id {id})");
    Ok(())
}

/// `team edit`.
pub async fn team_edit(db: &Db, name: &str, tags: &str, now: DateTime<Utc>) -> anyhow::Result<()> {
    let id = super::team_edit_tags(db, name, tags, now).await?;
    println!("team {name} (id {id}) updated");
    Ok(())
}

/// `user create`.
pub async fn user_create(db: &Db, args: &UserArgs<'_>, now: DateTime<Utc>) -> anyhow::Result<()> {
    let id = super::user_create(db, args, now).await?;
    println!("user {} created (id {id})", args.username);
    Ok(())
}
