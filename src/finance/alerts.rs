//! `budget_exhaustion_forecast`: a budget projected (`budgets`) to run out within `[finance]
//! forecast_alert_days` is raised through the alert webhooks at most once per subject and
//! UTC day across every replica (`store::finance::note_once` decides which replica sends);
//! one already exhausted, once per subject, budget period and limit — it stays exhausted until the
//! period resets, and a daily repeat of the same news is noise.

use crate::quota::period::Reset;
use crate::state::AppState;
use crate::store::{finance, StoreError};

pub const KIND: &str = "budget_exhaustion_forecast";

/// Checks every budget now; how many alerts this replica raised.
pub async fn check(state: &AppState) -> Result<usize, StoreError> {
    let days = i64::from(state.settings.finance.forecast_alert_days);
    if days == 0 {
        return Ok(0);
    }
    let now = state.clock.now();
    let today = now.date_naive();
    let horizon = (today + chrono::Duration::days(days)).to_string();
    let mut raised = 0;
    for b in super::budgets::forecasts(&state.db, None, now).await? {
        let Some(on) = b.exhausts_on.as_deref() else {
            continue;
        };
        if on > horizon.as_str() {
            continue;
        }
        let subject = format!("{}:{}", b.kind, b.id);
        let when = if b.remaining_micros <= 0 {
            let reset = Reset::parse(&b.reset).unwrap_or(Reset::Never);
            // The limit is in the key: a raised budget that runs out again is news.
            format!("exhausted {} {}", reset.period_key(now), b.limit_micros)
        } else {
            today.to_string()
        };
        if !finance::note_once(&state.db, KIND, &subject, &when, now).await? {
            continue;
        }
        let message = format!(
            "the budget of {} {} ({} USD left) is projected to run out on {on}",
            b.kind,
            b.name,
            crate::quota::pricing::usd(b.remaining_micros)
        );
        // Dropped (its cool-off, a full queue), the notice is forgotten, so the next check
        // raises it: marked and dropped, it was lost for the day — for the whole period
        // once exhausted (s24 final attack #6, as the digest's).
        if !state.alerts.try_raise(KIND, &subject, &message) {
            // A failed forget costs this alert the day, not the other budgets their check.
            if let Err(e) = finance::forget(&state.db, KIND, &subject, &when).await {
                tracing::warn!(error = %e, subject, "could not forget a dropped alert's notice");
            }
            continue;
        }
        raised += 1;
    }
    Ok(raised)
}
