"""The official `openai` Python SDK against a real `sluice serve` + `sluice mock`.

Tests run in file order; the last two stop the gateway, scan its log and
database files for secrets and check the money invariant, so they must stay last.
"""

from __future__ import annotations

import json
import time

import openai
import pytest
from openai import OpenAI

from conftest import (
    MOCK_COMPLETION_TOKENS,
    MOCK_PROMPT_TOKENS,
    MOCK_TEXT,
    UPSTREAM_KEY,
    ANTHROPIC_UPSTREAM_KEY,
)

BOGUS_TOKEN = "sk-sl-bogusBOGUSbogus0000000000000000000000000000ZZ"


def chat_messages():
    return [{"role": "user", "content": "Say hello."}]


# --------------------------------------------------------------------------- chat


def test_chat_non_streaming(client, sluice):
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=chat_messages()
    )
    assert raw.headers.get("x-request-id")
    assert raw.headers.get("x-sluice-upstream") == "mock-a"
    remaining = raw.headers.get("x-sluice-budget-remaining-usd")
    assert remaining is not None and 0 < float(remaining) < 5

    resp = raw.parse()
    assert resp.object == "chat.completion"
    assert len(resp.choices) == 1
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == MOCK_TEXT
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens == MOCK_PROMPT_TOKENS
    assert resp.usage.completion_tokens == MOCK_COMPLETION_TOKENS


def test_chat_streaming_without_usage(client):
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=chat_messages(), stream=True
    )
    parts, finish, chunks = [], None, 0
    for chunk in stream:
        chunks += 1
        assert chunk.object == "chat.completion.chunk"
        # The gateway asks the upstream for usage to settle the budget; it must
        # not surface that chunk to a client that did not ask for it.
        assert chunk.usage is None, f"unrequested usage chunk surfaced: {chunk}"
        assert chunk.choices, f"chunk without choices surfaced: {chunk}"
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    assert chunks > 1
    assert "".join(parts) == MOCK_TEXT
    assert finish == "stop"


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=chat_messages(),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks
    text = "".join(
        c.delta.content or "" for ch in chunks for c in ch.choices
    )
    assert text == MOCK_TEXT

    last = chunks[-1]
    assert last.usage is not None, "final chunk carries no usage"
    assert last.choices == []
    assert last.usage.prompt_tokens == MOCK_PROMPT_TOKENS
    assert last.usage.completion_tokens == MOCK_COMPLETION_TOKENS
    assert last.usage.total_tokens == MOCK_PROMPT_TOKENS + MOCK_COMPLETION_TOKENS
    # Only the final chunk carries usage.
    assert all(ch.usage is None for ch in chunks[:-1])


def test_legacy_completions(client):
    resp = client.completions.create(model="gpt-4o-mini", prompt="Say hello.")
    assert resp.choices[0].text == MOCK_TEXT
    assert resp.usage.prompt_tokens == MOCK_PROMPT_TOKENS
    assert resp.usage.completion_tokens == MOCK_COMPLETION_TOKENS


# --------------------------------------------------------------------- embeddings


def test_embeddings_one_vector_per_input(client):
    inputs = ["alpha", "beta", "gamma"]
    resp = client.embeddings.create(model="text-embedding-3-small", input=inputs)
    assert len(resp.data) == len(inputs)
    assert sorted(d.index for d in resp.data) == list(range(len(inputs)))
    dims = {len(d.embedding) for d in resp.data}
    assert len(dims) == 1 and dims.pop() > 0
    assert all(isinstance(x, float) for d in resp.data for x in d.embedding)


def test_embeddings_single_string(client):
    resp = client.embeddings.create(model="text-embedding-3-small", input="alpha")
    assert len(resp.data) == 1
    assert len(resp.data[0].embedding) > 0


# ------------------------------------------------------------------------- models


def test_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert "gpt-4o-mini" in ids
    assert "text-embedding-3-small" in ids


# ------------------------------------------------------------------------ errors


def test_bad_token_is_401(sluice):
    bad = OpenAI(base_url=sluice.base_url, api_key=BOGUS_TOKEN, max_retries=0, timeout=10.0)
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.chat.completions.create(model="gpt-4o-mini", messages=chat_messages())
    assert ei.value.status_code == 401
    assert ei.value.code == "invalid_api_key"


def test_revoked_token_is_401_within_1_5s(sluice):
    info = sluice.issue_token("bob", "1")
    c = OpenAI(base_url=sluice.base_url, api_key=info["token"], max_retries=0, timeout=10.0)
    # Works before revocation.
    r = c.chat.completions.create(model="gpt-4o-mini", messages=chat_messages())
    assert r.choices[0].message.content == MOCK_TEXT

    sluice.cli("token", "revoke", str(info["id"]))
    revoked_at = time.monotonic()
    last = None
    while True:
        try:
            c.chat.completions.create(model="gpt-4o-mini", messages=chat_messages())
            last = "200"
        except openai.AuthenticationError as e:
            assert e.status_code == 401
            break
        if time.monotonic() - revoked_at > 1.5:
            pytest.fail(f"revoked token still accepted 1.5 s after revocation (last: {last})")
        time.sleep(0.1)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=chat_messages())
    assert ei.value.status_code == 404
    assert ei.value.code == "model_not_found"


# ------------------------------------------------------------ what the mock saw


