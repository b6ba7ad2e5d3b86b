//! What a replica's memory keeps of the table as other replicas evict and store: a row
//! another replica deleted is forgotten at this one's lookup and at its rebuild, a table
//! whose ids started lower again is followed again after a rebuild (s28 late attack F1,
//! F2: the per-minute rebuild after an eviction had been the only cleanup), and a row
//! stored after the newest was evicted is seen at the next refresh (s28 stop attack F2).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrono::{Duration, Utc};
use serde_json::{json, Value};

use super::{prefix, Asked, Cache, HitKind, Plan};
use crate::config::{CacheSettings, UpstreamTimeouts};
use crate::error::WireFormat;
use crate::store::writer::Writer;
use crate::store::Db;

fn cache(db: &Db) -> Arc<Cache> {
    Cache::new(
        &CacheSettings::default(),
        &UpstreamTimeouts::default(),
        db.clone(),
        Writer::start(db),
    )
    .unwrap()
}

async fn open(dir: &tempfile::TempDir) -> Db {
    Db::open(&dir.path().join("cache.db"), false).await.unwrap()
}

/// A question about `vin`; `"thanks"` is one with no meaning to compare (exact matches
/// only, no vector).
fn question(vin: &str) -> Value {
    let text = match vin {
        "thanks" => "Thanks!".to_string(),
        vin => format!("Why does the engine warning light blink on {vin} after a cold start?"),
    };
    json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
        "messages": [{"role": "system", "content": "You diagnose cars."},
            {"role": "user", "content": text}]})
}

/// The plan of `question(vin)`, its question not read.
fn unread_plan(c: &Cache, vin: &str) -> Plan {
    asked_plan(c, vin, &Asked::default())
}

/// The plan of `question(vin)` with the cache headers `asked`, its question not read.
fn asked_plan(c: &Cache, vin: &str, asked: &Asked<'_>) -> Plan {
    c.plan(
        asked,
        question(vin).as_object().unwrap(),
        WireFormat::OpenAi,
        "gpt-4o-mini",
        (1, 1),
        None,
        None,
        None,
    )
    .unwrap()
    .expect("cacheable")
}

/// The plan of `question(vin)`, its question read as the pipeline reads it past the memory
/// and before a store.
fn plan(c: &Cache, vin: &str) -> Plan {
    let plan = unread_plan(c, vin);
    c.read_question(&plan, question(vin).as_object().unwrap());
    plan
}

fn answer() -> Value {
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "Check the EGR valve."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 24, "total_tokens": 36}})
}

fn far() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(3600)
}

/// An exact repeat held in memory is found from its exact key alone: its question (the
/// context key, the reading of its last message) is not read for it; an expired entry is
/// not held.
#[tokio::test]
async fn an_exact_repeat_held_in_memory_needs_no_question() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    c.put(&plan(&c, "WVWZZZ1JZXW000001"), &answer(), (12, 24), now)
        .await;
    let unread = unread_plan(&c, "WVWZZZ1JZXW000001");
    let hit = c.held(&unread, now).expect("held in memory");
    assert_eq!(hit.kind, HitKind::Exact);
    assert!(unread.question.get().is_none(), "its question was read");
    assert!(c.held(&unread, now + Duration::days(30)).is_none());
}

