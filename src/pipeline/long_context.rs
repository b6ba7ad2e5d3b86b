//! Long-context tiers: some models cost more per token once a prompt passes a threshold
//! (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro above 200 000 input tokens, the bundled price
//! table's `long_context_above_tokens`). No request is refused for it: the reservation
//! prices the tier wherever the provider's tokenizer may count the reserved input — with
//! the margin, its documents at the model's whole input, a server-tool turn's every step —
//! past a candidate's threshold (`provider_may_count`, `pipeline::reservation_amount`), and
//! a request that ends before its answer without its input reported is charged the
//! reserved input — within the window Claude keeps there (`Reader::bound`; the reservation
//! keeps none, `Reader::reserving`) — with its tier decided the same way
//! (`priced_departed`), an answer without
//! its input reported is charged the estimate with its tier decided so too (`priced_counted`), and
//! an answer is priced from the input it reports (`priced`): one the provider counted past
//! the threshold though the gateway counted below it is priced at the tier's rates, and
//! what passes the reservation is absorbed and shown as such, never lost from the ledger.

use crate::config::price_table::Family;
use crate::config::Provider;
use crate::quota::pricing::{self, InputKinds, LongTier, Prices};
use crate::usage::Usage;

/// How much more a model family's tokenizer may count than the gateway's (o200k) estimate,
/// in percent. A reservation whose input could pass a tier's threshold counted so is priced
/// at the tier, so a prompt the provider counts past it is covered. Claude's tokenizer
/// counts up to ~1.35× o200k on code and non-English text (more with its newer tokenizer):
/// 150 — and so for any other family (OpenAI's own models count with o200k and have no
/// bundled tier; an unknown model's tokenizer may be Claude's). Gemini's (a 256k-token vocabulary,
/// larger than o200k's) counts words about as o200k does, a little more on some scripts:
/// 125, so a Gemini prompt well under its threshold is not reserved at the dearer tier for
/// a count Gemini never reaches — but it makes each digit a token, which no flat factor
/// covers: its digits are counted on top (`beyond_the_estimate`).
fn counts_up_to_percent(family: Family) -> i64 {
    match family {
        Family::Gemini => 125,
        Family::Claude | Family::Openai | Family::Unknown => 150,
    }
}

/// What `family`'s tokenizer counts beyond the gateway's estimate whatever its factor, for
/// a request whose counted text holds `digits` ASCII digits (`Prepared::input_digits`): on
/// Gemini — served by Google or through any other wire format — one token for each: its
/// SentencePiece tokenizer splits every digit, where o200k takes up to three in one token,
/// so a digit-heavy prompt counts ~3× there (the o200k tokens of those digits are left in
/// the estimate: a margin, never a shortfall). Added to the input a Gemini route is
/// reserved for (`Prepared::reserved_input_on`).
pub fn beyond_the_estimate(family: Family, digits: i64) -> i64 {
    match family {
        Family::Gemini => digits.max(0),
        Family::Claude | Family::Openai | Family::Unknown => 0,
    }
}

/// The largest window a Gemini model has served (Gemini 1.5 Pro's 2 097 152 tokens; 2.5 Pro
/// takes 1 048 576): past it Gemini refuses a prompt and bills nothing, so no digit count a
/// Gemini bills is longer, whatever the model's configured input.
pub const GEMINI_LARGEST_WINDOW: i64 = 2_097_152;

/// Who reads a request's input on a candidate: its model family's tokenizer on its
/// provider, and the longest prompt the provider serves there, if the model's configured
/// input is not it (`Prepared::reader`).
#[derive(Clone, Copy, Debug)]
pub struct Reader {
    pub family: Family,
    pub provider: Provider,
    window: Option<i64>,
}

impl Reader {
    /// The reader of a route serving `family` on `provider`, whose model keeps `window`
    /// without Claude's 1M beta (`Route::window`, from the bundled table: Claude up to 4.5,
    /// 200 000 tokens), for a request that did or did not turn the 1M window on: the window
    /// holds on Anthropic unless the request turned it on, on Bedrock always (the beta is
    /// forwarded to Anthropic only). Elsewhere — a router, an Anthropic-format server of
    /// another family — and for a model the table does not name, no window is known but
    /// the model's.
    pub fn new(family: Family, provider: Provider, window: Option<i64>, claude_1m: bool) -> Reader {
        let kept = match provider {
            Provider::Anthropic => !claude_1m,
            Provider::Bedrock => true,
            _ => false,
        };
        Reader {
            family,
            provider,
            window: window.filter(|_| kept),
        }
    }

    /// `input` as much of it as the provider serves, and so may bill: a departure or an
    /// estimate past Claude's window is of a prompt Claude refuses.
    pub fn bound(self, input: i64) -> i64 {
        self.window.map_or(input, |w| input.min(w))
    }

    /// This reader as a reservation reads: without the window. The window is the gateway's
    /// inference from a name and a header, and what serves the route may not keep it — an
    /// Anthropic-format proxy that turns the 1M window on itself — so the worst case is the
    /// model's configured input. What a request is charged without the provider's count (a
    /// departure, an estimate) is bounded: behind such a proxy what it bills beyond the
    /// window is neither charged nor seen (docs/DESIGN.md, "Long-context tiers").
    pub fn reserving(self) -> Reader {
        Reader {
            window: None,
            ..self
        }
    }
}

