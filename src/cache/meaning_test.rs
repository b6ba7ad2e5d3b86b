//! The agreement check on single pairs; the evaluation set is `tests/api/cache_precision.rs`.

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
    assert_eq!(normalised(&tokens("Don't stop!", false)), "do not stop");
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

/// Where case names a unit or a flag, it is read (s31 cache attack F1); elsewhere title
/// case, a sentence's start and shouting still agree.
#[test]
fn case_that_names_a_unit_or_a_flag_is_read() {
    for (a, b) in [
        ("Convert 100 Mbps to MBps", "Convert 100 MBps to Mbps"),
        (
            "How long for 10 GB at 50 MBps?",
            "How long for 10 GB at 50 Mbps?",
        ),
        ("What is 5 MHz in Hz?", "What is 5 mHz in Hz?"),
        (
            "How many kB is a 64 kb buffer?",
            "How many kb is a 64 kB buffer?",
        ),
        ("Convert 3 Mm to km", "Convert 3 mm to km"),
        ("What does ls -R do?", "What does ls -r do?"),
        ("What does grep -I do?", "What does grep -i do?"),
        ("ssh -L vs ssh -l", "ssh -l vs ssh -L"),
        ("Download 5Gb at once", "Download 5gb at once"),
        ("Convert 5Mm to km", "Convert 5mm to km"),
        ("Is 5 Mbar a lot?", "Is 5 mbar a lot?"),
        ("What does ls -Rt do?", "What does ls -rt do?"),
        ("ssh -Nf host", "ssh -nf host"),
        // A prefixed unit keeps its case with no number before it (s31 stop attack C1).
        ("Convert Mm to mm", "Convert mm to Mm"),
        ("How many mg are in a Mg?", "How many Mg are in a mg?"),
        ("How many mm are in a Mm?", "How many Mm are in a mm?"),
        ("How many Gb in a Tb?", "How many gb in a tb?"),
        // A flag opened by any dash (pasted from a word processor) is a flag (C2).
        ("What does ls –R do?", "What does ls –r do?"),
        ("What does grep −I do?", "What does grep −i do?"),
        ("What does cp ‐R do?", "What does cp ‐r do?"),
        ("What does ssh —L do?", "What does ssh —l do?"),
        // In a compound, with a superscript, after a bracket or quote (s32 diff attack F1/F2).
        ("How many mm² are in a Mm²?", "How many Mm² are in a mm²?"),
        ("Convert Mm/s to mm/s", "Convert mm/s to Mm/s"),
        ("Is 5 Mg/day of CO2 a lot?", "Is 5 mg/day of CO2 a lot?"),
        ("Is 3 Pg of carbon a lot?", "Is 3 pg of carbon a lot?"),
        ("What does ls (–R) do?", "What does ls (–r) do?"),
        ("What does ls \"–R\" do?", "What does ls \"–r\" do?"),
        ("What does grep (−I) do?", "What does grep (−i) do?"),
        ("What does ls －R do?", "What does ls －r do?"),
    ] {
        for strict in [true, false] {
            assert!(!agree(a, b, strict, false), "{a} / {b} (strict {strict})");
        }
    }
    for (a, b) in [
        (
            "Give me a recipe for banana bread.",
            "Give Me A Recipe For Banana Bread.",
        ),
        (
            "What is the capital of Australia?",
            "WHAT IS THE CAPITAL OF AUSTRALIA?",
        ),
        ("CONVERT 3 MM TO KM", "convert 3 mm to km"),
        ("What does ls -r do?", "what does ls -r do?"),
        ("What does ls –R do?", "What does ls -R do?"),
        ("What does ls (–R) do?", "What does ls (-R) do?"),
        ("What does grep (−I) do?", "What does grep (-I) do?"),
    ] {
        assert!(agree(a, b, true, false), "{a} / {b}");
    }
}

