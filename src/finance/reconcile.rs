//! Sluice's spend next to the provider's bill, per (UTC day, model, account).
//!
//! The Sluice side is Σ `cost_micros` of the request log (absorbed amounts included: the
//! provider billed them) by day, the model the upstream was sent and the account its
//! deployment bills to (`[[upstreams]] provider_account`, absent = `*`). The provider side
//! is the export's figures by day, model and account: a figure's account is the first of its
//! ids (API key, project, workspace) some upstream of that provider names, else `*`. Models
//! are compared without a trailing snapshot date (`exports::base_model`). Only the days the
//! export covers (its first to its last) are compared; inside them a key on one side only
//! has 0 on the other.
//!
//! A row is flagged when |Sluice − provider| exceeds both `[finance]
//! reconcile_threshold_usd` and `reconcile_threshold_pct` of the provider's figure, compared
//! exactly in integers: |d| > T and |d| × 10 000 > bp × |provider|.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::NaiveDate;

use super::exports::{base_model, Line, Named, Part};
use crate::store::finance::{ReconciliationRow, UpstreamSpend};

/// The account of a deployment that names none, and of figures no deployment claims.
pub const ANY_ACCOUNT: &str = "*";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub micros: i64,
    /// Basis points of the provider's figure (2 % = 200).
    pub bp: i64,
}

/// Whether a difference of `diff` against the provider's `provider` is past both thresholds.
pub fn flagged(diff: i64, provider: i64, t: Thresholds) -> bool {
    let d = i128::from(diff).abs();
    d > i128::from(t.micros) && d * 10_000 > i128::from(t.bp) * i128::from(provider).abs()
}

/// The accounts the reconciled provider's deployments bill to.
#[derive(Debug, Default)]
pub struct Accounts {
    /// Deployment id → its account (`*` when it names none).
    by_upstream: HashMap<String, String>,
    claimed: HashSet<String>,
}

impl Accounts {
    /// From the reconciled provider's deployments: (id, `provider_account`).
    pub fn new(upstreams: impl IntoIterator<Item = (String, Option<String>)>) -> Accounts {
        let mut a = Accounts::default();
        for (id, account) in upstreams {
            let account = account.unwrap_or_else(|| ANY_ACCOUNT.to_string());
            a.claimed.insert(account.clone());
            a.by_upstream.insert(id, account);
        }
        a
    }

    /// A deployment's account; `None` for another provider's (or one no longer configured).
    pub fn of_upstream(&self, id: &str) -> Option<&String> {
        self.by_upstream.get(id)
    }

    /// The accounts some deployment names (not `*`), sorted.
    pub fn claimed(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .claimed
            .iter()
            .map(String::as_str)
            .filter(|a| *a != ANY_ACCOUNT)
            .collect();
        out.sort_unstable();
        out
    }

    /// A figure's account: the first of its ids a deployment names, else `*`.
    pub fn of_line(&self, ids: &[String]) -> String {
        ids.iter()
            .find(|id| self.claimed.contains(id.as_str()))
            .cloned()
            .unwrap_or_else(|| ANY_ACCOUNT.to_string())
    }
}

/// The claimed accounts a part of an OpenAI export (`Part`: a JSON page, a CSV file)
/// cannot meet because it was not grouped by their kind: `api_key` the claims that may be
/// API keys while no figure of the part names an `api_key_id`, `project` those that may be
/// projects while none names a `project_id`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ungrouped {
    /// The part, as errors name it.
    pub place: String,
    pub api_key: Vec<String>,
    pub project: Vec<String>,
}

impl Ungrouped {
    /// What is missing, as a message's clause: `group_by=api_key_id` (the keys) and/or
    /// `group_by=project_id` (the projects).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.api_key.is_empty() {
            parts.push(format!(
                "no figure names an API key (not grouped by api_key_id: group_by=api_key_id) while OpenAI deployments bill to {}",
                self.api_key.join(", ")
            ));
        }
        if !self.project.is_empty() {
            parts.push(format!(
                "no figure names a project (not grouped by project_id: group_by=project_id) while OpenAI deployments bill to {}",
                self.project.join(", ")
            ));
        }
        parts.join("; ")
    }
}

