//! Seeded, probabilistic faults: a soak's background noise. A script with `faults` has each
//! request draw once from the mock's generator (seeded by `faults.seed`, one sequence shared
//! by every key) and get at most one fault: a 503, a stream cut, or a stream with one event
//! that is not JSON. The sequence of draws is fixed by the seed; which request gets which
//! draw depends on arrival order.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::Script;

/// Shares of requests that get each fault (0.02 = 2 %), drawn from a generator seeded by
/// `seed`. Cuts and malformed events apply to streamed answers only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    pub seed: u64,
    /// Answered 503 (a provider-shaped error, no `Retry-After`).
    pub unavailable: f64,
    /// The connection breaks after 1 to 3 content chunks (no usage, no `[DONE]`).
    pub cut: f64,
    /// One event whose data is not JSON after 1 to 3 content chunks; the stream goes on.
    pub malformed: f64,
}

/// The generator of the faults in force: reseeded when a script brings another seed.
#[derive(Default)]
pub(super) struct FaultDice {
    rng: Option<(u64, StdRng)>,
}

impl FaultDice {
    /// `script` with the fault this request drew, if any (the script's `faults` removed).
    pub(super) fn apply(&mut self, mut script: Script) -> Script {
        let Some(f) = script.faults.take() else {
            return script;
        };
        let rng = match &mut self.rng {
            Some((seed, rng)) if *seed == f.seed => rng,
            slot => &mut slot.insert((f.seed, StdRng::seed_from_u64(f.seed))).1,
        };
        let roll: f64 = rng.gen();
        let at = rng.gen_range(1..=3usize);
        let (unavailable, cut, malformed) =
            (share(f.unavailable), share(f.cut), share(f.malformed));
        if roll < unavailable {
            script.status = Some(503);
        } else if roll < unavailable + cut {
            script.cut_after = Some(at);
        } else if roll < unavailable + cut + malformed {
            script.corrupt_after = Some(at);
        }
        script
    }
}

/// A share as given, kept within [0, 1] (NaN is 0).
fn share(p: f64) -> f64 {
    if p.is_nan() {
        0.0
    } else {
        p.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faulty(seed: u64) -> Script {
        Script {
            faults: Some(Faults {
                seed,
                unavailable: 0.02,
                cut: 0.01,
                malformed: 0.01,
            }),
            ..Default::default()
        }
    }

    /// What a request drew: (status, cut_after, corrupt_after).
    type Drawn = (Option<u16>, Option<usize>, Option<usize>);

    fn outcomes(seed: u64, n: usize) -> Vec<Drawn> {
        let mut dice = FaultDice::default();
        (0..n)
            .map(|_| {
                let s = dice.apply(faulty(seed));
                assert!(s.faults.is_none());
                (s.status, s.cut_after, s.corrupt_after)
            })
            .collect()
    }

    #[test]
    fn a_seed_fixes_the_sequence_and_the_shares_hold() {
        let a = outcomes(7, 20_000);
        assert_eq!(
            a,
            outcomes(7, 20_000),
            "the same seed draws the same faults"
        );
        assert_ne!(a, outcomes(8, 20_000));
        let count = |f: &dyn Fn(&Drawn) -> bool| a.iter().filter(|o| f(o)).count();
        // Expected 400 / 200 / 200 of 20 000; a binomial's 5 sigma is ~100 / ~70.
        let unavailable = count(&|o| o.0 == Some(503));
        let cut = count(&|o| o.1.is_some());
        let malformed = count(&|o| o.2.is_some());
        assert!((300..=500).contains(&unavailable), "503s: {unavailable}");
        assert!((130..=270).contains(&cut), "cuts: {cut}");
        assert!((130..=270).contains(&malformed), "malformed: {malformed}");
        assert!(a
            .iter()
            .all(|o| [o.0.is_some(), o.1.is_some(), o.2.is_some()]
                .iter()
                .filter(|x| **x)
                .count()
                <= 1));
    }

    /// What `/_mock/sticky` takes: the faults in a script's JSON.
    #[test]
    fn faults_are_scriptable_as_json() {
        let s: Script = serde_json::from_value(serde_json::json!({
            "chunk_delay_ms": 40,
            "faults": {"seed": 3, "unavailable": 0.02, "cut": 0.01, "malformed": 0.01}
        }))
        .unwrap();
        assert_eq!(
            s.faults,
            Some(Faults {
                seed: 3,
                unavailable: 0.02,
                cut: 0.01,
                malformed: 0.01
            })
        );
        let bad = serde_json::from_value::<Script>(
            serde_json::json!({"faults": {"seed": 1, "drop": 0.5}}),
        );
        assert!(bad.is_err(), "an unknown fault is refused, not ignored");
    }

    #[test]
    fn shares_out_of_range_are_clamped_not_a_panic() {
        let mut dice = FaultDice::default();
        let s = dice.apply(Script {
            faults: Some(Faults {
                seed: 1,
                unavailable: f64::NAN,
                cut: 7.0,
                malformed: -1.0,
            }),
            ..Default::default()
        });
        assert!(s.cut_after.is_some() && s.status.is_none());
    }
}
