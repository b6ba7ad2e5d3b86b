//! The words and characters the agreement check (`meaning.rs`) reads by: filler that may be
//! dropped and where, words that are always significant, and the character classes the
//! tokeniser splits by. Lists, not rules: the rules are in `meaning.rs`.

use unicode_normalization::char::is_combining_mark;

/// Greetings, thanks and politeness: dropped when they make up a whole segment (the text
/// between two of `.`, `!`, `?`, `,`, `;`, `:` or a line break) — "Hi!", "Thanks in
/// advance." — never inside one: in "how do you say thank you in Japanese" they are the
/// question; nor after a `:` that follows words, nor after such a `,` but for
/// `COURTESIES`: there they are what the sentence names.
pub(super) const GREETINGS: &[&[&str]] = &[
    &["thanks", "in", "advance"],
    &["thank", "you", "in", "advance"],
    &["thank", "you", "so", "much"],
    &["thanks", "so", "much"],
    &["thank", "you"],
    &["thanks"],
    &["thx"],
    &["cheers"],
    &["hi", "there"],
    &["hey", "there"],
    &["hello", "there"],
    &["hi"],
    &["hello"],
    &["hey"],
    &["please"],
    &["pls"],
    &["plz"],
    &["ok"],
    &["okay"],
    &["um"],
    &["uh"],
    &["hmm"],
    &["quick", "question"],
];

/// The greetings that close a request as courtesy after a `,` ("…, thanks."): after a `,`
/// other greetings are what the sentence names ("Translate into German, hello.").
pub(super) const COURTESIES: &[&[&str]] = &[
    &["thanks", "in", "advance"],
    &["thank", "you", "in", "advance"],
    &["thank", "you", "so", "much"],
    &["thanks", "so", "much"],
    &["thank", "you"],
    &["thanks"],
    &["thx"],
    &["please"],
    &["pls"],
    &["plz"],
];

/// Openers dropped at the start of a segment when words follow them: "Please explain…",
/// "Hi, …". `can you` and `could you` are `REQUESTS`, dropped only before a request verb.
pub(super) const OPENERS: &[&[&str]] = &[
    &["please"],
    &["pls"],
    &["plz"],
    &["kindly"],
    &["hi"],
    &["hello"],
    &["hey"],
    &["ok"],
    &["okay"],
    &["um"],
    &["uh"],
    &["hmm"],
];

/// "Can you explain…" is a request, the same as "Explain…" — but "can you lie to me?" asks
/// what the model can do, and "Lie to me." is not that question. So these openers go only
/// before a verb of `REQUEST_VERBS` (or `please`). `would you` is never one.
pub(super) const REQUESTS: &[&[&str]] = &[&["can", "you"], &["could", "you"]];

/// Verbs that make "can you …" a request for the thing itself.
#[rustfmt::skip]
pub(super) const REQUEST_VERBS: &[&str] = &[
    "please", "explain", "give", "tell", "write", "show", "list", "describe", "summarise",
    "summarize", "translate", "help", "suggest", "recommend", "create", "generate", "draft",
    "rewrite", "fix", "review", "compare", "define", "convert", "calculate", "outline",
    "clarify", "elaborate", "correct", "improve", "simplify", "proofread", "paraphrase",
];

/// Politeness dropped at the end of a segment when words precede it: "… in simple terms
/// please".
pub(super) const CLOSERS: &[&[&str]] = &[&["please"], &["pls"], &["plz"]];

/// Words that say who does what to whom, or whether something can, may, must or did
/// happen: never filler, and significant to an http embedder too ("what is my name" is
/// not "what is your name"; "can dogs eat grapes" is not "do dogs eat grapes").
#[rustfmt::skip]
pub(super) const ROLES: &[&str] = &[
    "i", "me", "my", "mine", "myself", "you", "your", "yours", "yourself", "we", "us", "our",
    "ours", "he", "him", "his", "she", "her", "hers", "they", "them", "their", "theirs", "it",
    "its", "can", "could", "would", "should", "must", "may", "might", "will", "shall", "do",
    "does", "did",
];

/// Numbers written as words: "five" and "fifty" must not agree.
#[rustfmt::skip]
pub(super) const NUMBER_WORDS: &[&str] = &[
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    "hundred", "thousand", "million", "billion", "trillion", "dozen", "half", "quarter",
    "once", "twice", "double", "triple", "second", "third", "fourth", "fifth",
];
#[rustfmt::skip]
pub(super) const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nor", "neither", "without", "nothing", "nobody", "nowhere",
    "except", "excluding", "unless",
];

/// Units and currencies: `5 mg` and `5 g` must not agree.
#[rustfmt::skip]
/// Units with a large prefix whose lower case is another unit with a small one (`Mm`
/// megametre and `mm` millimetre, `Mg` and `mg`, `Gb` gigabit and `gb`): spelt so, the
/// word keeps its case wherever it stands — at a sentence's start too, where a capital is
/// ambiguous and two readings only cost a hit.
pub(super) const PREFIXED_UNITS: &[&str] = &[
    "Mm", "Gm", "Tm", "Pm", "Mg", "Gg", "Tg", "Pg", "Mb", "Gb", "Tb", "Pb", "Eb", "Ml", "Gl", "Mbar",
    "Mbps", "Gbps", "Tbps", "Mt", "Gt",
];

