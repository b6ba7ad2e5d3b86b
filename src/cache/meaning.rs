//! What two questions must share before one may answer the other: the agreement check of
//! the semantic match. A similarity score alone cannot tell "order 48213" from "order
//! 48231", "USD to EUR" from "EUR to USD" or `i < n` from `i <= n` — they share nearly
//! every n-gram — and a false hit is a wrong answer given to a user. So a question is read
//! into tokens, and a candidate is only compared by similarity when its tokens agree:
//!
//! - with the built-in `lexical` embedder (strict): every token, in order. What may differ
//!   is case (outside code, short acronyms — `IT` is not `it` — and words whose case
//!   names something: `MBps`/`Mbps`, `3 Mm`/`3 mm`, `-R`/`-r`), punctuation, spacing
//!   within a line, contractions (`what's` = `what is`), Unicode composition (NFC),
//!   `how can I` = `how do I`, and filler only where it cannot be the question: greetings
//!   and thanks that make up a whole segment ("Hi!", ", thanks.") — but not after words
//!   and a `:` ("Translate into German: hello."), nor, but for thanks and `please`, after
//!   words and a `,` — `please` and `kindly`
//!   at a segment's edges, `can you`/`could you` before a request verb ("can you explain"
//!   is "explain"; "can you lie to me?" is not "lie to me"). Pronouns, articles, modal verbs, and
//!   greetings inside a sentence ("how do you say thank you") are words like any other;
//!   every character that is not a letter, digit, space or plain punctuation is a token
//!   (`₹`, `≤`, `°`, `′`, emoji; `!` after a digit, a factorial), `.5` is not `5`, marks
//!   stay with their letters (`ข่าว` is not `ข้าว`),
//!   and an indented line carries its indentation (Python blocks). A message of filler
//!   alone ("Thanks!") has nothing to compare: exact matches only;
//! - with an `http` embedder (which judges paraphrases): the significant tokens, in order —
//!   numbers (in digits or words), dates, times and identifiers (anything with a digit),
//!   code symbols (`==`, `<=`, `++`, `--hard`) and dotted or snake_case names, every word
//!   of a question that holds code (backticks, braces, an `=`, a call `f(`), negations,
//!   units and currencies, opposites (`left`/`right`, `before`/`after`, …), pronouns and
//!   modal verbs (`my`/`your`, `can`/`do`) and names (capitalised words inside a
//!   sentence). Other words, and their order, are the model's to judge.
//!
//! `ignore_identifiers` (an opt-in, `[cache]` or per model) reads identifiers — VINs,
//! UUIDs, hex ids, timestamps, numbers of 5+ digits — as one placeholder, so reports that
//! differ only in them agree. The key of a semantic candidate includes the agreement
//! (`key.rs`): entries made under one reading are never candidates under another.

use unicode_normalization::UnicodeNormalization;

use super::words::*;

/// One token of a question: its lower-cased text, and whether it is significant even to
/// an embedder that judges meaning (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    pub significant: bool,
}

/// How a question is read: strict (the lexical embedder) or significant tokens only (an
/// http embedder), identifiers significant or not, and by which embedding model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading<'a> {
    /// The semantic match is on (`cache.semantic`): otherwise nothing is read.
    pub semantic: bool,
    pub strict: bool,
    pub ignore_identifiers: bool,
    /// The `http` embedder's model (empty for the lexical one): vectors of two models are
    /// numbers of two spaces, never compared, so the model is part of the context.
    pub model: &'a str,
}

/// The placeholder every identifier reads as under `ignore_identifiers`.
pub const IDENTIFIER: &str = "<id>";

/// A raw token: its text, whether it starts a sentence, whether it is a symbol run (or an
/// indentation), the segment it stands in and how that segment began.
struct Raw {
    text: String,
    sentence_start: bool,
    symbol: bool,
    segment: usize,
    joint: Joint,
}

/// How a segment begins: at the text's start or after a sentence's end, or inside a
/// sentence after a `:` (which introduces what it names) or a `,`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Joint {
    Sentence,
    Colon,
    Comma,
}

impl Joint {
    /// The joint a break character (`is_break`) makes.
    fn after(c: char) -> Joint {
        match c {
            ':' | '：' => Joint::Colon,
            // A `;` joins two clauses as a comma does: what follows is no greeting of its own.
            ',' | '，' | '、' | '،' | ';' | '；' => Joint::Comma,
            _ => Joint::Sentence,
        }
    }
}

/// Whether a text holds code: a backtick, a brace, an `=`, or a call or index (`print(`,
/// `xs[`). In code, case, quotes, `,` and `;` count.
fn is_code(text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    text.contains(['`', '{', '}', '='])
        || chars
            .windows(2)
            .any(|w| is_word(w[0]) && matches!(w[1], '(' | '['))
}

