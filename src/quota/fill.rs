//! Which kinds a price states, and how a kind it does not state is filled. A price names
//! its input and output; any other kind it leaves out is taken, in order, from the next
//! layer of the route's schedule that states it (`schedule`) — raised to the same multiple
//! of a dearer input or output rate, so a surcharged rate is not billed the cheaper layer's
//! cache writes — then — on a route Anthropic
//! bills — from Anthropic's published multipliers of the input price, and only then from
//! the price it falls under within the price (`within_price`). So a config written with
//! input and output only never bills a one-hour cache write at the input price or a web
//! search at zero where the bundled table or the provider's rule says otherwise.

use super::pricing::Prices;

/// The kinds a price may leave out (input and output it always states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    CachedInput,
    CacheWrite5m,
    CacheWrite1h,
    Reasoning,
    AudioInput,
    AudioOutput,
    ImageInput,
    ImageOutput,
    WebSearch,
}

impl Kind {
    /// Every kind, each after the kind it falls under within a price (5-minute writes
    /// before 1-hour ones).
    pub const ALL: [Kind; 9] = [
        Kind::CachedInput,
        Kind::CacheWrite5m,
        Kind::CacheWrite1h,
        Kind::Reasoning,
        Kind::AudioInput,
        Kind::AudioOutput,
        Kind::ImageInput,
        Kind::ImageOutput,
        Kind::WebSearch,
    ];

    /// The name of the kind in the stored admin row (`store::prices`).
    pub fn key(self) -> &'static str {
        match self {
            Kind::CachedInput => "cached_input",
            Kind::CacheWrite5m => "cache_write_5m",
            Kind::CacheWrite1h => "cache_write_1h",
            Kind::Reasoning => "reasoning",
            Kind::AudioInput => "audio_input",
            Kind::AudioOutput => "audio_output",
            Kind::ImageInput => "image_input",
            Kind::ImageOutput => "image_output",
            Kind::WebSearch => "web_search_per_1k_calls",
        }
    }

    pub fn get(self, p: &Prices) -> i64 {
        let mut copy = *p;
        *self.field(&mut copy)
    }

    pub fn set(self, p: &mut Prices, v: i64) {
        *self.field(p) = v;
    }

    fn field(self, p: &mut Prices) -> &mut i64 {
        match self {
            Kind::CachedInput => &mut p.cached_input,
            Kind::CacheWrite5m => &mut p.cache_write_5m,
            Kind::CacheWrite1h => &mut p.cache_write_1h,
            Kind::Reasoning => &mut p.reasoning,
            Kind::AudioInput => &mut p.audio_input,
            Kind::AudioOutput => &mut p.audio_output,
            Kind::ImageInput => &mut p.image_input,
            Kind::ImageOutput => &mut p.image_output,
            Kind::WebSearch => &mut p.web_search_per_1k_calls,
        }
    }

    /// The price this kind is billed at within a price that does not state it: cached
    /// input, cache writes, audio and image input at the input price (1-hour writes at the
    /// 5-minute price); reasoning, audio and image output at the output price; web search
    /// free (0).
    pub(crate) fn within_price(self, p: &Prices) -> i64 {
        match self {
            Kind::CachedInput | Kind::CacheWrite5m | Kind::AudioInput | Kind::ImageInput => p.input,
            Kind::CacheWrite1h => p.cache_write_5m,
            Kind::Reasoning | Kind::AudioOutput | Kind::ImageOutput => p.output,
            Kind::WebSearch => 0,
        }
    }

    /// The rate this kind is a multiple of at a provider (cache reads and writes, audio and
    /// image input of the input rate; reasoning, audio and image output of the output
    /// rate); `None` for a per-call fee.
    fn base(self, p: &Prices) -> Option<i64> {
        match self {
            Kind::CachedInput
            | Kind::CacheWrite5m
            | Kind::CacheWrite1h
            | Kind::AudioInput
            | Kind::ImageInput => Some(p.input),
            Kind::Reasoning | Kind::AudioOutput | Kind::ImageOutput => Some(p.output),
            Kind::WebSearch => None,
        }
    }

    /// This kind's figure in `lower` carried over to `upper`: where `upper`'s base rate is
    /// dearer, the same multiple of it, rounded up — a Region or data zone surcharges every
    /// kind alike, and the lower figure would bill below its multiple; where it is cheaper,
    /// the figure as written — a discount on these kinds must be stated, never assumed.
    /// `None` when `lower`'s base is zero and `upper`'s is not (no multiple to carry).
    fn carried(self, upper: &Prices, lower: &Prices) -> Option<i64> {
        let v = self.get(lower);
        let (Some(mine), Some(theirs)) = (self.base(upper), self.base(lower)) else {
            return Some(v);
        };
        if mine <= theirs {
            return Some(v);
        }
        if theirs == 0 {
            return None;
        }
        let scaled = i128::from(v) * i128::from(mine);
        let theirs = i128::from(theirs);
        Some(i64::try_from((scaled + theirs - 1).div_euclid(theirs)).unwrap_or(i64::MAX))
    }

    /// Anthropic's published rule for the kinds it bills apart, from the input price:
    /// cache reads 0.1×, 5-minute writes 1.25×, 1-hour writes 2×, web search $10 per
    /// 1 000 calls. Rounded up to the micro-dollar: never below the provider's figure.
    fn anthropic(self, input: i64) -> Option<i64> {
        let times = |num: i64, den: i64| {
            let v = i128::from(input) * i128::from(num);
            i64::try_from((v + i128::from(den) - 1) / i128::from(den)).unwrap_or(i64::MAX)
        };
        match self {
            Kind::CachedInput => Some(times(1, 10)),
            Kind::CacheWrite5m => Some(times(5, 4)),
            Kind::CacheWrite1h => Some(times(2, 1)),
            Kind::WebSearch => Some(10_000_000),
            _ => None,
        }
    }
}

