//! A route's long-context tier over time. The bundled price table dates every entry
//! (`effective`) and an entry carries its model's tier or none: from its date on, that is
//! the tier the provider bills — a later entry's threshold and factors replace an earlier
//! one's, and an entry without a tier ends it. A request is billed the tier in force when
//! it started, the instant its prices are taken at (`schedule::Schedule::rates_at`).

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::pricing::LongTier;

/// From an entry's date, its tier or none.
pub type TierFrom = (DateTime<Utc>, Option<LongTier>);

/// One bundled model's tiers, sorted by date.
pub type Dated = Arc<[TierFrom]>;

/// The tiers of the bundled models a route's names match (one, or several a cloud's
/// spelling contains: `price_table::Table::long_context`); empty when none matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LongTiers(Vec<Dated>);

impl LongTiers {
    pub fn of(models: Vec<Dated>) -> Self {
        LongTiers(models)
    }

    /// No bundled model matched: nothing says whether the provider bills a tier.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|m| m.is_empty())
    }

    /// These and `other`'s models together.
    pub fn and(mut self, other: LongTiers) -> Self {
        self.0.extend(other.0);
        self
    }

    /// The tier in force at `t`: of each model its latest entry effective at or before `t`
    /// (before its first, the first's: the model was priced from then, and its tier is the
    /// nearest word on it); of several models the lowest threshold — refusing or pricing
    /// dearer a prompt a cheaper tier would have taken is the safe side.
    pub fn at(&self, t: DateTime<Utc>) -> Option<LongTier> {
        self.0
            .iter()
            .filter_map(|m| {
                let entry = m.iter().rev().find(|(from, _)| *from <= t).or(m.first());
                entry.and_then(|(_, tier)| *tier)
            })
            .min_by_key(|tier| tier.above)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: &str) -> DateTime<Utc> {
        crate::config::parse_effective(d).unwrap()
    }

    fn tier(above: i64, input_permille: i64) -> Option<LongTier> {
        Some(LongTier {
            above,
            input_permille,
            output_permille: 1_500,
        })
    }

    #[test]
    fn the_tier_in_force_is_the_latest_entrys_and_the_lowest_of_several_models() {
        let m: Dated = Arc::from([
            (day("2025-01-01"), tier(200_000, 2_000)),
            (day("2026-01-01"), tier(200_000, 3_000)),
            (day("2026-06-01"), None),
        ]);
        let t = LongTiers::of(vec![m.clone()]);
        assert_eq!(t.at(day("2024-06-01")), tier(200_000, 2_000));
        assert_eq!(t.at(day("2025-12-31")), tier(200_000, 2_000));
        assert_eq!(t.at(day("2026-01-01")), tier(200_000, 3_000));
        assert_eq!(t.at(day("2026-06-01")), None);
        let other: Dated = Arc::from([(day("2025-01-01"), tier(100_000, 5_000))]);
        let both = t.and(LongTiers::of(vec![other]));
        assert_eq!(both.at(day("2026-02-01")), tier(100_000, 5_000));
        assert!(!both.is_empty());
        assert!(LongTiers::default().is_empty());
        assert_eq!(LongTiers::default().at(day("2026-02-01")), None);
    }
}
