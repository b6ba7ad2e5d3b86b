//! Prices admins set (`model_prices`): append-only rows, each a model's price from its
//! `effective_from` on (`quota::schedule`'s admin layer). Both engines refuse UPDATE and
//! DELETE on the table with a trigger, as for the ledger.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::Result;
use crate::quota::pricing::Prices;
use crate::quota::schedule::{AdminPrices, Appended};

pub(crate) const ALL: &str = "SELECT model, effective_from, prices, created_by, created_at FROM model_prices ORDER BY model, effective_from";

/// One appended price. `prices` is JSON: integer micro-dollars per million tokens by kind
/// (`{"input":150000,"output":600000,"cached_input":75000}`), or `null` where the model's
/// admin prices end (its model deleted in the admin: `Appended`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PriceRow {
    pub model: String,
    pub effective_from: String,
    pub prices: String,
    pub created_by: String,
    pub created_at: String,
}

/// The stored form of a price (`None`: the end of the model's admin prices).
pub fn prices_json(p: Option<&Prices>) -> String {
    match p {
        Some(p) => json!({
            "input": p.input, "output": p.output, "cached_input": p.cached_input,
            "cache_write_5m": p.cache_write_5m, "cache_write_1h": p.cache_write_1h,
            "reasoning": p.reasoning, "audio_input": p.audio_input,
            "audio_output": p.audio_output, "image_input": p.image_input,
            "image_output": p.image_output, "web_search_per_1k_calls": p.web_search_per_1k_calls,
        })
        .to_string(),
        None => "null".into(),
    }
}

impl PriceRow {
    /// The row as its model's schedule holds it; `None` when it does not read (a row not
    /// written by Sluice).
    pub fn appended(&self) -> Option<Appended> {
        let from = DateTime::parse_from_rfc3339(&self.effective_from)
            .ok()?
            .with_timezone(&Utc);
        let v: serde_json::Value = serde_json::from_str(&self.prices).ok()?;
        if v.is_null() {
            return Some(Appended { from, prices: None });
        }
        let kind = |k: &str| v.get(k).and_then(|x| x.as_i64()).filter(|m| *m >= 0);
        // A kind missing from the row (written before it had a price of its own) falls
        // under the price it defaults to, as a config price without its key.
        let input = kind("input")?;
        let output = kind("output")?;
        let cache_write_5m = kind("cache_write_5m").unwrap_or(input);
        let prices = Prices {
            input,
            output,
            cached_input: kind("cached_input").unwrap_or(input),
            cache_write_5m,
            cache_write_1h: kind("cache_write_1h").unwrap_or(cache_write_5m),
            reasoning: kind("reasoning").unwrap_or(output),
            audio_input: kind("audio_input").unwrap_or(input),
            audio_output: kind("audio_output").unwrap_or(output),
            image_input: kind("image_input").unwrap_or(input),
            image_output: kind("image_output").unwrap_or(output),
            web_search_per_1k_calls: kind("web_search_per_1k_calls").unwrap_or(0),
        };
        Some(Appended {
            from,
            prices: Some(prices),
        })
    }
}

/// The admin layer of every model's schedule. A row that does not read is an error naming
/// it: a price silently dropped would let an older one apply.
pub fn admin_prices(rows: &[PriceRow]) -> std::result::Result<AdminPrices, String> {
    let mut out = AdminPrices::new();
    for r in rows {
        let d = r.appended().ok_or_else(|| {
            format!(
                "the price of model `{}` effective {} does not read",
                r.model, r.effective_from
            )
        })?;
        out.entry(r.model.clone()).or_default().push(d);
    }
    Ok(out)
}

pub async fn all(db: &super::Db) -> Result<Vec<PriceRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::prices::all(&pg.pool).await,
    };
    Ok(sqlx::query_as(ALL).fetch_all(&sqlite.read).await?)
}

/// Every row, read inside `tx` (with the managed rows: one snapshot).
pub async fn all_in(tx: &mut super::Tx) -> Result<Vec<PriceRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::prices::all_in(conn).await;
    }
    Ok(sqlx::query_as(ALL).fetch_all(tx.sqlite()?).await?)
}

/// Appends a row; a `Conflict` if the model has a price effective at that instant already.
pub async fn append(tx: &mut super::Tx, row: &PriceRow) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::prices::append(conn, row).await;
    }
    let done = sqlx::query(
        "INSERT OR IGNORE INTO model_prices (model, effective_from, prices, created_by, created_at)
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(&row.model)
    .bind(&row.effective_from)
    .bind(&row.prices)
    .bind(&row.created_by)
    .bind(&row.created_at)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected();
    conflict_unless(done == 1, row)
}

pub(crate) fn conflict_unless(done: bool, row: &PriceRow) -> Result<()> {
    if done {
        return Ok(());
    }
    Err(super::StoreError::Conflict(format!(
        "model `{}` has a price effective {} already",
        row.model, row.effective_from
    )))
}
