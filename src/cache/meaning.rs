//! What two questions must share before one may answer the other: the agreement check of
//! the semantic match. A similarity score alone cannot tell "order 48213" from "order
//! 48231", "USD to EUR" from "EUR to USD" or `i < n` from `i <= n` — they share nearly
//! every n-gram — and a false hit is a wrong answer given to a user. So a question is read
//! into tokens, and a candidate is only compared by similarity when its tokens agree:
//!
//! - with the built-in `lexical` embedder (strict): every token, in order. What may differ
//!   is case, punctuation, whitespace, contractions (`what's` = `what is`, `doesn't` =
//!   `does not`) and filler (articles, greetings, thanks, `please`, `can you`, pronouns);
//! - with an `http` embedder (which judges paraphrases): the significant tokens, in order —
//!   numbers, dates, times and identifiers (anything with a digit), code symbols (`==`,
//!   `<=`, `++`, `--hard`) and dotted or snake_case names, every word of a question that
//!   holds code (backticks, braces, an `=`), negations, units and currencies, opposites
//!   (`left`/`right`, `before`/`after`, …) and names (capitalised words inside a
//!   sentence). Other words, and their order, are the model's to judge.
//!
//! `ignore_identifiers` (an opt-in, `[cache]` or per model) reads identifiers — VINs,
//! UUIDs, hex ids, timestamps, numbers of 5+ digits — as one placeholder, so reports that
//! differ only in them agree. The key of a semantic candidate includes the agreement
//! (`key.rs`): entries made under one reading are never candidates under another.

/// One token of a question: its lower-cased text, and whether it is significant even to
/// an embedder that judges meaning (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    pub significant: bool,
}

/// How a question is read: strict (the lexical embedder) or significant tokens only (an
/// http embedder), identifiers significant or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// The semantic match is on (`cache.semantic`): otherwise nothing is read.
    pub semantic: bool,
    pub strict: bool,
    pub ignore_identifiers: bool,
}

/// The placeholder every identifier reads as under `ignore_identifiers`.
pub const IDENTIFIER: &str = "<id>";

/// Words that carry no meaning of their own in a question: dropped before comparing.
/// Negations, prepositions, question words, tense (`did`, `was`, `will`) and modal verbs
/// that change a question (`should`, `must`) are not here.
const FILLER: &[&str] = &[
    "a", "an", "the", "please", "pls", "plz", "kindly", "hi", "hello", "hey", "thanks", "thx",
    "cheers", "you", "your", "yours", "i", "me", "my", "we", "us", "our", "just", "ok", "okay",
    "so", "um", "uh", "hmm", "do", "does", "can", "could", "would", "tell",
];

/// Phrases dropped whole (before single words): their words mean something elsewhere.
const FILLER_PHRASES: &[&[&str]] = &[
    &["thanks", "in", "advance"],
    &["thank", "you", "in", "advance"],
    &["thank", "you"],
    &["hi", "there"],
    &["hey", "there"],
    &["hello", "there"],
    &["quick", "question"],
    &["i", "was", "wondering"],
    &["i", "wonder"],
];

#[rustfmt::skip]
const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nor", "neither", "without", "nothing", "nobody", "nowhere",
    "except", "excluding", "unless",
];

/// Units and currencies: `5 mg` and `5 g` must not agree.
#[rustfmt::skip]
const UNITS: &[&str] = &[
    "km", "m", "cm", "mm", "mi", "mile", "miles", "ft", "feet", "foot", "inch", "inches",
    "yard", "yards", "metre", "metres", "meter", "meters", "kilometre", "kilometres",
    "kilometer", "kilometers", "kg", "g", "mg", "lb", "lbs", "oz", "ounce", "ounces", "gram",
    "grams", "kilogram", "kilograms", "pound", "pounds", "ton", "tons", "tonne", "tonnes", "l",
    "ml", "litre", "litres", "liter", "liters", "gallon", "gallons", "pint", "pints", "cup",
    "cups", "celsius", "fahrenheit", "kelvin", "c", "f", "degree", "degrees", "ms", "s", "sec",
    "second", "seconds", "min", "minute", "minutes", "h", "hr", "hour", "hours", "day", "days",
    "week", "weeks", "month", "months", "year", "years", "kb", "mb", "gb", "tb", "kib", "mib",
    "gib", "w", "kw", "mw", "kwh", "v", "mah", "hz", "khz", "mhz", "ghz", "bar", "psi", "pa",
    "kpa", "rpm", "usd", "eur", "gbp", "jpy", "cny", "chf", "dollar", "dollars", "euro",
    "euros", "cent", "cents", "pence", "yen", "percent", "per",
];