pub(super) const UNITS: &[&str] = &[
    "km",
    "m",
    "cm",
    "mm",
    "mi",
    "mile",
    "miles",
    "ft",
    "feet",
    "foot",
    "inch",
    "inches",
    "yard",
    "yards",
    "metre",
    "metres",
    "meter",
    "meters",
    "kilometre",
    "kilometres",
    "kilometer",
    "kilometers",
    "kg",
    "g",
    "mg",
    "lb",
    "lbs",
    "oz",
    "ounce",
    "ounces",
    "gram",
    "grams",
    "kilogram",
    "kilograms",
    "pound",
    "pounds",
    "ton",
    "tons",
    "tonne",
    "tonnes",
    "l",
    "ml",
    "litre",
    "litres",
    "liter",
    "liters",
    "gallon",
    "gallons",
    "pint",
    "pints",
    "cup",
    "cups",
    "celsius",
    "fahrenheit",
    "kelvin",
    "c",
    "f",
    "degree",
    "degrees",
    "ms",
    "s",
    "sec",
    "second",
    "seconds",
    "min",
    "minute",
    "minutes",
    "h",
    "hr",
    "hour",
    "hours",
    "day",
    "days",
    "week",
    "weeks",
    "month",
    "months",
    "year",
    "years",
    "kb",
    "mb",
    "gb",
    "tb",
    "kib",
    "mib",
    "gib",
    "w",
    "kw",
    "mw",
    "kwh",
    "v",
    "mah",
    "hz",
    "khz",
    "mhz",
    "ghz",
    "bar",
    "psi",
    "pa",
    "kpa",
    "rpm",
    "usd",
    "eur",
    "gbp",
    "jpy",
    "cny",
    "chf",
    "dollar",
    "dollars",
    "euro",
    "euros",
    "cent",
    "cents",
    "pence",
    "yen",
    "percent",
    "per",
];

/// Words whose opposite shares every other word of a question. One word of a pair is
/// enough (`off` tells `on` from `off`), so the commonest (`in`, `on`, `to`) are left out.
#[rustfmt::skip]
pub(super) const OPPOSITES: &[&str] = &[
    "left", "right", "up", "down", "before", "after", "above", "below", "over", "under",
    "increase", "decrease", "more", "less", "fewer", "min", "minimum", "max", "maximum",
    "first", "last", "start", "stop", "end", "open", "close", "enable", "disable", "true",
    "false", "yes", "off", "out", "encrypt", "decrypt", "import", "export", "buy", "sell",
    "rent", "win", "lose", "add", "remove", "upgrade", "downgrade", "higher", "lower", "larger",
    "smaller", "faster", "slower", "advantages", "disadvantages", "pros", "cons", "junior",
    "senior", "formal", "informal", "soft", "hard", "north", "south", "east", "west",
    "yesterday", "today", "tomorrow", "old", "new",
];

/// Invisible characters (zero-width spaces and joiners, direction marks, variation
/// selectors, the soft hyphen): removed before reading, so they neither split nor join.
pub(super) fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
    )
}

/// Characters that end a segment (and, but for `,` and `、`, a sentence).
pub(super) fn is_break(c: char) -> bool {
    matches!(
        c,
        '.' | '?'
            | ';'
            | ':'
            | ','
            | '\n'
            | '…'
            | '¿'
            | '¡'
            | '。'
            | '？'
            | '！'
            | '；'
            | '：'
            | '，'
            | '、'
            | '؟'
            | '،'
            | '؛'
            | '।'
    )
}

/// A hyphen, dash or minus sign of any kind.
pub(super) fn is_dash(c: char) -> bool {
    matches!(
        c,
        '-' | '‐' | '‑' | '‒' | '–' | '—' | '―' | '−' | '－' | '﹣'
    )
}

/// Quotes, dashes and bullets: punctuation that separates words and means nothing by
/// itself in prose. In code, quotes are symbols (`'a'` is not `"a"`, `print('x')` is not
/// `print(x)`).
pub(super) fn is_quote_or_dash(c: char) -> bool {
    matches!(
        c,
        '\'' | '"'
            | '`'
            | '‘'
            | '’'
            | '‚'
            | '‛'
            | '“'
            | '”'
            | '„'
            | '‟'
            | '«'
            | '»'
            | '‹'
            | '›'
            | '「'
            | '」'
            | '『'
            | '』'
            | '《'
            | '》'
            | '〈'
            | '〉'
            | '–'
            | '—'
            | '―'
            | '·'
            | '•'
            | '‧'
            | '・'
    )
}

/// Characters that join two word characters into one token: `3.14`, `eu-west-1`,
/// `12:30`, `and/or`, `don't`.
pub(super) fn is_joiner(c: char) -> bool {
    matches!(c, '.' | '-' | ':' | '/' | '\'' | '’' | ',')
}

/// Letters, digits and the marks that belong to them (Thai tone marks, the Devanagari
/// virama, decomposed accents): `ข่าว` (news) is not `ข้าว` (rice).
pub(super) fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || is_combining_mark(c)
}