/// The most input `reader` may bill for `input` of the gateway's estimate: the estimate ×
/// its tokenizer's factor, within the window the provider serves (`Reader::bound`). A tier
/// above that window is out of reach there.
pub fn provider_may_count(reader: Reader, input: i64) -> i64 {
    let percent = counts_up_to_percent(reader.family);
    let most = i128::from(input.max(0)) * i128::from(percent) / 100;
    reader.bound(i64::try_from(most).unwrap_or(i64::MAX))
}

/// What `usage` costs at `prices`: at the route's long-context `tier` when the reported
/// input passes its threshold (warned: the estimate fell short of the provider's count).
pub fn priced(usage: Usage, prices: Prices, tier: Option<LongTier>) -> i64 {
    let billed = prices.for_input(usage.input, tier);
    if billed != prices {
        tracing::warn!(
            input = usage.input,
            threshold = tier.map_or(0, |t| t.above),
            "an answer reported input past its model's long-context threshold: priced at the \
             dearer tier"
        );
    }
    pricing::cost(usage, billed)
}

/// What `usage` costs at `prices` when its input is the gateway's own count, not the
/// provider's (an answer whose usage left its input out, charged the estimate; a request
/// that ended before its answer, charged the input reserved for it: `priced_departed`): at
/// the route's long-context `tier` when the provider's tokenizer may count that input past
/// its threshold (`provider_may_count`) — the tier decided as the reservation decides it,
/// on an input no larger than the reservation's, so never dearer than the reservation.
pub fn priced_counted(usage: Usage, prices: Prices, tier: Option<LongTier>, reader: Reader) -> i64 {
    let tier_at = provider_may_count(reader, usage.input);
    pricing::cost(usage, prices.for_input(tier_at, tier))
}

/// A departure's cost (`priced_counted` of the reserved input), at the dearest cache write
/// the request marked (`may`) when dearer than the input rate: a provider bills a marked
/// prompt it processed at the write rate, and the reservation held it
/// (`Prices::dearest_input`). An answer that came is not priced so: whether it wrote or
/// read the cache is in the usage it left out, and the input rate is between the two.
pub fn priced_departed(
    usage: Usage,
    (prices, may): (Prices, InputKinds),
    tier: Option<LongTier>,
    reader: Reader,
) -> i64 {
    priced_counted(usage, prices.written(may), tier, reader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_much_more_a_provider_may_count_follows_its_tokenizer() {
        use Family::{Claude, Gemini, Openai, Unknown};
        use Provider::{Anthropic, Bedrock, OpenaiCompatible};
        // (family, provider, the 1M window on, the gateway's count, the most it bills)
        let cases = [
            // Claude's tokenizer, wherever it is served (Anthropic, Bedrock, a router).
            (Claude, Anthropic, true, 200_000, 300_000),
            (Claude, OpenaiCompatible, false, 200_000, 300_000),
            // Within Claude's 200 000-token window unless the request turned 1M on;
            // Bedrock is never sent the beta.
            (Claude, Anthropic, false, 200_000, 200_000),
            (Claude, Anthropic, false, 100_000, 150_000),
            (Claude, Bedrock, false, 200_000, 200_000),
            (Claude, Bedrock, true, 200_000, 200_000),
            // Gemini's, wherever it is served: no Claude window on Anthropic's wire.
            (Gemini, Provider::Gemini, false, 200_000, 250_000),
            (Gemini, OpenaiCompatible, false, 200_000, 250_000),
            (Gemini, Anthropic, false, 200_000, 250_000),
            (Gemini, Provider::Gemini, false, i64::MAX, i64::MAX),
            (Openai, Provider::Openai, false, 200_000, 300_000),
            // A model no name places has no Claude window, on Bedrock too.
            (Unknown, Bedrock, false, 300_000, 450_000),
            (Unknown, Anthropic, false, 300_000, 450_000),
            (Claude, Anthropic, true, -5, 0),
        ];
        // Every Claude here keeps the window as Claude up to 4.5 does (`Route::window`).
        for (family, provider, claude_1m, input, most) in cases {
            let window = (family == Claude).then_some(200_000);
            let reader = Reader::new(family, provider, window, claude_1m);
            assert_eq!(
                provider_may_count(reader, input),
                most,
                "{family:?} on {provider:?}, 1M={claude_1m}: {input}"
            );
        }
    }

    /// Claude 4.6 and later serve their whole window without the beta: no window is known
    /// for a model the bundled table gives none (review finding, s18).
    #[test]
    fn a_claude_without_a_window_in_the_table_is_read_unbounded() {
        let reader = Reader::new(Family::Claude, Provider::Anthropic, None, false);
        assert_eq!(provider_may_count(reader, 200_000), 300_000);
        assert_eq!(reader.bound(900_000), 900_000);
    }

    #[test]
    fn only_gemini_counts_each_digit_beyond_the_estimate() {
        assert_eq!(beyond_the_estimate(Family::Gemini, 240_000), 240_000);
        assert_eq!(beyond_the_estimate(Family::Gemini, -1), 0);
        for f in [Family::Claude, Family::Openai, Family::Unknown] {
            assert_eq!(beyond_the_estimate(f, 240_000), 0, "{f:?}");
        }
    }
}