#[test]
fn filler_is_dropped_only_where_it_cannot_be_the_question() {
    assert!(
        tokens("Thanks! Hi there.", false).is_empty(),
        "greetings alone"
    );
    assert!(!agree(
        "How do you say thank you in Japanese?",
        "How do you say hello in Japanese?",
        true,
        false
    ));
    assert!(!agree(
        "What is my name?",
        "What is your name?",
        false,
        false
    ));
    assert!(!agree(
        "Can dogs eat grapes?",
        "Do dogs eat grapes?",
        false,
        false
    ));
    assert!(agree(
        "How can I undo it?",
        "How do I undo it?",
        true,
        false
    ));
    assert!(!agree("How can it work?", "How does it work?", true, false));
    assert!(agree("Can you explain X?", "Explain X please", true, false));
    assert!(!agree(
        "Is IT a good career?",
        "Is it a good career?",
        true,
        false
    ));
}

/// The hard negatives of attack cache #1: a greeting after a colon or a comma is what the
/// sentence names (strictly read: to an http embedder greetings are words it judges), `!`
/// after a digit is a factorial, and `.5` is not `5` (significant to either reading).
#[test]
fn the_object_of_a_sentence_a_factorial_and_a_leading_dot_are_read() {
    for (a, b) in [
        (
            "Translate into German: thank you.",
            "Translate into German: hello.",
        ),
        (
            "Translate into German: please",
            "Translate into German: cheers",
        ),
        (
            "Translate into German, thank you.",
            "Translate into German, hello.",
        ),
        ("Translate into German: ok", "Translate into German."),
        // A line break after the colon (parts of a message are joined by one), or a `;`,
        // introduces what follows the same way (s24 attack on the day's diff, #1).
        (
            "Translate into German:\nthank you",
            "Translate into German:\nhello",
        ),
        (
            "Translate into German: \n  thank you",
            "Translate into German:\nhello",
        ),
        (
            "Translate into German; thank you.",
            "Translate into German; hello.",
        ),
        // Every line a colon introduces, numbered or not (s24 attack on the fixes, F3).
        (
            "Translate each word into German:\nhello\nthank you",
            "Translate each word into German:\nhello",
        ),
        (
            "Translate into German:\n1. hello\n2. thanks",
            "Translate into German:\n1. please\n2. cheers",
        ),
    ] {
        assert!(!agree(a, b, true, false), "{a} / {b}");
    }
    for (a, b) in [
        ("What is 4! + 1?", "What is 4 + 1?"),
        ("Is 20! divisible by 7?", "Is 20 divisible by 7?"),
        ("Is .5 greater than .25?", "Is 5 greater than 25?"),
    ] {
        for strict in [true, false] {
            assert!(!agree(a, b, strict, false), "{a} / {b} (strict: {strict})");
        }
    }
    // Filler around them is still filler.
    for (a, b) in [
        (
            "Hello! Translate into German: good morning. Thanks!",
            "Translate into German: good morning",
        ),
        ("Why is the sky blue? Thanks, cheers", "Why is the sky blue"),
        (
            "Hi, why is the sky blue, please? Thanks",
            "Why is the sky blue?",
        ),
        ("Is 5 prime? Thanks!", "Is 5 prime"),
    ] {
        assert!(agree(a, b, true, false), "{a} / {b}");
    }
}

#[test]
fn every_character_that_can_change_a_question_is_read() {
    assert!(!agree(
        "Convert ₹500 to USD",
        "Convert ₽500 to USD",
        true,
        false
    ));
    assert!(!agree("Is 3 ≤ 4?", "Is 3 ≥ 4?", true, false));
    assert!(!agree(
        "Is 🍕 better than 🍔?",
        "Is 🍔 better than 🍕?",
        true,
        false
    ));
    assert!(!agree("5'", "5\"", true, false), "feet and inches");
    assert!(!agree("ข่าว", "ข้าว", true, false), "a Thai tone mark");
    assert!(agree("re\u{301}sume\u{301}", "résumé", true, false), "NFC");
    assert!(
        agree("zero\u{200b}width", "zerowidth", true, false),
        "invisible"
    );
    let moved = |indent: &str| format!("for x in xs:\n    if x:\n        f(x)\n{indent}g(x)");
    assert!(
        !agree(&moved("    "), &moved("        "), true, false),
        "indentation"
    );
    assert!(
        !agree("print('x')", "print(x)", true, false),
        "quotes in code"
    );
    assert!(
        !agree("Is `String s` valid?", "Is `string s` valid?", true, false),
        "case in code"
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
