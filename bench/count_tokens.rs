//! Token counting speed — a benchmark, not a test.
//!
//! `cargo run --release --example count_tokens`
//!
//! Times the gateway's o200k counter (`quota::estimate::count_text`, what every
//! reservation counts its input with) against `tiktoken-rs`'s `encode_ordinary` on the
//! same texts: a short chat turn, a paragraph of mixed prose and code, a long prompt of
//! many paragraphs, and a long run without whitespace (the merge loop's worst case). Prints
//! the median time per text of each and their ratio. Then 16 threads count paragraphs at
//! once: their total rate against one thread's (each thread keeps its own scratch space for
//! the pattern's automata, `quota::tokenizer`'s `SCRATCH`; a shared one would make that
//! ratio fall with the threads instead of rising to the cores).

use std::time::Instant;

const SENTENCE: &str = "Say hello in one sentence, and tell me why the sky is blue.";

const PARAGRAPH: &str = "The gateway counts a request's input before it reserves: \
    fn main() { println!(\"{}\", x.map(|v| v * 2).sum::<i64>()); } — Ünïcödé façade, \
    你好，世界！ 12345 3.14159 It's we're they've <html><body class=\"a-b_c\">&amp;</body>";

/// The median over `rounds` of the time `f` takes per call, in microseconds.
fn median_us(rounds: usize, calls: usize, mut f: impl FnMut() -> usize) -> f64 {
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let mut sink = 0;
            for _ in 0..calls {
                sink += f();
            }
            std::hint::black_box(sink);
            start.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let start = Instant::now();
    sluice::quota::estimate::init();
    println!(
        "gateway counter ready in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let start = Instant::now();
    let theirs = tiktoken_rs::o200k_base().expect("tiktoken-rs builds o200k_base");
    println!(
        "tiktoken-rs ready in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let long = PARAGRAPH.repeat(200);
    let run = "a".repeat(2_000);
    println!(
        "{:<26} {:>10} {:>14} {:>7}",
        "text", "ours µs", "tiktoken-rs µs", "ratio"
    );
    for (name, text, calls) in [
        ("sentence (59 B)", SENTENCE, 20_000),
        ("paragraph (232 B)", PARAGRAPH, 5_000),
        ("200 paragraphs (46 KB)", long.as_str(), 20),
        ("2 000 × 'a'", run.as_str(), 200),
    ] {
        let ours = sluice::quota::estimate::count_text(text);
        assert_eq!(ours as usize, theirs.encode_ordinary(text).len(), "{name}");
        let o = median_us(9, calls, || {
            sluice::quota::estimate::count_text(text) as usize
        });
        let t = median_us(9, calls, || theirs.encode_ordinary(text).len());
        println!("{name:<26} {o:>10.2} {t:>14.2} {:>7.2}", o / t);
    }
    let one = 1.0
        / median_us(9, 5_000, || {
            sluice::quota::estimate::count_text(PARAGRAPH) as usize
        });
    let threads = 16;
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..5_000 {
                    std::hint::black_box(sluice::quota::estimate::count_text(PARAGRAPH));
                }
            });
        }
    });
    let all = (threads * 5_000) as f64 / (start.elapsed().as_secs_f64() * 1e6);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{threads} threads counting paragraphs at once: {:.2}× one thread's rate ({cores} cores)",
        all / one
    );
}