/// A store off the request's path (`Cache::store`, on the cache's thread) is held in memory
/// and lands in the table, as a store awaited in place does.
#[tokio::test]
async fn a_store_off_the_path_is_held_and_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    c.store(plan(&c, "WVWZZZ1JZXW000007"), answer(), (12, 24), now);
    let unread = unread_plan(&c, "WVWZZZ1JZXW000007");
    let waited = std::time::Instant::now();
    while c.held(&unread, now).is_none() {
        assert!(
            waited.elapsed().as_secs() < 10,
            "the store never landed in memory"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let other = cache(&db);
    loop {
        c.flush().await;
        other.refresh(now).await.unwrap();
        if other.present.read().len() == 1 {
            break;
        }
        assert!(
            waited.elapsed().as_secs() < 10,
            "the store never landed in the table"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Past `STORES_BEHIND` stores waiting, one more is not stored; the count comes back down
/// as they are made.
#[tokio::test]
async fn a_store_past_those_behind_is_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    c.behind.store(super::STORES_BEHIND, Ordering::Relaxed);
    c.store(plan(&c, "WVWZZZ1JZXW000008"), answer(), (12, 24), now);
    // Its place is taken once its embedding is made, in its task.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(c.behind.load(Ordering::Relaxed), super::STORES_BEHIND);
    c.behind.store(super::STORES_BEHIND - 1, Ordering::Relaxed);
    c.store(plan(&c, "WVWZZZ1JZXW000009"), answer(), (12, 24), now);
    let waited = std::time::Instant::now();
    while c.held(&unread_plan(&c, "WVWZZZ1JZXW000009"), now).is_none()
        || c.behind.load(Ordering::Relaxed) != super::STORES_BEHIND - 1
    {
        assert!(waited.elapsed().as_secs() < 10, "the store never ended");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(c.held(&unread_plan(&c, "WVWZZZ1JZXW000008"), now).is_none());
}

#[tokio::test]
async fn rows_another_replica_evicted_are_forgotten_and_a_drained_table_is_followed_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let (a, b) = (cache(&db), cache(&db));
    let now = Utc::now();
    let vins = ["thanks", "WVWZZZ1JZXW000002"];
    for vin in vins {
        a.put(&plan(&a, vin), &answer(), (12, 24), now).await;
    }
    a.flush().await;
    b.refresh(now).await.unwrap();
    assert_eq!(b.present.read().len(), 2);
    assert!(b.index.read().features() > 0);

    // Past their expiry, A evicts both; B learns of it at its lookup, then at its rebuild.
    let later = now + Duration::hours(2);
    assert_eq!(a.evict(later).await.unwrap(), 2);
    // An exact match only: no semantic candidate forgets it on the way.
    let first = plan(&b, vins[0]);
    assert!(first.question().is_none());
    assert!(b.get(&first, later, far()).await.is_none());
    assert!(
        !b.present.read().contains(&prefix(&first.exact)),
        "a row found gone is forgotten"
    );
    assert_eq!(b.present.read().len(), 1, "the other one is still held");
    let second = plan(&b, vins[1]);
    assert!(second.question().is_some());
    assert!(b.get(&second, later, far()).await.is_none());
    assert!(b.present.read().is_empty());
    assert_eq!(
        b.index.read().features(),
        0,
        "its semantic candidate is forgotten in the context it was asked in"
    );
    b.rebuild(later).await.unwrap();
    assert!(b.present.read().is_empty(), "the rebuild forgets it");
    assert_eq!(b.index.read().features(), 0);

    // The table drained. Its ids no longer start again on SQLite (migration 0029), but a
    // table restored from a backup may go lower: after the rebuild B follows it.
    let third = "WVWZZZ1JZXW000003";
    a.put(&plan(&a, third), &answer(), (12, 24), later).await;
    a.flush().await;
    b.rebuild(later).await.unwrap();
    let fourth = "WVWZZZ1JZXW000004";
    a.put(&plan(&a, fourth), &answer(), (12, 24), later).await;
    a.flush().await;
    b.refresh(later).await.unwrap();
    assert!(
        b.get(&plan(&b, fourth), later, far()).await.is_some(),
        "a row stored after the drain is found after the next refresh"
    );

    // An answer B holds in memory is read again after a rebuild: its row may have been
    // replaced unseen, a refresh passing over its new id (s28 final attack #3).
    let held = plan(&a, "WVWZZZ1JZXW000009");
    a.put(&held, &answer(), (12, 24), later).await;
    a.flush().await;
    let mut changed = answer();
    changed["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    a.put(&held, &changed, (12, 24), later).await;
    a.flush().await;
    b.lru.lock().put(
        held.exact,
        Arc::new(super::Entry {
            key: held.exact,
            answer: answer().to_string().into(),
            input_tokens: 12,
            output_tokens: 24,
            version: 1,
            expires_at: later + Duration::hours(1),
        }),
        1,
    );
    b.rebuild(later).await.unwrap();
    let hit = b.get(&held, later, far()).await.expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        changed,
        "the stored answer, not the one held"
    );
}

#[tokio::test]
async fn a_row_stored_after_the_newest_was_evicted_is_followed_by_other_replicas() {
    // On SQLite a plain rowid is max + 1: once the newest row went, the next row took its
    // rowid again and another replica's refresh, past it already, passed over it — a
    // re-stored answer stayed in that replica's LRU, a new key was missing there, up to
    // the 10-minute rebuild (s28 stop attack F2; a client sets a 1-second TTL at will).
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let (a, b) = (cache(&db), cache(&db));
    let now = Utc::now();
    let held = plan(&a, "WVWZZZ1JZXW000011");
    a.put(&held, &answer(), (12, 24), now).await;
    // The newest row, its hour nearly over: it expires a minute from `now`.
    let brief = plan(&a, "WVWZZZ1JZXW000012");
    a.put(&brief, &answer(), (12, 24), now - Duration::minutes(59))
        .await;
    a.flush().await;
    b.refresh(now).await.unwrap();
    assert!(
        b.get(&held, now, far()).await.is_some(),
        "B holds it in memory"
    );

    let later = now + Duration::minutes(2);
    assert_eq!(a.evict(later).await.unwrap(), 1);
    let mut changed = answer();
    changed["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    a.put(&held, &changed, (12, 24), later).await;
    let fresh = plan(&a, "WVWZZZ1JZXW000013");
    a.put(&fresh, &answer(), (12, 24), later).await;
    a.flush().await;

    b.refresh(later).await.unwrap();
    let hit = b.get(&held, later, far()).await.expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        changed,
        "the answer stored again, not the one held"
    );
    assert!(
        b.get(&plan(&b, "WVWZZZ1JZXW000013"), later, far())
            .await
            .is_some(),
        "a key stored after the eviction is found"
    );
}

/// A request that names an image or a document by its URL is not cached unless the
/// client asks for it: the key holds the address, not what it holds now (s31 cache attack
/// F5). Inline (`data:`) images are keyed by their bytes and cached as any request.
#[tokio::test]
async fn content_named_by_its_url_is_cached_only_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let ask = |part: Value, on: bool| {
        let body = json!({"model": "m", "temperature": 0, "max_tokens": 10,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What does this show?"}, part]}]});
        let mut headers = actix_web::http::header::HeaderMap::new();
        if on {
            headers.insert(
                actix_web::http::header::HeaderName::from_static("x-sluice-cache"),
                actix_web::http::header::HeaderValue::from_static("on"),
            );
        }
        let format = WireFormat::OpenAi;
        let plan = c.plan(
            &Asked::read(&headers).unwrap(),
            body.as_object().unwrap(),
            format,
            "m",
            (1, 1),
            None,
            None,
            None,
        );
        plan.unwrap().is_some()
    };
    let openai =
        json!({"type": "image_url", "image_url": {"url": "https://example.com/latest.png"}});
    let inline =
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}});
    let anthropic =
        json!({"type": "image", "source": {"type": "url", "url": "https://example.com/chart.png"}});
    let in_a_result =
        json!({"type": "tool_result", "tool_use_id": "t", "content": [anthropic.clone()]});
    let video = json!({"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}});
    let plain = json!({"type": "input_image", "image_url": "https://example.com/latest.png"});
    let mistral = json!({"type": "document_url", "document_url": "https://example.com/report.pdf"});
    let file = json!({"type": "file", "file": {"filename": "r.pdf", "file_data": "https://example.com/r.pdf"}});
    for remote in [
        &openai,
        &anthropic,
        &in_a_result,
        &video,
        &plain,
        &mistral,
        &file,
    ] {
        assert!(!ask(remote.clone(), false), "{remote}");
        assert!(ask(remote.clone(), true), "{remote}: asked for");
    }
    assert!(ask(inline, false));
    let call = json!({"type": "tool_use", "id": "t", "name": "fetch", "input": {"page_url": "https://example.com/"}});
    assert!(
        ask(call, false),
        "a tool call's input is no content sent along"
    );
    let inline_file = json!({"type": "file", "file": {"filename": "r.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}});
    assert!(ask(inline_file, false));
}

/// An answer nested deeper than `serde_json` parses in a member a replay reads (a choice's
/// extra field here; a translated tool call's parsed arguments in the wild) is held in
/// memory as the text it was stored as, and cannot be replayed (`Entry::replayed`: the
/// stream goes on as a miss); in a member no replay reads it is passed over. Read back from
/// the table — another replica, a restart — it is a miss for whole requests too, as it was
/// before entries were held as text.
#[tokio::test]
async fn an_answer_too_deep_to_parse_again_is_held_whole_and_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    let p = plan(&c, "WVWZZZ1JZXW000021");
    let mut deep = answer();
    let mut nested = json!(0);
    for _ in 0..200 {
        nested = json!([nested]);
    }
    deep["choices"][0]["provider_detail"] = nested.clone();
    c.put(&p, &deep, (12, 24), now).await;
    let hit = c.get(&p, now, far()).await.expect("held in memory");
    assert_eq!(hit.entry.answer, deep.to_string().as_bytes());
    assert!(
        hit.entry.replayed(WireFormat::OpenAi).is_none(),
        "200 levels do not parse"
    );

    let mut aside = answer();
    aside["system_fingerprint"] = nested;
    let p = plan(&c, "WVWZZZ1JZXW000024");
    c.put(&p, &aside, (12, 24), now).await;
    let hit = c.get(&p, now, far()).await.expect("held in memory");
    assert!(
        hit.entry.replayed(WireFormat::OpenAi).is_some(),
        "a member not replayed"
    );
}

/// The text an entry holds takes no more memory than it counts: `to_string`'s buffer of a
/// 1 346-byte answer is 2 048 bytes, all of it kept by `Bytes::from` (s38 attack F1).
#[test]
fn an_entry_holds_no_more_than_its_text() {
    let mut a = answer();
    a["choices"][0]["message"]["content"] = json!("Check the EGR valve. ".repeat(60));
    let (row, held) = super::texts(&a);
    assert_eq!(held, row.as_bytes());
    drop(row);
    let alone = held.try_into_mut().expect("the only holder");
    assert_eq!(alone.capacity(), alone.len(), "no spare buffer held");
}

/// A stored answer is replayed from the members a replay reads: a member it does not read
/// (an upstream's extra field, a list of 100 000 numbers here: 200 kB of text, 3.2 MB
/// parsed) is passed over unparsed, not built for every streamed hit (s38 stop attack F1).
#[tokio::test]
async fn a_replay_parses_only_what_it_replays() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    let p = plan(&c, "WVWZZZ1JZXW000022");
    let mut wide = answer();
    wide["service_tier_detail"] = json!(vec![0; 100_000]);
    c.put(&p, &wide, (12, 24), now).await;
    let hit = c.get(&p, now, far()).await.expect("held in memory");
    let replayed = hit.entry.replayed(WireFormat::OpenAi).expect("replayable");
    assert!(replayed.get("service_tier_detail").is_none());
    wide.as_object_mut().unwrap().remove("service_tier_detail");
    wide.as_object_mut().unwrap().remove("object");
    assert_eq!(replayed, wide);
}

/// A streamed hit of an Anthropic answer starts with the message as a miss's stream does:
/// `message_start` carries every member of the stored message (its content emptied) — the
/// replay parsed only the members an OpenAI replay reads, and sent a message with no
/// `type` and no `role` (s39 final attack F1).
#[test]
fn an_anthropic_replay_starts_with_the_whole_message() {
    let stored = json!({"id": "msg_1", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "Check the EGR valve."}],
        "stop_reason": "end_turn", "stop_sequence": null, "container": null,
        "usage": {"input_tokens": 12, "output_tokens": 24}});
    let entry = super::Entry {
        key: [7; 32],
        answer: stored.to_string().into(),
        input_tokens: 12,
        output_tokens: 24,
        version: 1,
        expires_at: Utc::now(),
    };
    let replayed = entry.replayed(WireFormat::Anthropic).expect("replayable");
    let frames = super::replay::frames(WireFormat::Anthropic, &replayed, false);
    let first = std::str::from_utf8(&frames[0]).unwrap();
    let data = first
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("data");
    let start: Value = serde_json::from_str(data).unwrap();
    let mut expected = stored.clone();
    expected["content"] = json!([]);
    expected["stop_reason"] = Value::Null;
    expected["usage"]["output_tokens"] = json!(0);
    assert_eq!(start["message"], expected);
}

/// A replica keeps its own new entries in memory at its refresh: the refresh popped every
/// key stored since the last, its own too, and each answer was read from the table again
/// at its next use a second later (s38 lead). One stored again by another replica still
/// gives way (s24 attack, cache #6).
#[tokio::test]
async fn a_replicas_own_entries_stay_in_its_memory_at_its_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let (a, b) = (cache(&db), cache(&db));
    let now = Utc::now();
    a.refresh(now).await.unwrap(); // as at its start: the first reads the whole table
    let held = plan(&a, "WVWZZZ1JZXW000021");
    a.put(&held, &answer(), (12, 24), now).await;
    a.flush().await;
    a.refresh(now).await.unwrap();
    assert!(
        a.lru.lock().get(&held.exact).is_some(),
        "A's own entry stays in its memory"
    );

    // B stores it again in the same millisecond: the times of the two rows are equal.
    let mut changed = answer();
    changed["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    // (Each replica stores its own plans: a plan holds its replica's epoch.)
    b.put(&plan(&b, "WVWZZZ1JZXW000021"), &changed, (12, 24), now)
        .await;
    b.flush().await;
    a.refresh(now).await.unwrap();
    assert!(
        a.lru.lock().get(&held.exact).is_none(),
        "stored again by B: the answer A held gives way"
    );
    let hit = a.get(&held, now, far()).await.expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.entry.answer).unwrap(),
        changed
    );
}

