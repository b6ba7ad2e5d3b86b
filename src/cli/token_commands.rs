//! `sluice token …`: what each token command prints.

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};

use super::{BudgetChange, IssueArgs};
use crate::quota::pricing;
use crate::store::{tokens, Db};

/// `token issue`: the token's text printed once (or a JSON line with it).
pub async fn issue(
    db: &Db,
    args: &IssueArgs<'_>,
    tags: Option<&str>,
    json: bool,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let user = args.user;
    let t = super::token_issue_tagged(db, args, tags, now).await?;
    let budget = t.limit_micros.map(pricing::usd);
    if json {
        println!(
            "{}",
            serde_json::json!({"id": t.id, "token": t.text, "user": user, "budget_usd": budget})
        );
    } else {
        println!(
            "token {} issued for {user} (budget: {})",
            t.id,
            budget.as_deref().unwrap_or("unlimited")
        );
        println!("{}", t.text);
        eprintln!("This is the only time the token is shown.");
    }
    Ok(())
}

/// `token revoke`.
pub async fn revoke(db: &Db, id: i64, now: DateTime<Utc>) -> anyhow::Result<()> {
    super::token_revoke(db, id, now).await?;
    println!("token {id} revoked");
    Ok(())
}

/// `token list`: a table, or the rows as JSON.
pub async fn list(db: &Db, json: bool) -> anyhow::Result<()> {
    let rows = tokens::list(db).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:>5}  {:<10} {:<16} {:<12} {:>14} {:>14}  state",
        "id", "prefix", "user", "team", "limit", "spent"
    );
    for r in rows {
        let limit = r
            .limit_micros
            .map(pricing::usd)
            .unwrap_or_else(|| "unlimited".into());
        let state = if r.revoked { "revoked" } else { "active" };
        println!(
            "{:>5}  {:<10} {:<16} {:<12} {:>14} {:>14}  {state}",
            r.id,
            r.prefix,
            r.user,
            r.team,
            limit,
            pricing::usd(r.spent_micros)
        );
    }
    Ok(())
}

/// `token budget`'s flags: exactly one of them says the change.
pub struct BudgetFlags {
    pub limit_usd: Option<String>,
    pub top_up_usd: Option<String>,
    pub adjust_usd: Option<String>,
    pub reason: Option<String>,
}

/// `token budget`: one change of the limit, a top-up or an adjustment with its reason.
pub async fn budget(
    db: &Db,
    id: i64,
    flags: BudgetFlags,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let change = match (flags.limit_usd, flags.top_up_usd, flags.adjust_usd) {
        (Some(l), None, None) => BudgetChange::Limit(if l == "none" {
            None
        } else {
            Some(usd_arg(&l)?)
        }),
        (None, Some(t), None) => BudgetChange::TopUp(usd_arg(&t)?),
        (None, None, Some(a)) => {
            let reason = flags.reason.context("--adjust-usd needs --reason")?;
            BudgetChange::Adjust {
                micros: usd_arg(&a)?,
                reason,
            }
        }
        _ => bail!("give exactly one of --limit-usd, --top-up-usd, --adjust-usd"),
    };
    super::token_budget(db, id, change, now).await?;
    println!("token {id} budget updated");
    Ok(())
}

/// A USD amount of a flag, negative ones too (an adjustment may return money).
fn usd_arg(s: &str) -> anyhow::Result<i64> {
    let (neg, digits) = s.strip_prefix('-').map_or((false, s), |d| (true, d));
    let m = pricing::parse_usd(digits).with_context(|| format!("`{s}` is not a USD amount"))?;
    Ok(if neg { -m } else { m })
}