/// Words whose opposite shares every other word of a question. One word of a pair is
/// enough (`off` tells `on` from `off`), so the commonest (`in`, `on`, `to`) are left out.
#[rustfmt::skip]
const OPPOSITES: &[&str] = &[
    "left", "right", "up", "down", "before", "after", "above", "below", "over", "under",
    "increase", "decrease", "more", "less", "fewer", "min", "minimum", "max", "maximum",
    "first", "last", "start", "stop", "end", "open", "close", "enable", "disable", "true",
    "false", "yes", "off", "out", "encrypt", "decrypt", "import", "export", "buy", "sell",
    "rent", "win", "lose", "add", "remove", "upgrade", "downgrade", "higher", "lower", "larger",
    "smaller", "faster", "slower", "advantages", "disadvantages", "pros", "cons", "junior",
    "senior", "formal", "informal", "soft", "hard", "north", "south", "east", "west",
    "yesterday", "today", "tomorrow", "old", "new",
];

/// Characters that are code or maths wherever they stand. Brackets too: `(2 + 3) * 4` is
/// not `2 + (3 * 4)`.
#[rustfmt::skip]
fn is_symbol(c: char) -> bool {
    matches!(
        c,
        '+' | '-' | '*' | '/' | '%' | '=' | '<' | '>' | '!' | '&' | '|' | '^' | '~' | '#' | '$'
            | '€' | '£' | '¥' | '@' | '\\' | '(' | ')' | '[' | ']' | '{' | '}'
    )
}

/// Characters that join two word characters into one token: `3.14`, `eu-west-1`,
/// `12:30`, `and/or`, `don't`.
fn is_joiner(c: char) -> bool {
    matches!(c, '.' | '-' | ':' | '/' | '\'' | '’' | ',')
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A raw token: its text, whether it starts a sentence, whether it is a symbol run.
struct Raw<'t> {
    text: &'t str,
    sentence_start: bool,
    symbol: bool,
}

/// Splits a text into word tokens (with their joiners) and symbol runs; everything else
/// separates. A `,` joins only digits (`100,000`), other joiners any word characters.
fn split(text: &str) -> Vec<Raw<'_>> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut sentence_start = true;
    let mut i = 0;
    while i < chars.len() {
        let (start, c) = chars[i];
        if is_word(c) {
            let mut j = i + 1;
            while j < chars.len() {
                let (_, d) = chars[j];
                let joins = is_joiner(d)
                    && chars.get(j + 1).is_some_and(|&(_, n)| is_word(n))
                    && (d != ','
                        || (chars[j - 1].1.is_ascii_digit() && chars[j + 1].1.is_ascii_digit()));
                if is_word(d) || joins {
                    j += 1;
                } else {
                    break;
                }
            }
            let end = chars.get(j).map_or(text.len(), |&(e, _)| e);
            out.push(Raw {
                text: &text[start..end],
                sentence_start,
                symbol: false,
            });
            sentence_start = false;
            i = j;
        } else if is_symbol(c) {
            let mut j = i + 1;
            while j < chars.len() && is_symbol(chars[j].1) {
                j += 1;
            }
            let end = chars.get(j).map_or(text.len(), |&(e, _)| e);
            let run = &text[start..end];
            // `!` ends a sentence unless it stands before a word (`!x`, `!=` is a run).
            let exclamation =
                run.chars().all(|c| c == '!') && !chars.get(j).is_some_and(|&(_, n)| is_word(n));
            if exclamation {
                sentence_start = true;
            } else {
                out.push(Raw {
                    text: run,
                    sentence_start: false,
                    symbol: true,
                });
            }
            i = j;
        } else {
            if matches!(c, '.' | '?' | ':' | ';' | '\n') {
                sentence_start = true;
            }
            i += 1;
        }
    }
    out
}

/// `don't` → `do not`, `what's` → `what is`, `I'm` → `i am`; other words as they are.
fn expand(word: &str) -> Vec<String> {
    let w = word.replace('’', "'");
    let special = match w.as_str() {
        "can't" | "cannot" => Some(["can", "not"]),
        "won't" => Some(["will", "not"]),
        "shan't" => Some(["shall", "not"]),
        "ain't" => Some(["is", "not"]),
        _ => None,
    };
    if let Some(s) = special {
        return s.iter().map(|s| s.to_string()).collect();
    }
    for (suffix, full) in [
        ("n't", "not"),
        ("'s", "is"),
        ("'re", "are"),
        ("'m", "am"),
        ("'ll", "will"),
        ("'ve", "have"),
        ("'d", "would"),
    ] {
        if let Some(stem) = w.strip_suffix(suffix) {
            if !stem.is_empty() {
                return vec![stem.to_string(), full.to_string()];
            }
        }
    }
    vec![w]
}

