//! `sluice admin …`: admin logins created, unlocked, their passwords reset.

use chrono::{DateTime, Utc};

use super::prompt::new_password;
use crate::store::Db;

/// `admin create`: the login, and its password when one was generated (shown once).
pub async fn create(
    db: &Db,
    (username, role, team): (&str, &str, Option<&str>),
    password_stdin: bool,
    break_glass: bool,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let (pw, generated) = new_password(password_stdin)?;
    let who = (username, role, team);
    let id = super::admin_create_with(db, who, pw.clone(), break_glass, now).await?;
    println!("admin {username} ({role}) created (id {id})");
    if break_glass {
        println!("{username} is a break-glass login: its password works even with [oidc] password_login = false");
    }
    if generated {
        println!("password (shown once): {pw}");
    }
    Ok(())
}

/// `admin unlock`.
pub async fn unlock(db: &Db, username: &str, now: DateTime<Utc>) -> anyhow::Result<()> {
    let n = super::admin_unlock(db, username, now).await?;
    println!("{username} unlocked ({n} counted sign-in attempts forgotten)");
    Ok(())
}

/// `admin reset-password`: the new password, shown once when generated.
pub async fn reset_password(
    db: &Db,
    username: &str,
    password_stdin: bool,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let (pw, generated) = new_password(password_stdin)?;
    super::admin_reset_password(db, username, pw.clone(), now).await?;
    println!("password of {username} reset; its sessions ended and API keys revoked");
    if generated {
        println!("password (shown once): {pw}");
    }
    Ok(())
}
