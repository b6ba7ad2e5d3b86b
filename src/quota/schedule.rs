//! A route's prices over time. Three layers, in precedence order: prices an admin appended
//! (`model_prices`, per model), the config file's (a model's top-level keys from the
//! beginning, its `[[models.prices]]` from their dates, or `free = true`: zero from the
//! beginning), and the bundled table's (`price_table`, matched by the route's upstream model
//! name). At an instant the first layer with a price in force there decides (within it the
//! latest entry whose `effective` is at or before the instant); a kind that price does not
//! state is taken from the next layer in force that states it, else filled as `fill` says.
//! A request is priced at `rates_at(its start)`, fixed with it for the reservation and the
//! settlement alike.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::fill::{Partial, Stated};
use super::pricing::Prices;

/// A price in force from `from` until a later entry of its layer: `prices` with every kind
/// it does not state at the price it falls under within it, `stated` the kinds it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dated {
    pub from: DateTime<Utc>,
    pub prices: Prices,
    pub stated: Stated,
}

impl Dated {
    pub fn new(from: DateTime<Utc>, p: Partial) -> Dated {
        Dated {
            from,
            prices: p.prices,
            stated: p.stated,
        }
    }

    pub fn partial(&self) -> Partial {
        Partial {
            prices: self.prices,
            stated: self.stated,
        }
    }
}

/// Where a price in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Admin,
    Config,
    Bundled,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Admin => "admin",
            Source::Config => "config",
            Source::Bundled => "bundled",
        }
    }
}

/// An admin's row: a price from `from` on, or (`None`) the end of the model's admin prices
/// there — its model was deleted in the admin, and its config or bundled price applies again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub from: DateTime<Utc>,
    pub prices: Option<Partial>,
    /// The upstream models the model's routes served when the price was set; `None` on a
    /// withdrawal or a row written before they were recorded (it prices every route).
    pub set_for: Option<Vec<String>>,
}

impl Appended {
    /// Whether this row speaks for a route serving `upstream_model`: a price set for
    /// other upstream models does not (the model was re-pointed since).
    pub fn applies_to(&self, upstream_model: &str) -> bool {
        self.set_for
            .as_ref()
            .is_none_or(|s| s.iter().any(|m| m == upstream_model))
    }

    /// The row a route serving `upstream_model` holds: a price set for another upstream
    /// model ends the admin prices there instead (keeping `set_for`, which a withdrawal
    /// has not: `Schedule::admin_set_aside`), so the model's config or bundled price
    /// applies — never a price chosen for a cheaper model.
    pub fn for_route(&self, upstream_model: &str) -> Appended {
        let mut a = self.clone();
        if !a.applies_to(upstream_model) {
            a.prices = None;
        }
        a
    }
}

/// The admin layer of every model: its appended rows by model name.
pub type AdminPrices = HashMap<String, Vec<Appended>>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    admin: Vec<Appended>,
    config: Vec<Dated>,
    bundled: Arc<[Dated]>,
    /// Anthropic bills the route: its rule fills the kinds no layer states (`fill`).
    anthropic: bool,
}

impl Schedule {
    /// A schedule of its three layers (each sorted here by date).
    pub fn new(mut admin: Vec<Appended>, mut config: Vec<Dated>, bundled: Arc<[Dated]>) -> Self {
        admin.sort_by_key(|d| d.from);
        config.sort_by_key(|d| d.from);
        Schedule {
            admin,
            config,
            bundled,
            anthropic: false,
        }
    }

    /// This schedule, on a route Anthropic bills (`fill::billed_by_anthropic`) or not.
    pub fn billed_by_anthropic(mut self, yes: bool) -> Self {
        self.anthropic = yes;
        self
    }

    /// The price in force at `t`, or `None` when no layer has one (refused at start:
    /// `Settings::check_priced`).
    pub fn rates_at(&self, t: DateTime<Utc>) -> Option<Prices> {
        self.in_force(t).map(|(_, d)| d.prices)
    }

    /// The upstream models the admin price in force at `t` was set for, when it is set
    /// aside on this route (`Appended::for_route`): shown where prices are, and warned of.
    pub fn admin_set_aside(&self, t: DateTime<Utc>) -> Option<&[String]> {
        let a = self.admin.iter().rev().find(|a| a.from <= t)?;
        a.prices.is_none().then_some(a.set_for.as_deref()).flatten()
    }

    /// The price in force at `t` and the layer that decides it: that layer's price, each
    /// kind it does not state from the next layer in force that does, the rest filled
    /// (`Partial::fill`). `from` is the deciding entry's.
    pub fn in_force(&self, t: DateTime<Utc>) -> Option<(Source, Dated)> {
        // A row set aside here (set for other upstream models) is passed over, not taken
        // as a withdrawal: a later-dated price for the model's old upstream must not end
        // the price the admin set for this one.
        let admin = self
            .admin
            .iter()
            .rev()
            .find(|a| a.from <= t && !(a.prices.is_none() && a.set_for.is_some()))
            .and_then(|a| a.prices.map(|p| Dated::new(a.from, p)));
        let mut layers = [
            (Source::Admin, admin),
            (Source::Config, latest(&self.config, t)),
            (Source::Bundled, latest(&self.bundled, t)),
        ]
        .into_iter()
        .filter_map(|(source, d)| d.map(|d| (source, d)));
        let (source, top) = layers.next()?;
        let merged = layers.fold(top.partial(), |p, (_, lower)| p.under(&lower.partial()));
        Some((
            source,
            Dated::new(top.from, Partial::whole(merged.fill(self.anthropic))),
        ))
    }
}