/// Whether a (lower-cased) word is an identifier for `ignore_identifiers`: a VIN, a
/// UUID, a hex id of 8+ characters, a timestamp (date and time of day), or a number of 5+
/// digits that is mostly digits (order ids, tickets, serials) — not a plain date, time or
/// decimal number.
pub fn is_identifier(w: &str) -> bool {
    let alnum: Vec<char> = w.chars().filter(char::is_ascii_alphanumeric).collect();
    let digits = alnum.iter().filter(|c| c.is_ascii_digit()).count();
    let letters = alnum.len() - digits;
    if digits == 0 {
        return false;
    }
    let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    let uuid = {
        let parts: Vec<&str> = w.split('-').collect();
        parts.len() == 5
            && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
            && parts.iter().all(|p| hex(p))
    };
    let vin = w.len() == 17 && alnum.len() == 17 && letters > 0;
    let hex_id = w.len() >= 8 && hex(w) && letters > 0;
    let date_part = |s: &str| {
        let p: Vec<&str> = s.split('-').collect();
        p.len() == 3
            && p.iter()
                .all(|x| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit()))
    };
    let timestamp = w
        .split_once('t')
        .is_some_and(|(d, t)| date_part(d) && t.contains(':'));
    let plain_date = date_part(w)
        || (w.split('/').count() == 3 && w.chars().all(|c| c.is_ascii_digit() || c == '/'));
    let decimal = w.contains(['.', ','])
        && w.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ',');
    let long_number = digits >= 5 && digits * 2 >= alnum.len() && !plain_date && !decimal;
    uuid || vin || hex_id || timestamp || long_number
}

/// `USD`, `EU`, `US`: two or more letters, none lower-case.
fn is_acronym(word: &str) -> bool {
    word.chars().filter(|c| c.is_alphabetic()).count() >= 2 && !word.chars().any(char::is_lowercase)
}

/// A capitalised word inside a sentence, or an acronym.
fn is_name(raw: &Raw<'_>) -> bool {
    let first_upper = raw
        .text
        .chars()
        .find(|c| c.is_alphabetic())
        .is_some_and(char::is_uppercase);
    (first_upper && !raw.sentence_start) || is_acronym(raw.text)
}

/// Reads a question into its tokens: lower-cased, contractions expanded, filler dropped,
/// identifiers read as `IDENTIFIER` when they are to be ignored.
pub fn tokens(text: &str, ignore_identifiers: bool) -> Vec<Token> {
    let raws = split(text);
    // A question with code in it is compared token for token: in code one word
    // (`append`/`extend`, `let`/`let mut`) changes the answer.
    let code = text.contains('`')
        || text.contains(['{', '}'])
        || raws.iter().any(|r| r.symbol && r.text.contains('='));
    // A text written in capitals says nothing by its case; elsewhere a word in capitals is
    // a name even when its letters spell filler (`US` is not `us`).
    let letters = || text.chars().filter(|c| c.is_alphabetic());
    let shouting = letters().next().is_some() && letters().all(|c| !c.is_lowercase());
    // (word, significant, never filler)
    let mut words: Vec<(String, bool, bool)> = Vec::new();
    for raw in raws {
        if raw.symbol {
            words.push((raw.text.to_string(), true, true));
            continue;
        }
        let name = !shouting && is_name(&raw);
        let acronym = !shouting && is_acronym(raw.text);
        let lower = raw.text.to_lowercase();
        if ignore_identifiers && is_identifier(&lower) {
            words.push((IDENTIFIER.to_string(), true, true));
            continue;
        }
        for w in expand(&lower) {
            let significant = code
                || name
                || w.contains(['_', '.'])
                || w.chars().any(|c| c.is_ascii_digit())
                || [NEGATIONS, UNITS, OPPOSITES]
                    .iter()
                    .any(|l| l.contains(&w.as_str()));
            words.push((w, significant, acronym));
        }
    }
    // Filler phrases, then filler words.
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    'next: while i < words.len() {
        for phrase in FILLER_PHRASES {
            let fits = words.get(i..i + phrase.len()).is_some_and(|w| {
                w.iter()
                    .zip(*phrase)
                    .all(|((a, _, kept), b)| a == b && !kept)
            });
            if fits {
                i += phrase.len();
                continue 'next;
            }
        }
        let (text, significant, kept) = &words[i];
        if *kept || !FILLER.contains(&text.as_str()) {
            out.push(Token {
                text: text.clone(),
                significant: *significant,
            });
        }
        i += 1;
    }
    out
}