/// The set of kinds a price states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stated(u16);

impl Stated {
    /// Every kind (a `free = true` model states every kind at zero).
    pub const ALL: Stated = Stated((1 << Kind::ALL.len()) - 1);

    pub fn has(self, k: Kind) -> bool {
        self.0 & (1 << k as u16) != 0
    }

    pub fn with(self, k: Kind) -> Stated {
        Stated(self.0 | (1 << k as u16))
    }
}

/// A price with the kinds it states; the others are filled by `fill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Partial {
    pub prices: Prices,
    pub stated: Stated,
}

impl Partial {
    /// Every kind stated.
    pub const fn whole(prices: Prices) -> Partial {
        Partial {
            prices,
            stated: Stated::ALL,
        }
    }

    /// Each kind this price does not state taken from `lower` where `lower` states it, at
    /// least the same multiple of the rate it follows (`Kind::carried`): a config input of
    /// 4 over a bundled 3.3 with cache writes at 4.125 writes them at 5, not below the
    /// configured rate's multiple (s21a #4).
    pub fn under(mut self, lower: &Partial) -> Partial {
        for k in Kind::ALL {
            if self.stated.has(k) || !lower.stated.has(k) {
                continue;
            }
            if let Some(v) = k.carried(&self.prices, &lower.prices) {
                k.set(&mut self.prices, v);
                self.stated = self.stated.with(k);
            }
        }
        self
    }

    /// The prices to bill at: the kinds still not stated filled from Anthropic's rule on a
    /// route Anthropic bills (`anthropic`), then from the price they fall under.
    pub fn fill(mut self, anthropic: bool) -> Prices {
        for k in Kind::ALL {
            if self.stated.has(k) {
                continue;
            }
            let rule = anthropic.then(|| k.anthropic(self.prices.input)).flatten();
            let v = rule.unwrap_or_else(|| k.within_price(&self.prices));
            k.set(&mut self.prices, v);
            self.stated = self.stated.with(k);
        }
        self.prices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partial(input: i64, output: i64, kinds: &[(Kind, i64)]) -> Partial {
        let mut p = Partial {
            prices: Prices::plain(input, output),
            stated: Stated::default(),
        };
        for &(k, v) in kinds {
            k.set(&mut p.prices, v);
            p.stated = p.stated.with(k);
        }
        p
    }

    #[test]
    fn a_kind_not_stated_comes_from_below_then_the_rule_then_within_the_price() {
        let below = partial(3, 15, &[(Kind::CacheWrite1h, 6), (Kind::Reasoning, 20)]);
        let p = partial(1, 5, &[(Kind::CachedInput, 0)]).under(&below);
        let billed = p.fill(false);
        // Below a cheaper price: taken as written (a discount must be stated).
        assert_eq!(
            (billed.cached_input, billed.cache_write_1h, billed.reasoning),
            (0, 6, 20)
        );
        assert_eq!(
            (billed.cache_write_5m, billed.web_search_per_1k_calls),
            (1, 0)
        );
        // Below a dearer price: the same multiple of its rates, rounded up (2 × 7, 4/3 × 16).
        let billed = partial(7, 16, &[]).under(&below).fill(false);
        assert_eq!((billed.cache_write_1h, billed.reasoning), (14, 22));
        // At the same rates, below's figures as they are; a fee is never scaled.
        let fee = partial(3, 15, &[(Kind::WebSearch, 9)]);
        let billed = partial(3, 15, &[]).under(&below).under(&fee).fill(false);
        assert_eq!(
            (
                billed.cache_write_1h,
                billed.reasoning,
                billed.web_search_per_1k_calls
            ),
            (6, 20, 9)
        );
        let billed = partial(30, 150, &[]).under(&fee).fill(false);
        assert_eq!(billed.web_search_per_1k_calls, 9);
        // Below free on the input: no multiple to carry, so the rule or the price decides.
        let free = partial(0, 0, &[(Kind::CacheWrite5m, 0)]);
        assert_eq!(
            partial(3, 15, &[]).under(&free).fill(true).cache_write_5m,
            4
        );
        // Anthropic's rule, rounded up: 1.25 × 3 micros is 4.
        let billed = partial(3, 15, &[]).fill(true);
        assert_eq!(
            (
                billed.cached_input,
                billed.cache_write_5m,
                billed.cache_write_1h,
                billed.web_search_per_1k_calls,
                billed.reasoning
            ),
            (1, 4, 6, 10_000_000, 15)
        );
        // Everything stated (free): nothing filled.
        assert_eq!(
            Partial::whole(Prices::default()).under(&below).fill(true),
            Prices::default()
        );
    }
}