def test_upstream_receives_only_the_upstream_key(sluice):
    stats = sluice.mock_stats()
    keys = stats["keys"]
    assert UPSTREAM_KEY in keys, f"mock saw no request with the upstream key: {list(keys)}"
    for k in keys:
        assert not k.startswith("sk-sl-"), f"a sub-token reached the upstream as a key: {k[:10]}…"
    entry = keys[UPSTREAM_KEY]
    assert entry["count"] > 0
    assert entry["last_headers"], "mock recorded no headers"
    for headers in entry["last_headers"]:
        lower = {k.lower(): v for k, v in headers.items()}
        assert lower.get("authorization") == f"Bearer {UPSTREAM_KEY}"
    blob = json.dumps(stats)
    for tok in sluice.issued_tokens + [BOGUS_TOKEN]:
        assert tok not in blob, "sub-token text reached the upstream"
        assert tok[6:] not in blob, "sub-token secret part reached the upstream"
    assert "sk-sl-" not in blob


# ------------------------------------------------------ secrets at rest (LAST)


def _secret_needles(sluice):
    needles = {}
    for i, tok in enumerate(sluice.issued_tokens + [BOGUS_TOKEN]):
        needles[f"sub-token #{i}"] = tok.encode()
        needles[f"sub-token #{i} (without prefix)"] = tok[6:].encode()
    needles["upstream key"] = UPSTREAM_KEY.encode()
    needles["anthropic upstream key"] = ANTHROPIC_UPSTREAM_KEY.encode()
    needles["upstream key (secret part)"] = UPSTREAM_KEY.split("-", 2)[-1].encode()
    return needles


def _scan(files, needles):
    found = []
    for path in files:
        if not path.exists():
            continue
        data = path.read_bytes()
        for name, needle in needles.items():
            if needle in data:
                found.append(f"{name} in {path.name}")
    return found


def test_zz_no_secrets_in_logs_or_database(sluice):
    assert len(sluice.issued_tokens) >= 2
    needles = _secret_needles(sluice)
    log_files = [sluice.gateway_log, sluice.gateway_out]

    # The request log line is written after the answer; give it a moment.
    time.sleep(0.3)
    log_text = sluice.gateway_log.read_text(errors="replace")
    assert '"request"' in log_text, "gateway wrote no request log lines (scan would be vacuous)"

    def scan_store_and_logs(when):
        store_files = sluice.store_files()
        # The scan reads where the rows are: the user every token was issued to is there.
        assert _scan(store_files, {"user": b"alice"}), f"no stored row found in {sluice.store} files {when} (scan would be vacuous)"
        found = _scan(log_files + store_files, needles)
        assert not found, f"secrets found {when} ({sluice.store}): {found}"

    scan_store_and_logs("while running")
    # Stop the gateway (flushes buffers, checkpoints the WAL) and scan again.
    sluice.stop_gateway()
    scan_store_and_logs("after shutdown")


def test_zzz_money_invariant_after_shutdown(sluice):
    """CHECKS.md's invariant on the whole session's traffic, on whichever engine ran it:
    per token, user and team with a limit, limit − remaining == the ledger of its period
    and nothing reserved once the gateway stopped; every logged request's cost is its
    ledger sum; and the check is not vacuous (money moved, requests were logged)."""
    sluice.stop_gateway()
    for table, id_col, period_col in (
        ("tokens", "token_id", "period"),
        ("users", "user_id", "user_period"),
        ("teams", "team_id", "team_period"),
    ):
        rows = sluice.query(
            f"""SELECT t.id, t.limit_micros - t.remaining_micros, t.reserved_micros,
                       CAST(COALESCE((SELECT SUM(l.amount_micros) FROM ledger l
                                      WHERE l.{id_col} = t.id AND l.{period_col} = t.period
                                        AND l.kind IN ('reserve', 'settle', 'adjust')), 0) AS BIGINT)
                FROM {table} t WHERE t.limit_micros IS NOT NULL"""
        )
        if table == "tokens":
            assert rows, f"no token with a budget on {sluice.store} (check would be vacuous)"
        for tid, used, reserved, ledger in rows:
            assert used == ledger, f"{table} {tid}: limit − remaining {used} ≠ ledger {ledger} ({sluice.store})"
            assert reserved == "0", f"{table} {tid}: {reserved} µ$ still reserved after shutdown ({sluice.store})"
    disagree = sluice.query(
        """SELECT r.id, r.cost_micros, l.total FROM requests r
           JOIN (SELECT request_id, CAST(SUM(amount_micros) AS BIGINT) AS total FROM ledger
                 WHERE kind IN ('reserve', 'settle', 'absorbed') AND request_id IS NOT NULL
                 GROUP BY request_id) l ON l.request_id = r.id
           WHERE r.cost_micros <> l.total"""
    )
    assert not disagree, f"request log ≠ ledger (id, log, ledger) on {sluice.store}: {disagree}"
    [(charged, logged)] = sluice.query(
        "SELECT (SELECT COUNT(*) FROM ledger WHERE kind = 'settle' AND amount_micros <> 0),"
        " (SELECT COUNT(*) FROM requests WHERE status = 200 AND cost_micros > 0)"
    )
    assert int(charged) > 0 and int(logged) > 0, f"no money moved on {sluice.store} (check would be vacuous)"
    if sluice.store == "sqlite":
        assert sluice.query("PRAGMA integrity_check") == [("ok",)]