/// A row read from the table while a refresh drops its key from memory is served to the
/// one lookup that read it, and not kept: put in memory after the refresh, the answer the
/// table no longer holds was served until the next rebuild (s39 attack F3). The lookup's
/// steps (`Cache::entry`) with the refresh between its read and its keep.
#[tokio::test]
async fn a_row_read_while_a_refresh_drops_its_key_is_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let (a, b) = (cache(&db), cache(&db));
    let now = Utc::now();
    a.refresh(now).await.unwrap();
    let held = plan(&b, "WVWZZZ1JZXW000031");
    b.put(&held, &answer(), (12, 24), now).await;
    b.flush().await;
    a.refresh(now).await.unwrap();
    let key = held.exact;
    let read = |c: &Arc<Cache>| {
        let c = c.clone();
        async move {
            let changes = c.lru.lock().changes(&key);
            let e = c.read(&key, None, WireFormat::OpenAi, now).await;
            (e.unwrap().expect("the row"), changes)
        }
    };

    // Nothing dropped during the read: kept.
    let (entry, changes) = read(&a).await;
    a.keep(&entry, changes);
    assert!(a.lru.lock().get(&key).is_some());
    a.lru.lock().pop(&key);

    let (entry, changes) = read(&a).await;
    let mut changed = answer();
    changed["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    b.put(&held, &changed, (12, 24), now).await;
    b.flush().await;
    a.refresh(now).await.unwrap();
    a.keep(&entry, changes);
    assert!(
        a.lru.lock().get(&key).is_none(),
        "the row read before the refresh is not kept"
    );
    let next = a.get(&held, now, far()).await.expect("found");
    assert_eq!(
        serde_json::from_slice::<Value>(&next.entry.answer).unwrap(),
        changed,
        "the next lookup reads the new row"
    );

    // Stored again here during a read: the older row read does not replace it (H6).
    a.lru.lock().pop(&key);
    let (entry, changes) = read(&a).await;
    let mut third = answer();
    third["choices"][0]["message"]["content"] = json!("Check the MAF sensor.");
    a.put(&plan(&a, "WVWZZZ1JZXW000031"), &third, (12, 24), now)
        .await;
    a.keep(&entry, changes);
    let held_now = a.lru.lock().get(&key).expect("held");
    assert_eq!(
        serde_json::from_slice::<Value>(&held_now.answer).unwrap(),
        third,
        "the store made during the read stays"
    );

    // Another key stored meanwhile, of another shard: the read is kept all the same — one
    // count for every key gave up nearly every read under a stream of stores (s39 stop
    // attack M2).
    a.lru.lock().pop(&key);
    let (entry, changes) = read(&a).await;
    let other = (40..100)
        .map(|n| plan(&a, &format!("WVWZZZ1JZXW0000{n}")))
        .find(|p| super::memory::shard(&p.exact) != super::memory::shard(&key))
        .expect("a key of another shard");
    a.put(&other, &answer(), (12, 24), now).await;
    a.keep(&entry, changes);
    assert!(
        a.lru.lock().get(&key).is_some(),
        "a change elsewhere does not stop the keep"
    );
}

