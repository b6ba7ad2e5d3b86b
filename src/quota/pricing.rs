//! Money arithmetic, all in integer micro-dollars. Prices are micro-dollars per million
//! tokens, one per token kind, and micro-dollars per thousand calls for server-tool fees.
//! A request costs
//! `ceil((Σ_kind tokens_kind × price_kind + calls × fee_per_1k × 1000) / 1 000 000)`,
//! rounded up once per request, in i128 and saturating. The reservation uses the same
//! formula on the worst case.

use crate::usage::Usage;

/// A model's prices in micro-dollars per million tokens (web search: per 1 000 calls).
/// The config's defaults (`PriceKeys::prices`) fill a kind the provider does not price
/// apart with the price it is billed at otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prices {
    /// Fresh input: neither read from nor written to the prompt cache, nor audio or image.
    pub input: i64,
    /// Text output (not reasoning, audio or image).
    pub output: i64,
    pub cached_input: i64,
    pub cache_write_5m: i64,
    pub cache_write_1h: i64,
    pub reasoning: i64,
    pub audio_input: i64,
    pub audio_output: i64,
    pub image_input: i64,
    pub image_output: i64,
    /// Micro-dollars per 1 000 web-search calls.
    pub web_search_per_1k_calls: i64,
}

impl Prices {
    /// Input and output prices, every other kind at the price it defaults to (see
    /// `PriceKeys::prices`), web search free.
    pub const fn plain(input: i64, output: i64) -> Prices {
        Prices {
            input,
            output,
            cached_input: input,
            cache_write_5m: input,
            cache_write_1h: input,
            reasoning: output,
            audio_input: input,
            audio_output: output,
            image_input: input,
            image_output: output,
            web_search_per_1k_calls: 0,
        }
    }

    /// These prices with fresh input at the dearest cache write `may` marks, when dearer:
    /// what the input the gateway counted itself costs when the upstream had the request
    /// and may have written all of it to its cache (a departure,
    /// `pipeline::long_context::priced_departed`). Audio is left out: the estimate counts an
    /// audio part's payload as text, already more tokens than its audio.
    pub fn written(self, may: InputKinds) -> Prices {
        let mut input = self.input;
        if may.cache_write_5m {
            input = input.max(self.cache_write_5m);
        }
        if may.cache_write_1h {
            input = input.max(self.cache_write_1h);
        }
        Prices { input, ..self }
    }

    /// The dearest price an input token of a request may be billed at: fresh input, and
    /// the cache-write and audio prices when the request may cause them (`InputKinds`).
    /// Cache reads, images and the rest never cost more than what the request says it
    /// may cause is priced at, unless their own price is higher: those count too.
    pub fn dearest_input(&self, may: InputKinds) -> i64 {
        let mut dearest = self.input.max(self.cached_input).max(self.image_input);
        if may.cache_write_5m {
            dearest = dearest.max(self.cache_write_5m);
        }
        if may.cache_write_1h {
            dearest = dearest.max(self.cache_write_1h);
        }
        if may.audio {
            dearest = dearest.max(self.audio_input);
        }
        dearest
    }

    /// The dearest price an output token may be billed at: text and reasoning always (a
    /// model may think without being asked), audio when the request asks for audio out,
    /// image output always (models that draw do so unasked).
    pub fn dearest_output(&self, audio: bool) -> i64 {
        let mut dearest = self.output.max(self.reasoning).max(self.image_output);
        if audio {
            dearest = dearest.max(self.audio_output);
        }
        dearest
    }
}

/// A long-context tier: once a request's whole input (fresh, cached, cache writes, audio,
/// images) passes `above` tokens, the provider bills every token of it at dearer rates —
/// each input kind × `input_permille` / 1 000, each output kind × `output_permille` / 1 000
/// (Claude Sonnet 4 / 4.5 and Gemini 2.5 Pro: 2× and 1.5× above 200 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongTier {
    pub above: i64,
    pub input_permille: i64,
    pub output_permille: i64,
}

