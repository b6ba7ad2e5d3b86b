//! An OpenAI answer of `n` choices: whole at the last of their finishes; a finished choice's
//! text, and a choice not asked for, no part of it after the finish; a choice that starts
//! after a usage, or is numbered wrongly before the finish, passed on and counted.

use bytes::Bytes;
use serde_json::{json, Value};

use super::choices_of;
use crate::error::WireFormat;
use crate::quota::estimate;
use crate::upstream::providers::translate::stream::{frame, StreamConverter};

/// An `n` = 3 answer is whole once each of its choices finished, in any order — not at
/// choice 0's finish — and a usage that comes before then is a floor, not its price; a
/// body that ends before the last finish is a cut. With `n` = 1, choice 0's finish.
#[test]
fn an_answer_of_n_choices_is_whole_at_the_last_of_their_finishes() {
    let text = |i: i64, t: &str| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {"content": t}, "finish_reason": null}]})
        .to_string()
    };
    let finish = |i: i64| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]})
        .to_string()
    };
    let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
        "total_tokens": 11}})
    .to_string();
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(3);
    c.event("", &text(0, "one "), &mut out);
    c.event("", &finish(0), &mut out);
    assert!(!c.finished(), "choices 1 and 2 have not started");
    c.event("", &text(2, "three "), &mut out);
    c.event("", &finish(2), &mut out);
    assert!(!c.finished(), "choice 1 has not finished");
    // A running usage (vLLM's continuous usage, on a chunk with choices).
    let running = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 1, "delta": {"content": "two "},
        "finish_reason": null}], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
        "total_tokens": 11}})
    .to_string();
    c.event("", &running, &mut out);
    assert!(
        !c.usage_final(),
        "a usage before the answer is whole is a floor"
    );
    c.event("", &text(1, "two words here"), &mut out);
    assert!(c.usage().output > 1, "the count over the floor");
    assert!(!c.end(&mut Vec::new()), "a body ending now cuts choice 1");
    c.event("", &finish(1), &mut out);
    assert!(c.finished());
    c.event("", &usage, &mut out);
    assert!(c.usage_final());

    let mut one = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10);
    one.event("", &text(0, "one "), &mut out);
    one.event("", &finish(0), &mut out);
    assert!(one.finished(), "n = 1: choice 0's finish");

    // Review finding (s18): a server that ignores `n` (Ollama) generates one choice; the
    // usage in a chunk of its own comes after every choice it generates, so with each one
    // started finished the answer is whole at the stream's end, that usage its price —
    // its body's end, or `[DONE]` (and the client gets no usage chunk of the gateway's).
    // Not at the usage itself (s19, see `a_choice_that_starts_after_a_usage_is_counted`).
    let ignored = || {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(3);
        let mut out = Vec::new();
        c.event("", &text(0, "one "), &mut out);
        c.event("", &finish(0), &mut out);
        assert!(!c.finished());
        c.event("", &usage, &mut out);
        c
    };
    let mut ended = ignored();
    assert!(!ended.finished(), "another choice may follow its usage");
    assert!(ended.end(&mut Vec::new()), "its body's end completes it");
    assert!(ended.finished() && ended.usage_final());
    assert_eq!(ended.usage().output, 1);
    let mut done = ignored();
    let mut tail = Vec::new();
    done.event("", "[DONE]", &mut tail);
    assert!(done.done() && done.finished() && done.usage_final());
    assert_eq!(tail, [frame(None, "[DONE]")]);
    assert_eq!(done.usage().output, 1);
}

/// Review finding (s18 final #4): an upstream that sends an `n` = 2 answer's choices one
/// after the other, a usage in a chunk of its own after each (a relay fanning `n` out into
/// n calls), had its answer whole at choice 0's usage: choice 1's text was passed on but
/// never counted, and a client leaving (or the shutdown) then settled a whole answer on
/// choice 0's figures. A usage after fewer choices started than asked makes the answer
/// whole only at the stream's end; a choice that starts after it is counted, a body
/// ending within it is a cut, and such an upstream's reports — each of one call, or of
/// every call so far: it does not say — are floors under the count of every choice's text.
#[test]
fn a_choice_that_starts_after_a_usage_is_counted() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let usage = |output: i64| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": output,
            "total_tokens": 10 + output}})
        .to_string()
    };
    let second = "the second answer, told after the first one's usage ".repeat(8);
    let counted = estimate::count_text(&second);
    let sequential = |last: i64| {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
        let mut out = Vec::new();
        c.event("", &text(0, "one "), &mut out);
        c.event("", &finish(0), &mut out);
        c.event("", &usage(2), &mut out);
        assert!(!c.finished(), "choice 1 may follow the usage");
        out.clear();
        c.event("", &text(1, &second), &mut out);
        assert!(String::from_utf8_lossy(&out.concat()).contains(&second));
        assert!(
            c.usage().output >= counted,
            "choice 1's text is counted: a client leaving now pays it ({} < {counted})",
            c.usage().output
        );
        assert!(!c.end(&mut Vec::new()), "a body ending now cuts choice 1");
        c.event("", &finish(1), &mut out);
        assert!(c.finished(), "both choices finished");
        out.clear();
        c.event("", &usage(last), &mut out);
        c.event("", "[DONE]", &mut out);
        assert!(c.done());
        (c, String::from_utf8_lossy(&out.concat()).into_owned())
    };
    // Each usage of one call: the count of both choices' text is charged, and told.
    let (c, told) = sequential(3);
    let charged = c.usage().output;
    assert!(charged >= counted, "{charged} < {counted}");
    assert!(!c.usage_final(), "the count, not a report");
    assert!(
        told.contains(&format!("\"completion_tokens\":{charged}")),
        "{told}"
    );
    // A usage of every call so far: the last is the most, and charged.
    let (c, _) = sequential(counted + 50);
    assert_eq!(c.usage().output, counted + 50);
}

