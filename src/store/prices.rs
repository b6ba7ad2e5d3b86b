//! Prices admins set (`model_prices`): append-only rows, each a model's price from its
//! `effective_from` on (`quota::schedule`'s admin layer). Both engines refuse UPDATE and
//! DELETE on the table with a trigger, as for the ledger.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::Result;
use crate::quota::fill::{Kind, Partial, Stated};
use crate::quota::pricing::Prices;
use crate::quota::schedule::{AdminPrices, Appended};

pub(crate) const ALL: &str = "SELECT model, effective_from, prices, created_by, created_at FROM model_prices ORDER BY model, effective_from";

/// One appended price. `prices` is JSON: integer micro-dollars per million tokens by kind
/// stated (`{"input":150000,"output":600000,"cached_input":75000}`), or `null` where the
/// model's admin prices end (its model deleted in the admin: `Appended`). Rows written
/// before a kind could be left out carry every kind: they state them all.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PriceRow {
    pub model: String,
    pub effective_from: String,
    pub prices: String,
    pub created_by: String,
    pub created_at: String,
}

/// The stored form of a price (`None`: the end of the model's admin prices): input,
/// output and the kinds it states only — a kind it leaves out is filled from the route's
/// lower layers (`quota::fill`), so it is not written as its default.
/// `set_for` are the upstream models the model's routes serve: the price applies to those
/// only (`Appended::set_for`).
pub fn prices_json(p: Option<&Partial>, set_for: &[String]) -> String {
    let Some(p) = p else {
        return "null".into();
    };
    let mut v = json!({"input": p.prices.input, "output": p.prices.output,
        "upstream_models": set_for});
    for k in Kind::ALL.into_iter().filter(|k| p.stated.has(*k)) {
        v[k.key()] = json!(k.get(&p.prices));
    }
    v.to_string()
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
            return Some(Appended {
                from,
                prices: None,
                set_for: None,
            });
        }
        let kind = |k: &str| v.get(k).and_then(|x| x.as_i64()).filter(|m| *m >= 0);
        let mut p = Partial {
            prices: Prices::plain(kind("input")?, kind("output")?),
            stated: Stated::default(),
        };
        for k in Kind::ALL {
            if let Some(m) = kind(k.key()) {
                k.set(&mut p.prices, m);
                p.stated = p.stated.with(k);
            }
        }
        let set_for = match v.get("upstream_models") {
            None => None,
            Some(names) => Some(serde_json::from_value(names.clone()).ok()?),
        };
        if set_for.is_none() {
            p.stated = stated_by_an_old_row(&p.prices);
        }
        Some(Appended {
            from,
            prices: Some(Partial {
                prices: p.fill(false),
                stated: p.stated,
            }),
            set_for,
        })
    }
}

/// What a row written before kinds could be left out (it has no `upstream_models`) states:
/// it carries every kind, those the admin left out at their within-price default (cache
/// writes at the input price, searches at 0), which would hide the lower layers' figures —
/// a Claude model's searches would be free. A kind at that default is taken as not stated;
/// a free price (input and output 0) states every kind.
fn stated_by_an_old_row(full: &Prices) -> Stated {
    let free = full.input == 0 && full.output == 0;
    Kind::ALL
        .into_iter()
        .filter(|k| free || k.get(full) != k.within_price(full))
        .fold(Stated::default(), Stated::with)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(prices: serde_json::Value) -> PriceRow {
        PriceRow {
            model: "sonnet".into(),
            effective_from: "2026-01-01T00:00:00Z".into(),
            prices: prices.to_string(),
            created_by: "admin".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn stated(r: &PriceRow) -> Vec<Kind> {
        let p = r.appended().unwrap().prices.unwrap();
        Kind::ALL.into_iter().filter(|k| p.stated.has(*k)).collect()
    }

    /// A row of the first admin-price format carries every kind, the ones the admin left
    /// out at their old within-price defaults: those are not stated, so the bundled entry
    /// or Anthropic's rule prices them (searches not free, 1-hour writes not at input).
    #[test]
    fn an_old_rows_defaults_do_not_hide_the_lower_layers() {
        let old = json!({"input": 3_000_000, "output": 15_000_000, "cached_input": 300_000,
            "cache_write_5m": 3_000_000, "cache_write_1h": 3_000_000, "reasoning": 15_000_000,
            "audio_input": 3_000_000, "audio_output": 15_000_000, "image_input": 3_000_000,
            "image_output": 15_000_000, "web_search_per_1k_calls": 0});
        assert_eq!(stated(&row(old.clone())), vec![Kind::CachedInput]);
        // A free price stays free in every kind.
        let free = json!({"input": 0, "output": 0, "cached_input": 0, "cache_write_5m": 0,
            "cache_write_1h": 0, "reasoning": 0, "audio_input": 0, "audio_output": 0,
            "image_input": 0, "image_output": 0, "web_search_per_1k_calls": 0});
        assert_eq!(stated(&row(free)), Kind::ALL.to_vec());
        // A row of today's format states what it carries, defaults included.
        let mut new = old;
        new["upstream_models"] = json!(["claude-sonnet-4-5"]);
        assert_eq!(stated(&row(new)), Kind::ALL.to_vec());
    }
}