/// The first part of an OpenAI export (`parts`, in the download's order) that cannot meet
/// the accounts the deployments claim; `figures` (each one's ids and which fields they
/// are) say which kind a claim is. A claim is an API key when it starts `key_` or some
/// figure names it as its `api_key_id`, a project when it starts `proj_` or some figure
/// names it as its `project_id` (OpenAI's ids); a claim of neither shape may be either. A
/// figure names an account only through the fields its query was grouped by: grouped by
/// project alone, the keys of a project are summed in one figure — held against one key's
/// log (or `*`'s) its difference means nothing — and a claimed key's log would read as
/// unbilled; the reverse for a claimed project and a part grouped by key alone. Judged
/// per part, never download-wide: days 1–15 grouped by key and days 16–30 by project,
/// given together, would otherwise pass on the first part's keys while the second's
/// figures meet the wrong account. `None`: every part can meet every claim (or none is
/// made).
pub fn ungrouped<'a>(
    figures: impl IntoIterator<Item = (&'a [String], Named)>,
    parts: &[Part],
    accounts: &Accounts,
) -> Option<Ungrouped> {
    let claimed = accounts.claimed();
    if claimed.is_empty() {
        return None;
    }
    let (mut keys, mut projects) = (HashSet::new(), HashSet::new());
    for (ids, named) in figures {
        if named.api_key {
            keys.extend(ids.first().map(String::as_str));
        }
        if named.project {
            projects.extend(ids.last().map(String::as_str));
        }
    }
    let is_key = |c: &str| c.starts_with("key_") || keys.contains(c);
    let is_project = |c: &str| c.starts_with("proj_") || projects.contains(c);
    let need = |grouped: bool, other_kind: &dyn Fn(&str) -> bool| -> Vec<String> {
        if grouped {
            return Vec::new();
        }
        claimed
            .iter()
            .filter(|c| !other_kind(c))
            .map(|c| c.to_string())
            .collect()
    };
    parts.iter().find_map(|part| {
        let out = Ungrouped {
            place: part.place.clone(),
            api_key: need(part.named.api_key, &is_project),
            project: need(part.named.project, &is_key),
        };
        (!out.api_key.is_empty() || !out.project.is_empty()).then_some(out)
    })
}