/// After its own finish each choice of an `n` > 1 answer is whole, as choice 0 is: more of
/// it (text, a second finish) is neither passed on nor counted, while the choices still
/// streaming pass.
#[test]
fn text_of_a_finished_choice_is_neither_passed_on_nor_counted() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10).choices(2);
    c.event("", &text(0, "zero "), &mut out);
    c.event("", &text(1, "one "), &mut out);
    c.event("", &finish(1), &mut out);
    let counted = c.usage().output;
    out.clear();
    let more = " more words after its finish".repeat(20);
    c.event("", &text(1, &more), &mut out);
    c.event("", &finish(1), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(c.usage().output, counted, "not counted");
    // Both in one chunk: choice 0, still streaming, passes alone.
    c.event(
        "",
        &chunk(
            json!([{"index": 0, "delta": {"content": "still "}, "finish_reason": null},
            {"index": 1, "delta": {"content": more}, "finish_reason": null}]),
        ),
        &mut out,
    );
    let passed = String::from_utf8_lossy(&out.concat()).to_string();
    assert!(
        passed.contains("still ") && !passed.contains("more words"),
        "{passed}"
    );
    assert!(!c.finished());
    c.event("", &finish(0), &mut out);
    assert!(c.finished());
}

/// Review finding (s18 final #5): a choice index outside the choices asked for (`n` or
/// more, or negative) never counted toward the finish, and after it its text passed to the
/// client uncounted, the usage its price: text the client kept free. After the finish such
/// a choice is no part of the answer: neither passed on nor counted, while the choices
/// asked for in the same chunk pass. Before it, it is passed on and counted (s19 attack
/// F1, `a_choice_numbered_wrongly_before_the_finish_reaches_the_client_and_is_counted`),
/// and counts toward no finish.
#[test]
fn a_choice_not_asked_for_is_neither_passed_on_nor_counted_after_the_finish() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let free = " free words of a choice nobody asked for".repeat(20);
    let passed = |out: &[Bytes]| String::from_utf8_lossy(&out.concat()).into_owned();
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10).choices(2);
    c.event("", &text(0, "zero "), &mut out);
    let counted = c.usage().output;
    for i in [2, 7, -1] {
        c.event("", &finish(i), &mut out);
    }
    assert!(!c.finished(), "counts toward no finish");
    c.event("", &text(2, &free), &mut out);
    assert!(passed(&out).contains("free words"), "{}", passed(&out));
    assert!(c.usage().output > counted, "counted before the finish");
    c.event("", &finish(0), &mut out);
    // The chunk that finishes the answer: what it says of such a choice passes still.
    out.clear();
    c.event(
        "",
        &chunk(
            json!([{"index": 1, "delta": {"content": "one "}, "finish_reason": "stop"},
            {"index": 2, "delta": {"content": "last "}, "finish_reason": null}]),
        ),
        &mut out,
    );
    assert!(c.finished());
    assert!(passed(&out).contains("last "), "{}", passed(&out));
    // After the finish: neither passed on nor counted, with `n` = 1 too.
    let mut one = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10);
    one.event("", &text(0, "zero "), &mut out);
    one.event("", &finish(0), &mut out);
    let counted = (c.usage().output, one.usage().output);
    out.clear();
    for i in [1, -1] {
        c.event("", &text(i + 2, &free), &mut out);
        one.event("", &text(i, &free), &mut out);
    }
    assert!(out.is_empty(), "{}", passed(&out));
    assert_eq!(
        (c.usage().output, one.usage().output),
        counted,
        "not counted"
    );
}

/// Review finding (s19 attack F1): an `n` = 1 upstream that numbers its choices wrongly
/// (LiteLLM in front of Claude with thinking: the reasoning on index 0, the answer's text
/// on index 1; TGI before 1.4.4: the token's position) had its answer dropped from the
/// first byte, the client paying the usage for nothing. Before the finish such a choice
/// is passed on and counted; only after it is it no part of the answer.
#[test]
fn a_choice_numbered_wrongly_before_the_finish_reaches_the_client_and_is_counted() {
    use choices_of::*;
    let answer = "the answer's text, on the wrong index ".repeat(10);
    let counted = estimate::count_text(&answer);
    for finish_on in [0, 1] {
        let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10);
        let mut out = Vec::new();
        c.event(
            "",
            &chunk(json!([{"index": 0, "delta": {"reasoning_content": "hmm "},
                "finish_reason": null}])),
            &mut out,
        );
        c.event("", &text(1, &answer), &mut out);
        assert!(passed(&out).contains(&answer), "{}", passed(&out));
        assert!(
            c.usage().output >= counted,
            "counted: {} < {counted}",
            c.usage().output
        );
        c.event("", &finish(finish_on), &mut out);
        c.event("", &usage(counted + 5), &mut out);
        c.event("", "[DONE]", &mut out);
        assert!(c.done());
        assert_eq!(c.usage().output, counted + 5);
        assert!(passed(&out).contains(&answer));
    }
}
