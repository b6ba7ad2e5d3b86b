"""The OpenAI Agents SDK (`openai-agents`) through Sluice's Responses API: an agent with
one function tool runs to completion against the mock — a function call on the first
turn, the tool's output sent back, text on the second — natively and translated.

Named to sort before test_openai_sdk.py, whose last tests stop the session's gateway.
"""

from __future__ import annotations

import pytest

from conftest import MOCK_TEXT

agents = pytest.importorskip("agents")


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-mock"])
def test_an_agent_with_one_function_tool_runs_to_completion(sluice, model):
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls = []

    # The chat → Anthropic translation refuses `strict` schemas (Anthropic's tools take
    # none): a translated model's tool is declared without it.
    @function_tool(strict_mode=model != "claude-mock")
    def lookup_vehicle(vin: str) -> str:
        """Find a vehicle by its VIN."""
        calls.append(vin)
        return "A 2019 Golf."

    client = AsyncOpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=20.0)
    agent = Agent(
        name="mechanic",
        instructions="Answer questions about cars.",
        tools=[lookup_vehicle],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )
    result = Runner.run_sync(agent, "Which car is WVWZZZ1JZXW000001?", max_turns=4)
    assert calls == ["WVWZZZ1JZXW000001"]
    assert result.final_output == MOCK_TEXT