/// A cache over a new database, its epoch read as at start (the directory holds the file).
async fn started() -> (tempfile::TempDir, Db, Arc<Cache>, chrono::DateTime<Utc>) {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = cache(&db);
    let now = Utc::now();
    c.refresh(now).await.unwrap();
    (dir, db, c, now)
}

/// The plan of `question(vin)` with `x-sluice-cache-tags: tag`, its question read.
fn tagged_plan(c: &Cache, vin: &str, tag: &str) -> Plan {
    let asked = Asked {
        tags: vec![tag],
        ..Asked::default()
    };
    let plan = asked_plan(c, vin, &asked);
    c.read_question(&plan, question(vin).as_object().unwrap());
    plan
}

/// An answer whose request was planned before an invalidation — its upstream call made
/// from what the invalidation said is gone — is not kept after it: not in memory, not in
/// the table (s46 stop attack F4: a store behind the invalidation landed after it and was
/// served for its TTL). The tag had no entry yet: the invalidation moves the epoch all the
/// same.
#[tokio::test]
async fn an_answer_planned_before_an_invalidation_is_not_kept_after_it() {
    let (_dir, db, c, now) = started().await;
    let vin = "WVWZZZ1JZXW000101";
    let planned = tagged_plan(&c, vin, "doc:1");
    assert_eq!(c.invalidate_tag("doc:1").await.unwrap(), 0);
    c.put(&planned, &answer(), (12, 24), now).await;
    c.flush().await;
    assert!(
        c.held(&unread_plan(&c, vin), now).is_none(),
        "kept in memory"
    );
    assert!(c.get(&plan(&c, vin), now, far()).await.is_none());
    let other = cache(&db);
    other.refresh(now).await.unwrap();
    assert!(other.present.read().is_empty(), "written to the table");

    // Planned after it, the answer is kept.
    c.put(&tagged_plan(&c, vin, "doc:1"), &answer(), (12, 24), now)
        .await;
    c.flush().await;
    assert!(c.held(&unread_plan(&c, vin), now).is_some());
    other.refresh(now).await.unwrap();
    assert_eq!(other.present.read().len(), 1);
}

