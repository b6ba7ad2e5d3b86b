"""How the official OpenAI SDK reacts to Sluice's two 429s.

`rate_limit_exceeded` (a window is full) carries `Retry-After` and `x-should-retry: true`:
the SDK waits that long and succeeds. `insufficient_quota` (the budget is spent) carries
`x-should-retry: false`: the SDK raises at once, without retrying.
"""

from __future__ import annotations

import time

import openai
import pytest
from openai import OpenAI

MESSAGES = [{"role": "user", "content": "hello"}]


def _mock_count(sluice) -> int:
    return sum(k["count"] for k in sluice.mock_stats()["keys"].values())


def test_rate_limited_sdk_waits_retry_after_and_succeeds(sluice):
    # One request per 2 s window (the session config sets window_seconds = 2).
    info = sluice.issue_token("sdk-window", "5", "--rpm", "1")
    client = OpenAI(base_url=sluice.base_url, api_key=info["token"], max_retries=2, timeout=10.0)
    client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=5)

    raw = OpenAI(base_url=sluice.base_url, api_key=info["token"], max_retries=0, timeout=10.0)
    with pytest.raises(openai.RateLimitError) as err:
        raw.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=5)
    headers = err.value.response.headers
    assert err.value.code == "rate_limit_exceeded"
    assert headers["x-should-retry"] == "true"
    assert 1 <= int(headers["retry-after"]) <= 2

    started = time.monotonic()
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=5)
    waited = time.monotonic() - started
    assert reply.choices[0].message.content
    assert waited >= 0.5, f"the SDK retried without waiting ({waited:.2f} s)"


def test_insufficient_quota_is_not_retried_by_the_sdk(sluice):
    info = sluice.issue_token("sdk-broke", "0.000010")
    client = OpenAI(base_url=sluice.base_url, api_key=info["token"], max_retries=3, timeout=10.0)
    before = _mock_count(sluice)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=100)
    assert time.monotonic() - started < 0.5, "the SDK must not back off and retry"
    assert err.value.code == "insufficient_quota"
    assert err.value.response.headers["x-should-retry"] == "false"
    assert _mock_count(sluice) == before, "nothing reached the upstream"
