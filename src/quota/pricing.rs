//! Money arithmetic, all in integer micro-dollars. Prices are micro-dollars per million
//! tokens; a request costs `ceil((in × in_price + out × out_price) / 1 000 000)`, rounded up
//! once per request. The reservation uses the same formula on the worst case.

/// A model's prices in micro-dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prices {
    pub input: i64,
    pub output: i64,
    pub cached_input: i64,
}

/// Token counts of one answer, as the upstream reported them (or as counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input: i64,
    /// Part of `input` served from the provider's prompt cache (priced at `cached_input`).
    pub cached_input: i64,
    pub output: i64,
}

/// The one place an upstream's reported usage (the internal form's, whatever the wire
/// format) becomes what is priced: cache writes are input at the input price, reasoning
/// is output.
impl From<crate::upstream::providers::canonical::Usage> for Usage {
    fn from(u: crate::upstream::providers::canonical::Usage) -> Self {
        Usage {
            input: u.input,
            cached_input: u.cached_input,
            output: u.output,
        }
    }
}

const PER_MTOK: i128 = 1_000_000;

/// The cost of `usage`, rounded up once. i128 inside: no overflow for any token count.
pub fn cost(usage: Usage, p: Prices) -> i64 {
    let cached = usage.cached_input.clamp(0, usage.input.max(0));
    let fresh = usage.input.max(0) - cached;
    let numer = i128::from(fresh) * i128::from(p.input)
        + i128::from(cached) * i128::from(p.cached_input)
        + i128::from(usage.output.max(0)) * i128::from(p.output);
    let micros = (numer + PER_MTOK - 1) / PER_MTOK;
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// The reservation's input side: the tokenizer's count plus the configured margin
/// (`× ratio + tokens`), rounded up.
pub fn input_with_margin(counted: i64, ratio: f64, extra_tokens: u32) -> i64 {
    // Ratio in thousandths keeps the margin in integer arithmetic.
    let permille = (ratio * 1000.0).round() as i64;
    (counted.max(0) * permille + 999) / 1000 + i64::from(extra_tokens)
}

/// Formats micro-dollars with six decimals, as `x-sluice-budget-remaining-usd` wants.
pub fn usd(micros: i64) -> String {
    let sign = if micros < 0 { "-" } else { "" };
    let m = micros.unsigned_abs();
    format!("{sign}{}.{:06}", m / 1_000_000, m % 1_000_000)
}

/// Parses a USD amount (`12.5`, `0.000001`) into micro-dollars without going through a float.
pub fn parse_usd(s: &str) -> Option<i64> {
    let s = s.trim();
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty()
        || frac.len() > 6
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let w: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let f: i64 = format!("{frac:0<6}").parse().ok()?;
    w.checked_mul(1_000_000)?.checked_add(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_once_per_request() {
        let p = Prices {
            input: 150_000,
            output: 600_000,
            cached_input: 75_000,
        };
        // 1000 × 0.15 + 500 × 0.60 = 150 000 000 + 300 000 000 → 450 micros exactly.
        assert_eq!(
            cost(
                Usage {
                    input: 1000,
                    cached_input: 0,
                    output: 500
                },
                p
            ),
            450
        );
        // 1 token in: 0.15 micros → 1.
        assert_eq!(
            cost(
                Usage {
                    input: 1,
                    cached_input: 0,
                    output: 0
                },
                p
            ),
            1
        );
        assert_eq!(cost(Usage::default(), p), 0);
        assert_eq!(
            cost(
                Usage {
                    input: 1000,
                    cached_input: 1000,
                    output: 0
                },
                p
            ),
            75
        );
        let dear = Prices {
            input: 150_000,
            output: 2_000_000,
            cached_input: 0,
        };
        assert_eq!(
            cost(
                Usage {
                    input: i64::MAX,
                    cached_input: 0,
                    output: i64::MAX
                },
                dear
            ),
            i64::MAX,
            "saturates"
        );
    }

    #[test]
    fn margin_and_formatting() {
        assert_eq!(input_with_margin(100, 1.10, 16), 126);
        assert_eq!(input_with_margin(1, 1.10, 16), 18);
        assert_eq!(usd(1_500_000), "1.500000");
        assert_eq!(usd(7), "0.000007");
        assert_eq!(parse_usd("12.5"), Some(12_500_000));
        assert_eq!(parse_usd("0.000001"), Some(1));
        assert_eq!(parse_usd("1.0000001"), None);
        assert_eq!(parse_usd("-1"), None);
        assert_eq!(parse_usd("abc"), None);
    }
}