/// The latest entry of a date-sorted layer effective at or before `t`.
fn latest(layer: &[Dated], t: DateTime<Utc>) -> Option<Dated> {
    layer.iter().rev().find(|d| d.from <= t).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn dated(from: &str, input: i64) -> Dated {
        Dated {
            from: at(from),
            prices: Prices {
                cached_input: input / 2,
                ..Prices::plain(input, input * 4)
            },
            stated: Stated::default().with(crate::quota::fill::Kind::CachedInput),
        }
    }

    #[test]
    fn the_latest_entry_effective_at_or_before_the_instant_wins() {
        let s = Schedule::new(
            vec![],
            vec![
                dated("2026-03-15T00:00:00Z", 200),
                dated("2026-03-01T00:00:00Z", 100),
            ],
            Arc::from([]),
        );
        assert_eq!(s.rates_at(at("2026-02-28T23:59:59Z")), None);
        assert_eq!(s.rates_at(at("2026-03-01T00:00:00Z")).unwrap().input, 100);
        assert_eq!(s.rates_at(at("2026-03-14T23:59:59Z")).unwrap().input, 100);
        assert_eq!(s.rates_at(at("2026-03-15T00:00:00Z")).unwrap().input, 200);
        assert_eq!(s.rates_at(at("2030-01-01T00:00:00Z")).unwrap().input, 200);
    }

    #[test]
    fn admin_then_config_then_bundled() {
        let bundled: Arc<[Dated]> = Arc::from([dated("2024-01-01T00:00:00Z", 1)]);
        let only_bundled = Schedule::new(vec![], vec![], bundled.clone());
        assert_eq!(
            only_bundled.in_force(at("2026-01-01T00:00:00Z")).unwrap().0,
            Source::Bundled
        );
        // A config price from the beginning hides the bundled one at every instant.
        let config = vec![Dated {
            from: DateTime::<Utc>::MIN_UTC,
            ..dated("2020-01-01T00:00:00Z", 10)
        }];
        let admin = |from: &str, input: Option<i64>| Appended {
            from: at(from),
            prices: input.map(|i| dated(from, i).partial()),
            set_for: None,
        };
        let s = Schedule::new(
            vec![
                admin("2026-07-01T00:00:00Z", None),
                admin("2026-06-01T00:00:00Z", Some(50)),
            ],
            config,
            bundled.clone(),
        );
        let (source, d) = s.in_force(at("2026-05-31T00:00:00Z")).unwrap();
        assert_eq!((source, d.prices.input), (Source::Config, 10));
        let (source, d) = s.in_force(at("2026-06-01T00:00:00Z")).unwrap();
        assert_eq!((source, d.prices.input), (Source::Admin, 50));
        // Withdrawn (its model deleted in the admin): the config's price again.
        let (source, d) = s.in_force(at("2026-07-01T00:00:00Z")).unwrap();
        assert_eq!((source, d.prices.input), (Source::Config, 10));
        // A dated config price only: before it, the bundled one.
        let s = Schedule::new(vec![], vec![dated("2026-03-01T00:00:00Z", 7)], bundled);
        assert_eq!(
            s.in_force(at("2026-02-01T00:00:00Z")).unwrap().0,
            Source::Bundled
        );
        assert_eq!(s.rates_at(at("2026-03-02T00:00:00Z")).unwrap().input, 7);
    }

    /// Day 0: a price for upstream X from day 10. Day 1: the model re-pointed at Y, a
    /// price for Y from then. On day 10 the route serving Y keeps Y's price: X's row is
    /// passed over, not read as the end of the admin's prices. With no row for Y, the
    /// config's price applies (an admin price chosen for another model never does).
    #[test]
    fn a_price_set_for_another_upstream_model_is_passed_over_not_a_withdrawal() {
        let config = vec![dated("2020-01-01T00:00:00Z", 10)];
        let admin = |from: &str, input: i64, set_for: &str| Appended {
            from: at(from),
            prices: Some(dated(from, input).partial()),
            set_for: Some(vec![set_for.to_string()]),
        };
        let rows = [
            admin("2026-03-10T00:00:00Z", 30, "x"),
            admin("2026-03-01T00:00:00Z", 70, "y"),
        ];
        let on_y = Schedule::new(
            rows.iter().map(|a| a.for_route("y")).collect(),
            config.clone(),
            Arc::from([]),
        );
        let (source, d) = on_y.in_force(at("2026-03-11T00:00:00Z")).unwrap();
        assert_eq!((source, d.prices.input), (Source::Admin, 70));
        assert_eq!(
            on_y.admin_set_aside(at("2026-03-11T00:00:00Z")),
            Some(&["x".to_string()][..])
        );
        let on_z = Schedule::new(
            rows.iter().map(|a| a.for_route("z")).collect(),
            config,
            Arc::from([]),
        );
        let (source, d) = on_z.in_force(at("2026-03-11T00:00:00Z")).unwrap();
        assert_eq!((source, d.prices.input), (Source::Config, 10));
    }
}