/// The same when another replica invalidates: this one learns of it only at its next
/// refresh, so its store is refused by the table (the row names the epoch it was planned
/// under), and its memory drops the answer at that refresh.
#[tokio::test]
async fn an_answer_planned_before_another_replicas_invalidation_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let (a, b) = (cache(&db), cache(&db));
    let now = Utc::now();
    a.refresh(now).await.unwrap();
    b.refresh(now).await.unwrap();
    let vin = "WVWZZZ1JZXW000102";
    let planned = tagged_plan(&a, vin, "doc:2");
    assert_eq!(b.invalidate_tag("doc:2").await.unwrap(), 0);
    a.put(&planned, &answer(), (12, 24), now).await;
    a.flush().await;
    b.refresh(now).await.unwrap();
    assert!(b.present.read().is_empty(), "written to the table");
    assert!(b.get(&plan(&b, vin), now, far()).await.is_none());
    a.refresh(now).await.unwrap();
    assert!(
        a.held(&unread_plan(&a, vin), now).is_none(),
        "kept in memory"
    );
}

/// Stores off the path racing an invalidation: whatever the interleaving — the entry in
/// memory before or after the invalidation's, its row written before or after its delete —
/// nothing planned before the invalidation is found after it, here or on another replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_racing_an_invalidation_leave_nothing_planned_before_it() {
    let (_dir, db, c, now) = started().await;
    let vins: Vec<String> = (0..200).map(|n| format!("WVWZZZ1JZXW{n:06}")).collect();
    let plans: Vec<Plan> = vins.iter().map(|v| tagged_plan(&c, v, "doc:3")).collect();
    for (i, p) in plans.into_iter().enumerate() {
        c.store(p, answer(), (12, 24), now);
        if i == 100 {
            c.invalidate_tag("doc:3").await.unwrap();
        }
    }
    let waited = std::time::Instant::now();
    while c.behind.load(Ordering::Relaxed) != 0 {
        assert!(waited.elapsed().as_secs() < 10, "the stores never ended");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    c.flush().await;
    for vin in &vins {
        assert!(c.held(&unread_plan(&c, vin), now).is_none(), "{vin} held");
    }
    let other = cache(&db);
    other.refresh(now).await.unwrap();
    assert!(other.present.read().is_empty(), "rows written");
    // Nor does anything of theirs stay in memory past the next refresh (s47 stop attack F1:
    // a row the table refused left its key and vector), and one planned after is kept.
    c.refresh(now).await.unwrap();
    assert!(c.present.read().is_empty(), "keys with no row kept");
    assert_eq!(c.index.read().features(), 0, "vectors with no row kept");
    c.put(
        &tagged_plan(&c, &vins[0], "doc:3"),
        &answer(),
        (12, 24),
        now,
    )
    .await;
    assert!(c.held(&unread_plan(&c, &vins[0]), now).is_some());
}