/// One row per (day, model, account) either side has, in that order, inside `days` (the
/// first and last the export covers, `exports::Figures::days`).
pub fn compare(
    lines: &[Line],
    (first, last): (NaiveDate, NaiveDate),
    spend: &[UpstreamSpend],
    accounts: &Accounts,
    t: Thresholds,
) -> Vec<ReconciliationRow> {
    let (first, last) = (first.to_string(), last.to_string());
    // Σ in i128: (Sluice, provider) per key.
    let mut cells: BTreeMap<(String, String, String), (i128, i128)> = BTreeMap::new();
    for s in spend {
        let Some(account) = accounts.of_upstream(&s.upstream) else {
            continue; // another provider's deployment (or one no longer configured)
        };
        if s.day < first || s.day > last {
            continue;
        }
        let key = (
            s.day.clone(),
            base_model(&s.model).to_string(),
            account.clone(),
        );
        cells.entry(key).or_default().0 += i128::from(s.cost_micros);
    }
    for l in lines {
        let key = (
            l.day.to_string(),
            base_model(&l.model).to_string(),
            accounts.of_line(&l.accounts),
        );
        cells.entry(key).or_default().1 += i128::from(l.micros);
    }
    // A sum past ±9.2 × 10^12 USD is not a bill: held at the i64 bounds.
    let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
    cells
        .into_iter()
        .map(|((day, model, account), (sluice, provider))| {
            let (sluice, provider) = (clamp(sluice), clamp(provider));
            let diff = clamp(i128::from(sluice) - i128::from(provider));
            ReconciliationRow {
                day,
                model,
                account,
                sluice_micros: sluice,
                provider_micros: provider,
                diff_micros: diff,
                flagged: flagged(diff, provider, t),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        micros: 1_000_000,
        bp: 200,
    };

    #[test]
    fn both_thresholds_must_be_passed() {
        // $10 billed: 2 % is $0.20, the $1.00 floor decides.
        assert!(!flagged(1_000_000, 10_000_000, T));
        assert!(!flagged(-999_999, 10_000_000, T));
        assert!(flagged(1_000_001, 10_000_000, T));
        assert!(flagged(-1_000_001, 10_000_000, T));
        // $100 billed: 2 % is $2.00, which decides.
        assert!(!flagged(2_000_000, 100_000_000, T));
        assert!(flagged(2_000_001, 100_000_000, T));
        // Nothing billed: any difference over the floor.
        assert!(flagged(1_000_001, 0, T));
    }

    /// A claimed key needs a part grouped by key, a claimed project one grouped by
    /// project, a claim of neither shape (not met in the export) both — every part.
    #[test]
    fn an_export_must_be_grouped_by_the_kind_of_account_claimed() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (key, project) = (ids(&["key_9"]), ids(&["proj_9"]));
        let (named_key, named_project) = (
            Named::of(Some("key_9"), None),
            Named::of(None, Some("proj_9")),
        );
        let part = |place: &str, named| Part {
            place: place.into(),
            named,
        };
        let by_key = [(key.as_slice(), named_key)];
        let by_project = [(project.as_slice(), named_project)];
        let keyed = [part("k", named_key)];
        let projected = [part("p", named_project)];
        let claims = |c: &[&str]| {
            Accounts::new(
                c.iter()
                    .enumerate()
                    .map(|(i, a)| (i.to_string(), Some(a.to_string()))),
            )
        };
        let keys = claims(&["key_1"]);
        let projects = claims(&["proj_1"]);
        assert_eq!(ungrouped(by_key, &keyed, &keys), None);
        assert_eq!(ungrouped(by_project, &projected, &projects), None);
        let u = ungrouped(by_project, &projected, &keys).unwrap();
        assert_eq!(
            (u.place.as_str(), u.api_key, u.project),
            ("p", vec!["key_1".to_string()], vec![])
        );
        let u = ungrouped(by_key, &keyed, &projects).unwrap();
        assert_eq!((u.api_key, u.project), (vec![], vec!["proj_1".to_string()]));
        // `acct` has neither shape: either grouping alone may miss it.
        let odd = claims(&["acct"]);
        assert!(ungrouped(by_key, &keyed, &odd).is_some());
        assert!(ungrouped(by_project, &projected, &odd).is_some());
        // Named as a project by the export itself: a project.
        let seen = ids(&["acct"]);
        let named = [(seen.as_slice(), Named::of(None, Some("acct")))];
        let parts = [part("a", Named::of(None, Some("acct")))];
        assert_eq!(ungrouped(named, &parts, &odd), None);
        assert_eq!(ungrouped(by_key, &keyed, &claims(&[])), None);
        // One part grouped by key and one by project alone, a key claimed: the second is
        // named, whatever the first names.
        let both = [part("k", named_key), part("p", named_project)];
        let figures = [
            (key.as_slice(), named_key),
            (project.as_slice(), named_project),
        ];
        let u = ungrouped(figures, &both, &keys).unwrap();
        assert_eq!(
            (u.place.as_str(), u.api_key),
            ("p", vec!["key_1".to_string()])
        );
    }

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 3, d).unwrap()
    }

    #[test]
    fn figures_meet_by_day_model_and_account() {
        let accounts = Accounts::new([
            ("a".to_string(), Some("proj_a".to_string())),
            ("b".to_string(), None),
        ]);
        let spend = vec![
            UpstreamSpend {
                day: "2026-03-01".into(),
                upstream: "a".into(),
                model: "gpt-4o-mini".into(),
                cost_micros: 5_000_000,
            },
            UpstreamSpend {
                day: "2026-03-01".into(),
                upstream: "b".into(),
                model: "gpt-4o-mini".into(),
                cost_micros: 3_000_000,
            },
            // Another provider's deployment, and a day outside the export: not compared.
            UpstreamSpend {
                day: "2026-03-01".into(),
                upstream: "claude".into(),
                model: "claude-3-5-haiku".into(),
                cost_micros: 7,
            },
            UpstreamSpend {
                day: "2026-03-05".into(),
                upstream: "a".into(),
                model: "gpt-4o-mini".into(),
                cost_micros: 7,
            },
        ];
        let line = |d, model: &str, ids: &[&str], micros| Line {
            day: day(d),
            model: model.into(),
            accounts: ids.iter().map(|s| s.to_string()).collect(),
            named: crate::finance::exports::Named::default(),
            micros,
        };
        let lines = vec![
            line(1, "gpt-4o-mini-2024-07-18", &["key_x", "proj_a"], 2_000_000),
            line(1, "gpt-4o-mini-2024-07-18", &["proj_a"], 3_000_000),
            line(1, "gpt-4o-mini-2024-07-18", &["proj_unknown"], 3_000_000),
            line(2, "gpt-4o", &[], 9_000_000),
        ];
        let rows = compare(&lines, (day(1), day(2)), &spend, &accounts, T);
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.day.as_str(),
                    r.model.as_str(),
                    r.account.as_str(),
                    r.sluice_micros,
                    r.provider_micros,
                    r.flagged,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "2026-03-01",
                    "gpt-4o-mini",
                    "*",
                    3_000_000,
                    3_000_000,
                    false
                ),
                (
                    "2026-03-01",
                    "gpt-4o-mini",
                    "proj_a",
                    5_000_000,
                    5_000_000,
                    false
                ),
                ("2026-03-02", "gpt-4o", "*", 0, 9_000_000, true),
            ]
        );
    }
}