impl Prices {
    /// The prices a request of `input` tokens is billed at: these, or past `tier`'s
    /// threshold its rates. A rate the factor makes fractional is rounded up to the next
    /// micro-dollar per million tokens (never below the bill); per-call fees are unchanged.
    pub fn for_input(self, input: i64, tier: Option<LongTier>) -> Prices {
        let Some(t) = tier.filter(|t| input > t.above) else {
            return self;
        };
        let by = times_permille;
        let (i, o) = (t.input_permille, t.output_permille);
        Prices {
            input: by(self.input, i),
            cached_input: by(self.cached_input, i),
            cache_write_5m: by(self.cache_write_5m, i),
            cache_write_1h: by(self.cache_write_1h, i),
            audio_input: by(self.audio_input, i),
            image_input: by(self.image_input, i),
            output: by(self.output, o),
            reasoning: by(self.reasoning, o),
            audio_output: by(self.audio_output, o),
            image_output: by(self.image_output, o),
            web_search_per_1k_calls: self.web_search_per_1k_calls,
        }
    }
}

impl Prices {
    /// Every rate, per-call fees included, × `permille` / 1 000, rounded up to the next
    /// micro-dollar where the factor makes it fractional (never below the bill): a
    /// provider's surcharge on the whole price (Bedrock's regional endpoints,
    /// `price_table::bedrock`).
    pub fn scaled(self, permille: i64) -> Prices {
        let by = |rate| times_permille(rate, permille);
        Prices {
            input: by(self.input),
            output: by(self.output),
            cached_input: by(self.cached_input),
            cache_write_5m: by(self.cache_write_5m),
            cache_write_1h: by(self.cache_write_1h),
            reasoning: by(self.reasoning),
            audio_input: by(self.audio_input),
            audio_output: by(self.audio_output),
            image_input: by(self.image_input),
            image_output: by(self.image_output),
            web_search_per_1k_calls: by(self.web_search_per_1k_calls),
        }
    }
}

/// `rate` × `permille` / 1 000, rounded up, in i128 and saturating.
fn times_permille(rate: i64, permille: i64) -> i64 {
    let scaled = i128::from(rate.max(0)) * i128::from(permille.max(0));
    i64::try_from((scaled + 999) / 1000).unwrap_or(i64::MAX)
}

/// What a request may make the upstream bill beyond plain input, read from the request
/// (`pipeline::kinds`): prompt-cache writes at each lifetime, audio in or out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InputKinds {
    pub cache_write_5m: bool,
    pub cache_write_1h: bool,
    pub audio: bool,
}

/// A usage split into disjoint parts, each priced once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Parts {
    pub fresh_input: i64,
    pub cached_input: i64,
    pub cache_write_5m: i64,
    pub cache_write_1h: i64,
    pub audio_input: i64,
    pub image_input: i64,
    pub text_output: i64,
    pub reasoning: i64,
    pub audio_output: i64,
    pub image_output: i64,
    pub web_search_calls: i64,
}

/// Takes each part from `total` in order, each clamped to what is left (never negative);
/// returns the parts and what is left (the plain tokens).
fn split<const N: usize>(total: i64, parts: [i64; N]) -> ([i64; N], i64) {
    let mut left = total.max(0);
    let taken = parts.map(|p| {
        let p = p.clamp(0, left);
        left -= p;
        p
    });
    (taken, left)
}

impl Usage {
    /// The usage to price for a request that may cause the writes `may` says: writes the
    /// upstream did not split by lifetime are one-hour writes when the request marked any
    /// one-hour write (the worst case: they may all be), five-minute ones otherwise.
    pub fn at_worst_lifetime(mut self, may: InputKinds) -> Usage {
        if may.cache_write_1h {
            let moved = self
                .cache_write_unsplit
                .clamp(0, self.cache_write_5m.max(0));
            self.cache_write_5m -= moved;
            self.cache_write_1h = self.cache_write_1h.saturating_add(moved);
        }
        self.cache_write_unsplit = 0;
        self
    }