/// The tokens that must agree, in order, under a reading.
pub fn agreement(tokens: &[Token], strict: bool) -> Vec<&str> {
    tokens
        .iter()
        .filter(|t| strict || t.significant)
        .map(|t| t.text.as_str())
        .collect()
}

/// The text the lexical embedder embeds: the tokens, space-separated.
pub fn normalised(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| t.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text an http embedder embeds: the question as written, with identifiers replaced
/// by the placeholder when they are to be ignored.
pub fn for_http(text: &str, ignore_identifiers: bool) -> String {
    if !ignore_identifiers {
        return text.to_string();
    }
    text.split_whitespace()
        .map(|w| {
            let core = w.trim_matches(|c: char| !c.is_alphanumeric());
            if is_identifier(&core.to_lowercase()) {
                w.replace(core, IDENTIFIER)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a question stored as `stored` may answer `asked` under the lexical embedder:
/// exactly what `Cache::get` decides for two requests sharing everything but their last
/// user message (same context key, then cosine ≥ threshold) — for measuring it
/// (`tests/api/cache_precision.rs`).
pub fn lexical_match(asked: &str, stored: &str, ignore_identifiers: bool, threshold: f32) -> bool {
    let (a, b) = (
        tokens(asked, ignore_identifiers),
        tokens(stored, ignore_identifiers),
    );
    agreement(&a, true) == agreement(&b, true)
        && super::embed::cosine(
            &super::embed::lexical(&normalised(&a)),
            &super::embed::lexical(&normalised(&b)),
        ) >= threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agree(a: &str, b: &str, strict: bool, ignore: bool) -> bool {
        agreement(&tokens(a, ignore), strict) == agreement(&tokens(b, ignore), strict)
    }

    #[test]
    fn rewording_agrees_and_meaning_does_not() {
        assert!(agree(
            "Hi! What's the capital of Australia? Thanks",
            "what is the capital of australia",
            true,
            false
        ));
        assert!(agree(
            "Can you explain X?",
            "Could you explain X",
            true,
            false
        ));
        assert!(!agree(
            "Convert 100 USD to EUR.",
            "Convert 100 EUR to USD.",
            false,
            false
        ));
        assert!(!agree("for i < n", "for i <= n", false, false));
        assert!(!agree("Is -3 greater?", "Is 3 greater?", false, false));
        assert!(!agree(
            "Why does it start?",
            "Why doesn't it start?",
            false,
            false
        ));
        assert!(!agree("order 48213", "order 48231", true, false));
        assert!(agree("order 48213", "order 48231", true, true));
        assert!(
            !agree("on 2024-03-15", "on 2024-03-16", true, true),
            "dates stay"
        );
        assert_eq!(normalised(&tokens("Don't stop!", false)), "not stop");
        assert!(
            !agree("(2 + 3) * 4", "2 + (3 * 4)", true, false),
            "brackets"
        );
        assert!(
            !agree("Which US states?", "Which states?", true, false),
            "US is no filler"
        );
        assert!(
            agree("WHICH US STATES?", "which us states?", true, false),
            "shouting"
        );
    }

    proptest::proptest! {
        /// Any text reads without a panic, the same way twice, and agrees with itself; a
        /// digit changed anywhere never agrees.
        #[test]
        fn any_text_reads_and_a_changed_digit_never_agrees(
            text in "\\PC{0,200}",
            digit in 0u32..10,
            ignore in proptest::bool::ANY,
        ) {
            let once = tokens(&text, ignore);
            proptest::prop_assert_eq!(&once, &tokens(&text, ignore));
            let other = format!("{text} {digit}");
            let changed = format!("{text} {}", (digit + 1) % 10);
            for strict in [true, false] {
                proptest::prop_assert!(agree(&other, &other, strict, ignore));
                proptest::prop_assert!(!agree(&other, &changed, strict, ignore));
            }
        }
    }

    #[test]
    fn identifiers() {
        for id in [
            "wvwzzz1jzxw000001",
            "3f2a9c1e-7b4d-4e2a-9f10-2c6d8e4b1a77",
            "7d1f0c9a4b2e88e1",
            "2026-11-03t08:15:00z",
            "48213",
            "a-99321",
        ] {
            assert!(is_identifier(id), "{id}");
        }
        for not in [
            "2024-03-15",
            "3.14159",
            "12:30",
            "p0401",
            "1009",
            "deadbeef",
            "100,000",
        ] {
            assert!(!is_identifier(not), "{not}");
        }
    }
}