/// A refresh that read the table's epoch before an invalidation here moved this replica's
/// leaves it where the invalidation put it: set back to what it read (a swap), a store
/// planned before the invalidation passed `keep_answer` and was served from memory until the
/// next refresh (s47 attack F1). The refresh's steps with the invalidation between its read
/// and the rest.
#[tokio::test]
async fn a_refresh_that_read_before_an_invalidation_does_not_undo_it() {
    let (_dir, db, c, now) = started().await;
    let vin = "WVWZZZ1JZXW000103";
    let planned = tagged_plan(&c, vin, "doc:4");
    let known = c.epoch.load(Ordering::Acquire);
    let read = crate::store::cache::epoch(&db).await.unwrap();
    c.invalidate_tag("doc:4").await.unwrap();
    let moved = c.epoch.load(Ordering::Acquire);
    assert_ne!(moved, known);
    c.refresh_from(known, read, now).await.unwrap();
    assert_eq!(
        c.epoch.load(Ordering::Acquire),
        moved,
        "the epoch went back"
    );
    c.put(&planned, &answer(), (12, 24), now).await;
    assert!(
        c.held(&unread_plan(&c, vin), now).is_none(),
        "kept in memory"
    );

    // Read after another replica's invalidation, with nothing moved here: followed.
    let other = cache(&db);
    other.refresh(now).await.unwrap();
    other.invalidate_tag("doc:4").await.unwrap();
    let known = c.epoch.load(Ordering::Acquire);
    let read = crate::store::cache::epoch(&db).await.unwrap();
    c.refresh_from(known, read, now).await.unwrap();
    assert_eq!(c.epoch.load(Ordering::Acquire), read);

    // Moved here meanwhile to an epoch before the one read (this replica's invalidation,
    // then another's): followed to the one read all the same — left there, a store planned
    // under it was held though the table refused it, until the next refresh (s47 stop
    // attack F3).
    let known = c.epoch.load(Ordering::Acquire);
    c.invalidate_tag("doc:4").await.unwrap();
    other.invalidate_tag("doc:4").await.unwrap();
    let read = crate::store::cache::epoch(&db).await.unwrap();
    c.refresh_from(known, read, now).await.unwrap();
    assert_eq!(
        c.epoch.load(Ordering::Acquire),
        read,
        "left behind the table"
    );
}

