"""The official `openai` Python SDK against a real `sluice serve` + `sluice mock`.

Tests run in file order; the last one stops the gateway and scans its log and
database files for secrets, so it must stay last.
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
    db = sluice.db_path
    db_files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    log_files = [sluice.gateway_log, sluice.gateway_out]

    # The request log line is written after the answer; give it a moment.
    time.sleep(0.3)
    log_text = sluice.gateway_log.read_text(errors="replace")
    assert '"request"' in log_text, "gateway wrote no request log lines (scan would be vacuous)"
    assert db.exists() and db.stat().st_size > 0

    found = _scan(log_files + db_files, needles)
    assert not found, f"secrets found while running: {found}"

    # Stop the gateway (flushes buffers, checkpoints the WAL) and scan again.
    sluice.stop_gateway()
    found = _scan(log_files + db_files, needles)
    assert not found, f"secrets found after shutdown: {found}"