/// The indentation at the start of a line (spaces and tabs), as a token: in Python a
/// statement moved into or out of a block is another program.
fn indentation(run: &str) -> String {
    let shape: String = run
        .chars()
        .map(|c| if c == '\t' { 't' } else { 's' })
        .collect();
    format!("⇥{shape}")
}

/// Splits a text into word tokens (with their joiners), symbol runs and line
/// indentations. Every character that is not a letter, digit, mark, space, break, quote
/// or dash is a symbol — operators, currency signs (`₹`, `₽`), `≤`, `°`, `′`, emoji — so
/// nothing that can change a question is lost. A `,` joins only digits (`100,000`), other
/// joiners any word characters. A `'` or `"` right after a digit is a prime (`5'` feet,
/// `5"` inches).
fn split(text: &str, code: bool) -> Vec<Raw> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut out = Vec::new();
    let mut sentence_start = true;
    let mut segment = 0;
    let mut joint = Joint::Sentence;
    let mut i = 0;
    let breaks = |c: char| is_break(c) && !(code && matches!(c, ',' | ';'));
    let ignored = |c: char| {
        c.is_whitespace() || c.is_control() || (is_quote_or_dash(c) && !(code && c != '`'))
    };
    // Any dash opening a word outside code is a flag's, on its own (`ls –R`, `(−R)` and
    // `"–R"`, pasted from a word processor, are `ls -R`, `(-R)`): an en dash was dropped,
    // and `−` or `(-` kept as runs the flag rule did not know, so the flag lost its case
    // (s31 stop attack C2, s32 diff attack F2).
    let opens_flag = |i: usize| {
        !code
            && is_dash(chars[i].1)
            && (i == 0 || !is_word(chars[i - 1].1))
            && chars.get(i + 1).is_some_and(|&(_, n)| n.is_alphabetic())
    };
    while i < chars.len() {
        let (start, c) = chars[i];
        // `.5` is a number, not a break and `5`.
        let leading_dot = c == '.' && chars.get(i + 1).is_some_and(|&(_, n)| n.is_ascii_digit());
        if is_word(c) || leading_dot {
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
                text: text[start..end].to_string(),
                sentence_start,
                symbol: false,
                segment,
                joint,
            });
            sentence_start = false;
            i = j;
            continue;
        }
        if opens_flag(i) {
            out.push(Raw {
                text: "-".to_string(),
                sentence_start: false,
                symbol: true,
                segment,
                joint,
            });
            i += 1;
            continue;
        }
        let after_digit = i > 0 && chars[i - 1].1.is_ascii_digit();
        let prime = matches!(c, '\'' | '"')
            && after_digit
            && !chars.get(i + 1).is_some_and(|&(_, n)| is_word(n));
        // A dash before a number is a minus sign (`–3`, `10 – 3`), not punctuation.
        let minus = matches!(c, '–' | '—' | '―')
            && chars[i + 1..]
                .iter()
                .find(|&&(_, n)| n != ' ')
                .is_some_and(|&(_, n)| n.is_ascii_digit());
        if c == '\n' {
            // A break right after a `:` or `,` (nothing between) goes on with what it
            // opened: "…:\nhello" names "hello" as "…: hello" does (a message's parts are
            // joined by a line break), not a greeting of its own line.
            // Each line of what a `:` introduces (a list of words to translate) is named by
            // it too, up to a sentence's end: only its first was (s24 attack on the fixes,
            // F3).
            let opened = joint == Joint::Comma && out.last().is_none_or(|r| r.segment != segment);
            if joint == Joint::Colon {
                segment += 1;
            } else if !opened {
                segment += 1;
                joint = Joint::Sentence;
            }
            sentence_start = true;
            let mut j = i + 1;
            while j < chars.len() && matches!(chars[j].1, ' ' | '\t') {
                j += 1;
            }
            let indented = j > i + 1 && chars.get(j).is_some_and(|&(_, n)| !n.is_whitespace());
            if indented {
                let end = chars[j].0;
                out.push(Raw {
                    text: indentation(&text[start + 1..end]),
                    sentence_start: false,
                    symbol: true,
                    segment,
                    joint,
                });
            }
            i = j;
        } else if prime || minus || !(is_word(c) || breaks(c) || ignored(c)) {
            let symbolic = |d: char| !(is_word(d) || breaks(d) || ignored(d));
            let mut j = i + 1;
            while !prime && !minus && j < chars.len() && symbolic(chars[j].1) && !opens_flag(j) {
                j += 1;
            }
            let end = chars.get(j).map_or(text.len(), |&(e, _)| e);
            let run = &text[start..end];
            // `!` ends a sentence unless it stands before a word (`!x`, `!=` is a run) or
            // right after a digit, where it is a factorial (`4! + 1` is not `4 + 1`).
            let exclamation = run.chars().all(|c| c == '!')
                && !after_digit
                && !chars.get(j).is_some_and(|&(_, n)| is_word(n));
            if exclamation {
                sentence_start = true;
                segment += 1;
                joint = Joint::Sentence;
            } else {
                out.push(Raw {
                    text: run.to_string(),
                    sentence_start: false,
                    symbol: true,
                    segment,
                    joint,
                });
            }
            i = j;
        } else {
            if breaks(c) {
                segment += 1;
                // `1.` numbering a list a `:` introduced ends no sentence.
                let numbered = c == '.' && after_digit && joint == Joint::Colon;
                if !numbered {
                    joint = Joint::after(c);
                }
                if !matches!(c, ',' | '，' | '、' | '،') {
                    sentence_start = true;
                }
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

/// A word whose case names what its lower case does not, after `prev`: a capital inside
/// a word with small letters (`MBps` and `Mbps`, `mHz`, `kB`, `pH`), a capital in a word
/// with a digit (a unit written against its number: `5Gb` and `5gb`), a word of up to four
/// letters after a number (a unit: `3 Mm` and `3 mm`, `5 Mbar`), up to three letters after
/// a dash (flags: `-R` and `-r`, `-Rt`), a prefixed unit anywhere (`Mm` and `mm`). Read folded, each such pair was one question — a
/// semantic hit at similarity 1 answered the other (s31 cache attack F1, diff attack F2).
fn case_counts(raw: &Raw, prev: Option<&Raw>) -> bool {
    let letters = || raw.text.chars().filter(|c| c.is_alphabetic());
    let inner_capital =
        letters().skip(1).any(char::is_uppercase) && letters().any(char::is_lowercase);
    let glued = raw.text.chars().any(|c| c.is_ascii_digit()) && letters().any(char::is_uppercase);
    let after_number = prev.is_some_and(|p| {
        p.text.chars().any(|c| c.is_ascii_digit())
            && p.text
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
    }) && letters().count() <= 4;
    let flag = letters().count() <= 3 && prev.is_some_and(|p| p.symbol && p.text.ends_with('-'));
    // A prefixed unit in a compound or with a power (`Mm/s`, `Mg/day`, `Mm²`) too (s32
    // diff attack F1).
    let prefixed = unit_parts(&raw.text).any(|p| PREFIXED_UNITS.contains(&p));
    inner_capital || glued || after_number || flag || prefixed
}

/// The parts of a word that may each name a unit: `Mm/s` is `Mm` and `s`, `mm²` is `mm`.
fn unit_parts(word: &str) -> impl Iterator<Item = &str> {
    word.split(['/', '-', '.', '·'])
        .map(|part| part.trim_end_matches(|c: char| !c.is_alphabetic()))
}

/// A capitalised word inside a sentence, or an acronym.
fn is_name(raw: &Raw) -> bool {
    let first_upper = raw
        .text
        .chars()
        .find(|c| c.is_alphabetic())
        .is_some_and(char::is_uppercase);
    (first_upper && !raw.sentence_start) || is_acronym(&raw.text)
}

/// The length of the phrase of `list` that starts at `words[i]`, if one does (words kept
/// whole — acronyms, symbols — never match).
fn phrase_at(words: &[Word], i: usize, list: &[&[&str]]) -> Option<usize> {
    list.iter()
        .find(|p| {
            words
                .get(i..i + p.len())
                .is_some_and(|w| w.iter().zip(p.iter()).all(|(a, b)| a.text == *b && !a.kept))
        })
        .map(|p| p.len())
}

/// The length of the phrase of `list` that ends just before `words[end]`, if one does.
fn phrase_before(words: &[Word], end: usize, list: &[&[&str]]) -> Option<usize> {
    list.iter()
        .find(|p| p.len() <= end && phrase_at(words, end - p.len(), &[p]) == Some(p.len()))
        .map(|p| p.len())
}

/// Whether a segment of greetings is what the sentence before it names, not filler:
/// after a `:` ("Translate into German: thank you."), or after a `,` unless it is thanks
/// or `please` closing a request ("Translate into German, hello." is not "…, thanks.").
fn named(segment: &[Word], after_words: bool) -> bool {
    after_words
        && match segment.first().map(|w| w.joint) {
            Some(Joint::Colon) => true,
            Some(Joint::Comma) => !only(segment, COURTESIES),
            Some(Joint::Sentence) | None => false,
        }
}

/// Whether a segment is made of phrases of `list` and nothing else.
fn only(words: &[Word], list: &[&[&str]]) -> bool {
    let mut i = 0;
    while i < words.len() {
        match phrase_at(words, i, list) {
            Some(n) => i += n,
            None => return false,
        }
    }
    true
}

/// A word as read: its text, whether it is significant, whether it is kept whole (never
/// filler), the segment it stands in and how that segment began.
struct Word {
    text: String,
    significant: bool,
    kept: bool,
    segment: usize,
    joint: Joint,
}

/// Reads a question into its tokens: lower-cased (but for code and short acronyms),
/// contractions expanded, filler dropped, identifiers read as `IDENTIFIER` when they are
/// to be ignored. The text is read in its composed form (NFC): `é` typed as `e` and an
/// accent is `é`.
pub fn tokens(text: &str, ignore_identifiers: bool) -> Vec<Token> {
    let text: String = text.nfc().filter(|c| !is_invisible(*c)).collect();
    // A question with code in it is compared token for token, in its own case: in code
    // one word (`append`/`extend`, `let`/`let mut`, `String`/`string`) changes the answer.
    let code = is_code(&text);
    let raws = split(&text, code);
    // A text written in capitals says nothing by its case; elsewhere a word in capitals is
    // a name even when its letters spell filler (`US` is not `us`, `IT` is not `it`).
    let letters = || text.chars().filter(|c| c.is_alphabetic());
    let shouting = letters().next().is_some() && letters().all(|c| !c.is_lowercase());
    let mut words: Vec<Word> = Vec::new();
    for (i, raw) in raws.iter().enumerate() {
        let (segment, joint) = (raw.segment, raw.joint);
        if raw.symbol {
            words.push(Word {
                text: raw.text.clone(),
                significant: true,
                kept: true,
                segment,
                joint,
            });
            continue;
        }
        let name = !shouting && is_name(raw);
        let acronym = !shouting && is_acronym(&raw.text);
        let lower = raw.text.to_lowercase();
        if ignore_identifiers && is_identifier(&lower) {
            words.push(Word {
                text: IDENTIFIER.to_string(),
                significant: true,
                kept: true,
                segment,
                joint,
            });
            continue;
        }
        // Case is kept in code (every word: `Print(x)` and `String s` may open one) and
        // for short acronyms, whose lower case is often another word (`IT`, `WHO`, `US`);
        // a long word in capitals is emphasis (`a FAILING alternator`).
        let short_acronym = acronym && raw.text.chars().filter(|c| c.is_alphabetic()).count() <= 4;
        let cased = !shouting && case_counts(raw, i.checked_sub(1).map(|p| &raws[p]));
        let keep_case = code || short_acronym || cased;
        let expanded = expand(&lower);
        let whole = expanded.len() == 1;
        for w in expanded {
            let significant = code
                || cased
                || name
                || w.contains(['_', '.'])
                || w.chars().any(|c| c.is_ascii_digit())
                || unit_parts(&w).any(|p| UNITS.contains(&p))
                || [NEGATIONS, OPPOSITES, ROLES, NUMBER_WORDS]
                    .iter()
                    .any(|l| l.contains(&w.as_str()));
            let text = if keep_case && whole {
                raw.text.replace('’', "'")
            } else {
                w
            };
            words.push(Word {
                text,
                significant,
                kept: acronym,
                segment,
                joint,
            });
        }
    }
    // "how can I" asks for a way, as "how do I" does ("how can it work?" is left alone).
    for i in 0..words.len().saturating_sub(2) {
        if words[i].text == "how"
            && words[i + 1].text == "can"
            && matches!(words[i + 2].text.as_str(), "i" | "we")
        {
            words[i + 1].text = "do".to_string();
        }
    }
    // Filler, segment by segment: whole segments of greetings (but for those the words
    // just before them name), then openers and closers at a segment's edges while words
    // remain between them.
    let mut out = Vec::with_capacity(words.len());
    let mut after_words = false;
    for segment in words.chunk_by(|a, b| a.segment == b.segment) {
        if only(segment, GREETINGS) && !named(segment, after_words) {
            after_words = false;
            continue;
        }
        after_words = true;
        let (mut start, mut end) = (0, segment.len());
        loop {
            let request = phrase_at(segment, start, REQUESTS).filter(|n| {
                segment
                    .get(start + n)
                    .is_some_and(|w| REQUEST_VERBS.contains(&w.text.as_str()))
            });
            match request.or_else(|| phrase_at(segment, start, OPENERS)) {
                Some(n) if start + n < end => start += n,
                _ => break,
            }
        }
        while let Some(n) = phrase_before(segment, end, CLOSERS).filter(|n| end - n > start) {
            end -= n;
        }
        out.extend(segment[start..end].iter().map(|w| Token {
            text: w.text.clone(),
            significant: w.significant,
        }));
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
    !a.is_empty()
        && agreement(&a, true) == agreement(&b, true)
        && super::embed::cosine(
            &super::embed::lexical(&normalised(&a)),
            &super::embed::lexical(&normalised(&b)),
        ) >= threshold
}

#[cfg(test)]
#[path = "meaning_test.rs"]
mod tests;
