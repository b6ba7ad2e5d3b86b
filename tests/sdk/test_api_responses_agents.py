"""The OpenAI Agents SDK (`openai-agents`) through Sluice's Responses API: an agent with
one function tool runs to completion against the mock — a function call on the first
turn, the tool's output sent back, text on the second — natively (`openai`) and
translated (`anthropic`, `azure_openai`, `openai_compatible`, `gemini`, `bedrock`), with
the tool's `strict` left at the SDK's default (on): where the upstream cannot guarantee
schema-exact arguments it is dropped and announced (`x-sluice-dropped`), not refused.

Named to sort before test_openai_sdk.py, whose last tests stop the session's gateway.
"""

from __future__ import annotations

import json

import pytest

from conftest import MOCK_TEXT, TRANSLATED_KINDS, http_json, upstream_of

agents = pytest.importorskip("agents")


@pytest.mark.parametrize("kind", ["openai", "anthropic", *TRANSLATED_KINDS])
def test_an_agent_with_one_function_tool_runs_to_completion(sluice, kind):
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    up = upstream_of(kind)
    calls = []
    # The mock's first answer calls the tool with a VIN (Bedrock's mock calls with `{}`
    # unless told).
    http_json("POST", f"{sluice.mock_url}/_mock/script", {"key": up.key, "responses": [
        {"tool_arguments": json.dumps({"vin": "WVWZZZ1JZXW000001"})},
    ]})

    @function_tool
    def lookup_vehicle(vin: str) -> str:
        """Find a vehicle by its VIN."""
        calls.append(vin)
        return "A 2019 Golf."

    client = AsyncOpenAI(
        base_url=sluice.base_url,
        api_key=sluice.token,
        max_retries=0,
        timeout=20.0,
    )
    agent = Agent(
        name="mechanic",
        instructions="Answer questions about cars.",
        tools=[lookup_vehicle],
        model=OpenAIResponsesModel(model=up.model, openai_client=client),
    )
    result = Runner.run_sync(agent, "Which car is WVWZZZ1JZXW000001?", max_turns=4)
    assert calls == ["WVWZZZ1JZXW000001"]
    assert result.final_output == MOCK_TEXT
    # Strict arguments are guaranteed by OpenAI's own models (chat completions take
    # `strict` too); elsewhere the hint is dropped on the way (and announced).
    sent = json.dumps(sluice.mock_stats()["keys"][up.key]["last_bodies"][-1])
    strict_kept = kind in ("openai", "azure_openai", "openai_compatible")
    assert ('"strict": true' in sent) == strict_kept, sent