    /// The disjoint parts: input into cached, 5-minute writes, 1-hour writes, audio,
    /// image (each clamped, in that order, to what the earlier ones left of `input`) and
    /// fresh — the rest; output into reasoning, audio, image and text likewise. An
    /// upstream that reports more parts than its total is billed its total, never twice.
    pub fn parts(&self) -> Parts {
        let ([cached_input, cache_write_5m, cache_write_1h, audio_input, image_input], fresh_input) =
            split(
                self.input,
                [
                    self.cached_input,
                    self.cache_write_5m,
                    self.cache_write_1h,
                    self.audio_input,
                    self.image_input,
                ],
            );
        let ([reasoning, audio_output, image_output], text_output) = split(
            self.output,
            [self.reasoning, self.audio_output, self.image_output],
        );
        Parts {
            fresh_input,
            cached_input,
            cache_write_5m,
            cache_write_1h,
            audio_input,
            image_input,
            text_output,
            reasoning,
            audio_output,
            image_output,
            web_search_calls: self.web_search_calls.max(0),
        }
    }
}

const PER_MTOK: i128 = 1_000_000;

/// Calls per thousand, the unit of a per-call fee.
const CALLS_PER_FEE: i128 = 1_000;

/// The cost of `usage`, rounded up once: every part at its price, summed, then divided.
/// i128 inside and saturating: no overflow for any count or price.
pub fn cost(usage: Usage, p: Prices) -> i64 {
    let u = usage.parts();
    let priced = [
        (u.fresh_input, p.input),
        (u.cached_input, p.cached_input),
        (u.cache_write_5m, p.cache_write_5m),
        (u.cache_write_1h, p.cache_write_1h),
        (u.audio_input, p.audio_input),
        (u.image_input, p.image_input),
        (u.text_output, p.output),
        (u.reasoning, p.reasoning),
        (u.audio_output, p.audio_output),
        (u.image_output, p.image_output),
    ];
    let tokens = priced.iter().fold(0i128, |sum, &(n, price)| {
        sum.saturating_add(i128::from(n).saturating_mul(i128::from(price.max(0))))
    });
    let fees = i128::from(u.web_search_calls)
        .saturating_mul(i128::from(p.web_search_per_1k_calls.max(0)))
        .saturating_mul(PER_MTOK / CALLS_PER_FEE);
    let numer = tokens.saturating_add(fees);
    let micros = numer / PER_MTOK + i128::from(numer % PER_MTOK != 0);
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// The reservation's input side: the tokenizer's count plus the configured margin
/// (`× ratio + tokens`), rounded up.
pub fn input_with_margin(counted: i64, ratio: f64, extra_tokens: u32) -> i64 {
    // Ratio in thousandths keeps the margin in integer arithmetic.
    let permille = (ratio * 1000.0).round() as i64;
    // Saturating: a client's tool caps may make `counted` as large as i64 allows.
    let padded = i128::from(counted.max(0)) * i128::from(permille.max(0)) + 999;
    i64::try_from(padded / 1000)
        .unwrap_or(i64::MAX)
        .saturating_add(i64::from(extra_tokens))
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
    fn unsplit_writes_are_one_hour_writes_when_the_request_marked_one() {
        let u = Usage {
            input: 100,
            cache_write_5m: 50,
            cache_write_1h: 10,
            cache_write_unsplit: 40,
            ..Usage::default()
        };
        let hour = InputKinds {
            cache_write_1h: true,
            ..InputKinds::default()
        };
        let at = |may| {
            let u = u.at_worst_lifetime(may);
            (u.cache_write_5m, u.cache_write_1h, u.cache_write_unsplit)
        };
        assert_eq!(at(hour), (10, 50, 0));
        assert_eq!(at(InputKinds::default()), (50, 10, 0));
    }
    use proptest::prelude::*;

    fn mini() -> Prices {
        Prices {
            cached_input: 75_000,
            ..Prices::plain(150_000, 600_000)
        }
    }

    #[test]
    fn rounds_up_once_per_request() {
        let p = mini();
        let io = |input, cached_input, output| Usage {
            input,
            cached_input,
            output,
            ..Usage::default()
        };
        // 1000 × 0.15 + 500 × 0.60 = 150 000 000 + 300 000 000 → 450 micros exactly.
        assert_eq!(cost(io(1000, 0, 500), p), 450);
        // 1 token in: 0.15 micros → 1.
        assert_eq!(cost(io(1, 0, 0), p), 1);
        assert_eq!(cost(Usage::default(), p), 0);
        assert_eq!(cost(io(1000, 1000, 0), p), 75);
        let dear = Prices::plain(150_000, 2_000_000);
        assert_eq!(
            cost(
                Usage {
                    input: i64::MAX,
                    output: i64::MAX,
                    web_search_calls: i64::MAX,
                    ..Usage::default()
                },
                Prices {
                    web_search_per_1k_calls: i64::MAX,
                    ..dear
                }
            ),
            i64::MAX,
            "saturates"
        );
    }

    /// Past a long-context tier every token of the request is billed at the tier's rates
    /// (Anthropic: 250 000 in, 2 000 out on Sonnet 4 cost 1.50 + 0.045 USD), cache reads
    /// and writes counting towards the threshold and scaled alike; at the threshold itself
    /// the standard rates hold.
    #[test]
    fn past_a_long_context_tier_every_token_is_billed_at_its_rates() {
        let sonnet = Prices {
            cache_write_5m: 3_750_000,
            cached_input: 300_000,
            web_search_per_1k_calls: 10_000_000,
            ..Prices::plain(3_000_000, 15_000_000)
        };
        let long = LongTier {
            above: 200_000,
            input_permille: 2_000,
            output_permille: 1_500,
        };
        let tier = Some(long);
        let io = |input, cached_input| Usage {
            input,
            cached_input,
            output: 2_000,
            web_search_calls: 1,
            ..Usage::default()
        };
        let at = |u: Usage| cost(u, sonnet.for_input(u.input, tier));
        // 250 000 × 6 + 2 000 × 22.50 + 10 000 (one search, unscaled).
        assert_eq!(at(io(250_000, 0)), 1_500_000 + 45_000 + 10_000);
        // 200 000 × 3 + 2 000 × 15 + 10 000: not past it.
        assert_eq!(at(io(200_000, 0)), 600_000 + 30_000 + 10_000);
        // Cache reads count towards the threshold and are doubled: 150 000 reads at 0.60,
        // 60 000 fresh at 6.
        assert_eq!(at(io(210_000, 150_000)), 90_000 + 360_000 + 45_000 + 10_000);
        assert_eq!(
            sonnet.for_input(i64::MAX, None),
            sonnet,
            "no tier, no change"
        );
        // A factor that makes a rate fractional rounds the rate up: 0.000001 × 1.5.
        let tiny = Prices::plain(1, 1).for_input(2, Some(LongTier { above: 1, ..long }));
        assert_eq!((tiny.input, tiny.output), (2, 2));
    }

    /// A surcharge on the whole price scales every rate and fee, each rounded up on its own.
    #[test]
    fn a_price_scaled_is_rounded_up_per_rate() {
        let p = Prices {
            cached_input: 3,
            web_search_per_1k_calls: 10_000_000,
            ..Prices::plain(3_000_000, 15)
        };
        let s = p.scaled(1_100);
        // 3 000 000 × 1.1 exactly; 15 × 1.1 = 16.5 → 17; 3 × 1.1 = 3.3 → 4.
        assert_eq!((s.input, s.output, s.cached_input), (3_300_000, 17, 4));
        assert_eq!((s.reasoning, s.image_input), (17, 3_300_000));
        assert_eq!(s.web_search_per_1k_calls, 11_000_000);
        assert_eq!(p.scaled(1_000), p, "1 × changes nothing");
        assert_eq!(Prices::plain(i64::MAX, 0).scaled(1_100).input, i64::MAX);
    }

    /// Claude Sonnet: 3 USD per Mtok input, 3.75 five-minute writes, 6 one-hour writes,
    /// 0.30 reads, 15 output, 10 USD per 1 000 searches.
    #[test]
    fn every_kind_at_its_own_price() {
        let sonnet = Prices {
            cache_write_5m: 3_750_000,
            cache_write_1h: 6_000_000,
            cached_input: 300_000,
            web_search_per_1k_calls: 10_000_000,
            ..Prices::plain(3_000_000, 15_000_000)
        };
        let u = Usage {
            // 1 000 uncached + 20 000 read + 2 000 five-minute + 3 000 one-hour writes.
            input: 26_000,
            cached_input: 20_000,
            cache_write_5m: 2_000,
            cache_write_1h: 3_000,
            output: 500,
            web_search_calls: 2,
            ..Usage::default()
        };
        // 1000×3 + 20000×0.30 + 2000×3.75 + 3000×6 + 500×15 = 3000+6000+7500+18000+7500
        // = 42 000 micros of tokens; 2 searches × 10 000 micros = 20 000.
        assert_eq!(cost(u, sonnet), 62_000);
        // gpt-4o-mini: 1001 prompt tokens, 500 of them cached, 7 out:
        // 501×0.15 + 500×0.075 + 7×0.60 = 75.15 + 37.5 + 4.2 = 116.85 → 117.
        let u = Usage {
            input: 1001,
            cached_input: 500,
            output: 7,
            ..Usage::default()
        };
        assert_eq!(cost(u, mini()), 117);
        // Reasoning, audio and images at their own prices.
        let p = Prices {
            reasoning: 1_000_000,
            audio_input: 10_000_000,
            audio_output: 20_000_000,
            image_input: 5_000_000,
            image_output: 40_000_000,
            ..Prices::plain(100_000, 400_000)
        };
        let u = Usage {
            input: 1_000,
            audio_input: 100,
            image_input: 200,
            output: 1_000,
            reasoning: 300,
            audio_output: 10,
            image_output: 20,
            ..Usage::default()
        };
        // in: 700×0.1 + 100×10 + 200×5 = 70 + 1000 + 1000; out: 670×0.4 + 300×1 + 10×20
        // + 20×40 = 268 + 300 + 200 + 800 → 3638.
        assert_eq!(cost(u, p), 3_638);
    }

    #[test]
    fn parts_never_overlap_nor_go_negative() {
        // More cached than input: all of it cached, nothing fresh, nothing negative.
        let u = Usage {
            input: 100,
            cached_input: 150,
            cache_write_5m: 50,
            output: 10,
            reasoning: 40,
            ..Usage::default()
        };
        let parts = u.parts();
        assert_eq!(
            (parts.cached_input, parts.cache_write_5m, parts.fresh_input),
            (100, 0, 0)
        );
        assert_eq!((parts.reasoning, parts.text_output), (10, 0));
        // 100 × 0.075 + 10 × 0.60 = 13.5 → 14: the input billed once, at the cached price.
        assert_eq!(cost(u, mini()), 14);
        let negative = Usage {
            input: -5,
            cached_input: -3,
            output: -1,
            web_search_calls: -2,
            ..Usage::default()
        };
        assert_eq!(negative.parts(), Parts::default());
        assert_eq!(cost(negative, mini()), 0);
        // Parts in order: a write beyond what the cache read left is clamped.
        let u = Usage {
            input: 10,
            cached_input: 6,
            cache_write_5m: 3,
            cache_write_1h: 5,
            ..Usage::default()
        };
        let parts = u.parts();
        assert_eq!(
            (
                parts.cached_input,
                parts.cache_write_5m,
                parts.cache_write_1h,
                parts.fresh_input
            ),
            (6, 3, 1, 0)
        );
    }

    fn usage() -> impl Strategy<Value = Usage> {
        let n = || 0i64..2_000_000;
        (
            (n(), n(), n(), n(), n(), n()),
            (n(), n(), n(), n(), n(), 0i64..1_000),
        )
            .prop_map(|((i, c, w5, w1, ai, ii), (o, r, ao, io, _, s))| Usage {
                input: i,
                cached_input: c,
                cache_write_5m: w5,
                cache_write_1h: w1,
                cache_write_unsplit: 0,
                audio_input: ai,
                image_input: ii,
                output: o,
                reasoning: r,
                audio_output: ao,
                image_output: io,
                web_search_calls: s,
            })
    }

    fn prices() -> impl Strategy<Value = Prices> {
        let p = || 0i64..100_000_000;
        ((p(), p(), p(), p(), p(), p()), (p(), p(), p(), p(), p())).prop_map(
            |((i, o, c, w5, w1, r), (ai, ao, ii, io, s))| Prices {
                input: i,
                output: o,
                cached_input: c,
                cache_write_5m: w5,
                cache_write_1h: w1,
                reasoning: r,
                audio_input: ai,
                audio_output: ao,
                image_input: ii,
                image_output: io,
                web_search_per_1k_calls: s,
            },
        )
    }

    proptest! {
        /// More of any total, or of any call count, never costs less; and the cost is at
        /// least each part priced alone, rounded down (no part is lost in the sum).
        #[test]
        fn cost_is_monotone_and_covers_every_part(u in usage(), p in prices(), more in 1i64..10_000) {
            let base = cost(u, p);
            for grown in [
                Usage { input: u.input + more, ..u },
                Usage { output: u.output + more, ..u },
                Usage { web_search_calls: u.web_search_calls + more, ..u },
            ] {
                prop_assert!(cost(grown, p) >= base);
            }
            let parts = u.parts();
            let floor = |n: i64, price: i64| i128::from(n) * i128::from(price) / PER_MTOK;
            for (n, price) in [
                (parts.fresh_input, p.input),
                (parts.cached_input, p.cached_input),
                (parts.cache_write_5m, p.cache_write_5m),
                (parts.cache_write_1h, p.cache_write_1h),
                (parts.audio_input, p.audio_input),
                (parts.image_input, p.image_input),
                (parts.text_output, p.output),
                (parts.reasoning, p.reasoning),
                (parts.audio_output, p.audio_output),
                (parts.image_output, p.image_output),
            ] {
                prop_assert!(i128::from(base) >= floor(n, price));
            }
            let fees = i128::from(parts.web_search_calls) * i128::from(p.web_search_per_1k_calls) / 1_000;
            prop_assert!(i128::from(base) >= fees);
            // The parts are the totals: nothing billed twice, nothing dropped.
            prop_assert_eq!(
                parts.fresh_input + parts.cached_input + parts.cache_write_5m
                    + parts.cache_write_1h + parts.audio_input + parts.image_input,
                u.input
            );
            prop_assert_eq!(
                parts.text_output + parts.reasoning + parts.audio_output + parts.image_output,
                u.output
            );
        }

        /// A part moved to a dearer kind never lowers the cost: pricing every input token at
        /// the dearest input price covers any split (the reservation's rule).
        #[test]
        fn the_dearest_rate_covers_every_split(u in usage(), p in prices()) {
            let may = InputKinds { cache_write_5m: true, cache_write_1h: true, audio: true };
            let worst = Prices {
                input: p.dearest_input(may),
                output: p.dearest_output(true),
                web_search_per_1k_calls: p.web_search_per_1k_calls,
                ..Prices::default()
            };
            let plain = Usage {
                input: u.input,
                output: u.output,
                web_search_calls: u.web_search_calls,
                ..Usage::default()
            };
            prop_assert!(cost(plain, worst) >= cost(u, p));
        }
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
