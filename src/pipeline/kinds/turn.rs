//! The input an Anthropic server-tool turn may be billed. The turn is a loop of sampling
//! steps: the model writes, a server tool runs (a search, a fetch), its result is appended,
//! the model samples again — and every step is billed its whole context as input. With
//! `k` calls there are at most `k + 1` steps (one call per step is the worst case: calls
//! made together in one step share it); step `j` reads the prompt, the results of the `j`
//! calls before it and the output written before it (at most the output cap, for
//! `max_tokens` bounds the turn's output). Over the turn:
//!
//! `(k + 1) × first + Σ_i page_i × (k + 1 − i) + k × output_cap`
//!
//! where the call at position `i` (1-based) is re-read by the `k + 1 − i` steps from its
//! own on; the largest pages taken first make that sum the most it can be (rearrangement).

/// A turn's server-tool calls: how many and what their results may bring back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Turn {
    /// The most calls of every server tool together (each tool's `max_uses`).
    pub calls: i64,
    /// The most tokens all the calls' results may bring (each call its page).
    pub pages: i64,
    /// The most tokens of results the steps may re-read: `Σ page_i × (k + 1 − i)`,
    /// largest pages first.
    pub pages_reread: i64,
    /// The largest page one call may bring.
    pub largest_page: i64,
}

impl Turn {
    /// The turn of `tools`: each a tool's (calls, page per call).
    pub fn of(mut tools: Vec<(i64, i64)>) -> Self {
        tools.sort_by_key(|&(_, page)| std::cmp::Reverse(page));
        let k: i128 = tools.iter().map(|&(n, _)| i128::from(n)).sum();
        let (mut before, mut pages, mut reread) = (0i128, 0i128, 0i128);
        let largest = tools.first().map_or(0, |&(_, page)| i128::from(page));
        for (n, page) in tools {
            let (n, page) = (i128::from(n), i128::from(page));
            // Positions before+1 ..= before+n, each re-read k + 1 − i times.
            reread += page * n * (2 * (k - before) - n + 1) / 2;
            pages += page * n;
            before += n;
        }
        Self {
            calls: clamp(k),
            pages: clamp(pages),
            pages_reread: clamp(reread),
            largest_page: clamp(largest),
        }
    }

    /// This turn when at most `calls` of its calls ran (a stream shows how far it got):
    /// each of them bringing the largest page bounds any `calls` of the turn's; never more
    /// than the whole turn.
    pub fn at_most(&self, calls: i64) -> Self {
        if calls >= self.calls {
            return *self;
        }
        let c = i128::from(calls.max(0));
        let page = i128::from(self.largest_page);
        Self {
            calls: clamp(c),
            pages: clamp(c * page).min(self.pages),
            pages_reread: clamp(page * c * (c + 1) / 2).min(self.pages_reread),
            largest_page: self.largest_page,
        }
    }

    /// The input the whole turn may be billed when its first step reads `first` tokens and
    /// the turn may write `output`: `first` alone without a server-tool call.
    pub fn billed_input(&self, first: i64, output: i64) -> i64 {
        let k = i128::from(self.calls);
        clamp((k + 1) * i128::from(first) + i128::from(self.pages_reread) + k * i128::from(output))
    }
}

fn clamp(v: i128) -> i64 {
    i64::try_from(v.max(0)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_billed_its_whole_context() {
        // 5 searches of 25 000 over a 100 000-token prompt: 6 prompts, pages re-read
        // 5 + 4 + 3 + 2 + 1 times, the output re-read by the 5 steps after the first.
        let t = Turn::of(vec![(5, 25_000)]);
        assert_eq!((t.calls, t.pages, t.pages_reread), (5, 125_000, 375_000));
        assert_eq!(t.billed_input(100_000, 1_000), 600_000 + 375_000 + 5_000);
        // No call: the prompt once.
        let none = Turn::of(vec![]);
        assert_eq!(none.billed_input(7, 9), 7);
    }

    #[test]
    fn a_turn_cut_short_is_bounded_by_its_largest_pages() {
        // A search (25 000) and two fetches of 1 000; one call ran at most: two steps, the
        // largest page re-read once.
        let t = Turn::of(vec![(2, 1_000), (1, 25_000)]);
        let one = t.at_most(1);
        assert_eq!(
            (one.calls, one.pages, one.pages_reread),
            (1, 25_000, 25_000)
        );
        assert_eq!(one.billed_input(100, 10), 2 * 100 + 25_000 + 10);
        // Two calls: 25 000 × (2 + 1), no more than the whole turn's 78 000.
        assert_eq!(t.at_most(2).pages_reread, 75_000);
        assert_eq!(t.at_most(3), t);
        assert_eq!(t.at_most(7), t);
        assert_eq!(t.at_most(0).billed_input(100, 10), 100);
        assert_eq!(t.at_most(-1).calls, 0);
    }

    #[test]
    fn the_largest_pages_are_taken_first() {
        // A search (25 000) and two fetches of 1 000: the search re-read by 3 steps.
        let t = Turn::of(vec![(2, 1_000), (1, 25_000)]);
        assert_eq!(t.pages_reread, 25_000 * 3 + 1_000 * 2 + 1_000);
        assert_eq!(t.pages, 27_000);
    }

    #[test]
    fn the_largest_caps_saturate_and_never_overflow() {
        let t = Turn::of(vec![(100, 1_000_000); 1_000]);
        assert_eq!(t.calls, 100_000);
        assert!(t.pages_reread > 0);
        assert_eq!(t.billed_input(i64::MAX, i64::MAX), i64::MAX);
        assert_eq!(Turn::of(vec![(100, 1_000_000)]).pages_reread, 5_050_000_000);
    }
}