/// An answer planned before an invalidation does not touch what a store planned after it
/// holds: put in memory before the check, it replaced the newer answer of its key and was
/// then forgotten with it (s47 attack F2).
#[tokio::test]
async fn an_answer_planned_before_an_invalidation_leaves_a_newer_one_of_its_key() {
    let (_dir, _db, c, now) = started().await;
    let vin = "WVWZZZ1JZXW000104";
    let before = tagged_plan(&c, vin, "doc:5");
    c.invalidate_tag("doc:5").await.unwrap();
    let mut newer = answer();
    newer["choices"][0]["message"]["content"] = json!("Replace the EGR valve.");
    c.put(&tagged_plan(&c, vin, "doc:5"), &newer, (12, 24), now)
        .await;
    c.flush().await;
    c.put(&before, &answer(), (12, 24), now).await;
    let held = c
        .held(&unread_plan(&c, vin), now)
        .expect("the newer answer held");
    assert_eq!(
        serde_json::from_slice::<Value>(&held.entry.answer).unwrap(),
        newer
    );
    assert_eq!(c.present.read().len(), 1, "its key forgotten");
}

/// Keys and vectors another replica's invalidation deleted go from this replica's memory at
/// its next refresh, though this replica invalidated meanwhile; and a row this replica had
/// queued when its invalidation came, which the table refuses, leaves nothing in memory
/// either. Both stayed: this replica's own invalidation moved its epoch, so its refresh no
/// longer rebuilt (s47 stop attack F1) — each key a database read at every lookup, each
/// vector a semantic candidate with no row, until the index was full.
#[tokio::test]
async fn keys_with_no_row_go_at_the_refresh_after_an_invalidation() {
    let (_dir, db, a, now) = started().await;
    let b = cache(&db);
    b.refresh(now).await.unwrap();
    b.put(
        &tagged_plan(&b, "WVWZZZ1JZXW000105", "t:1"),
        &answer(),
        (12, 24),
        now,
    )
    .await;
    b.flush().await;
    a.refresh(now).await.unwrap();
    assert_eq!(a.present.read().len(), 1);
    assert_eq!(b.invalidate_tag("t:1").await.unwrap(), 1);
    a.invalidate_tag("t:2").await.unwrap();
    a.refresh(now).await.unwrap();
    assert!(
        a.present.read().is_empty(),
        "another replica's deleted key kept"
    );
    assert_eq!(a.index.read().features(), 0);

    // Queued when the invalidation commits: the invalidation holds the write lock, the row
    // waits for it, then the table refuses it.
    let mut tx = db.begin().await.unwrap();
    let deleted = Cache::delete_tag(&mut tx, "t:3").await.unwrap();
    a.put(&plan(&a, "WVWZZZ1JZXW000106"), &answer(), (12, 24), now)
        .await;
    tx.commit().await.unwrap();
    a.forget_deleted(deleted);
    a.flush().await;
    a.refresh(now).await.unwrap();
    assert!(a.present.read().is_empty(), "a refused row's key kept");
    assert_eq!(a.index.read().features(), 0, "a refused row's vector kept");
}

/// A store waiting for its embedding holds no place among those behind: with an `http`
/// embedder that hangs (up to its 5 s), the 1 024 places filled in seconds and every store
/// after was dropped, exact entries too (s47 stop attack F4).
#[tokio::test]
async fn a_store_waiting_for_its_embedding_holds_no_place_behind() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let db = open(&dir).await;
    let c = Cache::new(
        &CacheSettings {
            embedder: "http".into(),
            http_url: format!("http://{addr}/v1"),
            http_allow_private_network: true,
            ..CacheSettings::default()
        },
        &UpstreamTimeouts::default(),
        db.clone(),
        Writer::start(&db),
    )
    .unwrap();
    c.refresh(Utc::now()).await.unwrap();
    c.behind.store(super::STORES_BEHIND - 1, Ordering::Relaxed);
    for vin in ["WVWZZZ1JZXW000107", "WVWZZZ1JZXW000108"] {
        c.store(plan(&c, vin), answer(), (12, 24), Utc::now());
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        c.behind.load(Ordering::Relaxed),
        super::STORES_BEHIND - 1,
        "stores waiting for their embedding counted"
    );
}
