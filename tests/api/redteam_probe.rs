//! Red-team findings on the cache agreement check (lexical embedder): an en dash or em
//! dash used as a minus sign is dropped as punctuation (`is_quote_or_dash`), so a
//! question about a negative number is answered from the cache with the positive one's
//! answer. Fails on the current code.
use sluice::cache::meaning;

fn hit(a: &str, b: &str) -> bool {
    let t = sluice::config::CacheSettings::default().similarity_threshold as f32;
    meaning::lexical_match(a, b, false, t)
}

#[test]
fn redteam_en_dash_minus_sign_is_not_dropped() {
    for (a, b) in [
        ("What is –3 × 4?", "What is 3 × 4?"),
        ("Is x > –1?", "Is x > 1?"),
        ("The temperature is –5 °C, do I need a coat?", "The temperature is 5 °C, do I need a coat?"),
        ("What is 10 – 3?", "What is 10 3?"),
    ] {
        assert!(!hit(a, b), "a false hit: {a} ~ {b}");
    }
}
