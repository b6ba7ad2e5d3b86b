//! Exact decimal amounts from a provider's export: the text of a JSON number (`0.06`,
//! `6e-2`) or a decimal string (`"123.45"`) scaled to integer micro-dollars without ever
//! passing through a float. Past the micro-dollar the amount is rounded half-up, that is
//! half away from zero (`0.0000005` USD is 1 micro-dollar, `-0.0000005` is −1); what is
//! below half a micro-dollar is dropped.

use serde_json::value::RawValue;

/// USD as written → micro-dollars (OpenAI's `amount.value`).
pub fn usd_to_micros(text: &str) -> Option<i64> {
    scaled(text, 6)
}

/// Cents as written → micro-dollars (Anthropic's `amount`: "123.45" is $1.23 45).
pub fn cents_to_micros(text: &str) -> Option<i64> {
    scaled(text, 4)
}

/// The decimal text of a raw JSON value: a number's own text, or a string's contents.
pub fn raw_text(raw: &RawValue) -> Option<String> {
    let text = raw.get().trim();
    if text.starts_with('"') {
        serde_json::from_str::<String>(text).ok()
    } else {
        Some(text.to_string())
    }
}

/// `text` × 10^`shift`, rounded half away from zero to an integer; `None` for anything that
/// is not a plain decimal number (`-`? digits [`.` digits] [`e` [sign] digits]) or does not
/// fit an `i64`.
pub fn scaled(text: &str, shift: i32) -> Option<i64> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, exponent(e)?),
        None => (rest, 0),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) if !f.is_empty() => (i, f),
        Some(_) => return None,
        None => (mantissa, ""),
    };
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    // The value is `digits` × 10^total.
    let total = i64::from(exp) - frac.len() as i64 + i64::from(shift);
    let (kept, round_up) = if total >= 0 {
        (
            format!("{digits}{}", "0".repeat(total.min(20) as usize)),
            false,
        )
    } else {
        let drop = (-total) as usize;
        if drop > digits.len() {
            (String::new(), false)
        } else {
            let (kept, dropped) = digits.split_at(digits.len() - drop);
            (kept.to_string(), dropped.as_bytes()[0] >= b'5')
        }
    };
    if kept.len() > 19 {
        return None;
    }
    let magnitude = if kept.is_empty() {
        0
    } else {
        kept.parse::<i64>().ok()?
    };
    let magnitude = magnitude.checked_add(i64::from(round_up))?;
    Some(if negative { -magnitude } else { magnitude })
}

/// An exponent's digits (bounded: no export writes 10^400).
fn exponent(e: &str) -> Option<i32> {
    let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    e.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_cents_are_exact() {
        assert_eq!(cents_to_micros("123.45"), Some(1_234_500));
        assert_eq!(cents_to_micros("0"), Some(0));
        assert_eq!(cents_to_micros("0e5"), Some(0));
        assert_eq!(
            cents_to_micros("0.00005"),
            Some(1),
            "half a micro rounds up"
        );
        assert_eq!(cents_to_micros("0.000049"), Some(0));
    }

    #[test]
    fn openai_dollars_are_exact() {
        assert_eq!(usd_to_micros("0.06"), Some(60_000));
        assert_eq!(usd_to_micros("6e-2"), Some(60_000));
        assert_eq!(usd_to_micros("6E+1"), Some(60_000_000));
        assert_eq!(usd_to_micros("0.1234565"), Some(123_457));
        assert_eq!(usd_to_micros("0.1234564999"), Some(123_456));
        assert_eq!(usd_to_micros("-0.0000005"), Some(-1));
        assert_eq!(usd_to_micros("1e-30"), Some(0));
        assert_eq!(usd_to_micros("0.30000000000000004"), Some(300_000));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "-",
            "1.",
            ".5",
            "abc",
            "1e",
            "1e1000",
            "1.2.3",
            "+1",
            " 1",
            "0x10",
            "9223372036854775808",
            "99999999999999999999",
        ] {
            assert_eq!(usd_to_micros(bad), None, "{bad:?}");
        }
        assert_eq!(scaled("9223372036854775807", 0), Some(i64::MAX));
    }

    #[test]
    fn raw_values_give_their_text() {
        let n: Box<RawValue> = serde_json::from_str("0.060000000000000001").unwrap();
        assert_eq!(raw_text(&n).as_deref(), Some("0.060000000000000001"));
        let s: Box<RawValue> = serde_json::from_str("\"123.45\"").unwrap();
        assert_eq!(raw_text(&s).as_deref(), Some("123.45"));
    }
}
