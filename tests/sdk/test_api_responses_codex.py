"""Codex CLI (`@openai/codex`, installed under tests/sdk/codex by scripts/test-deps.sh)
with a custom provider whose `base_url` is Sluice and `wire_api = "responses"`:
`codex exec` completes one turn against the mock — natively (an `openai` upstream
speaks the Responses API) and translated (`azure_openai`, `openai_compatible`, `gemini`,
`bedrock`: the mock in each format behind Sluice) — and a turn where the model calls
Codex's `exec_command` tool, Codex runs the shell command, and its output reaches the
model on the next request.

Named to sort before test_openai_sdk.py, whose last tests stop the session's gateway.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import MOCK_TEXT, REPO_ROOT, TRANSLATED_KINDS, http_json, upstream_of

CODEX = Path(os.environ.get("CODEX_BIN", REPO_ROOT / "tests" / "sdk" / "codex" / "node_modules" / ".bin" / "codex"))
KINDS = ("openai", *TRANSLATED_KINDS)


def codex_exec(sluice, tmp_path, model: str, prompt: str, sandbox: str) -> subprocess.CompletedProcess:
    if not CODEX.exists():
        pytest.skip(f"codex not installed at {CODEX} (scripts/test-deps.sh installs it)")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f"""\
model = "{model}"
model_provider = "sluice"
# Hosted web search is billed per call, apart from tokens: Sluice refuses it.
web_search = "disabled"

[model_providers.sluice]
name = "Sluice"
base_url = "{sluice.base_url}"
wire_api = "responses"
env_key = "SLUICE_TOKEN"
"""
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "SLUICE_TOKEN": sluice.token,
    }
    return subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", sandbox, prompt],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def upstream_stats(sluice, key: str) -> dict:
    return sluice.mock_stats()["keys"].get(key, {})


def shown(res: subprocess.CompletedProcess) -> str:
    return f"codex exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"


@pytest.mark.parametrize("kind", KINDS)
def test_codex_exec_completes_one_turn(sluice, tmp_path, kind):
    up = upstream_of(kind)
    before = upstream_stats(sluice, up.key).get("count", 0)
    res = codex_exec(sluice, tmp_path, up.model, "Say hello.", "read-only")
    assert res.returncode == 0, shown(res)
    assert MOCK_TEXT in res.stdout, shown(res)
    stats = upstream_stats(sluice, up.key)
    assert stats.get("count", 0) > before, f"the {kind} upstream was not called: {stats}"
    if kind == "openai":
        assert stats["last_paths"][-1] == "/v1/responses", stats["last_paths"]


@pytest.mark.parametrize("kind", KINDS)
def test_codex_runs_a_shell_command_the_model_asks_for(sluice, tmp_path, kind):
    """The mock's first answer calls `exec_command` with a command whose output only a
    shell makes (`$((6*7))` → 42); Codex runs it and sends the output back, which the next
    upstream request carries; the mock's second answer is text."""
    up = upstream_of(kind)
    http_json("POST", f"{sluice.mock_url}/_mock/script", {"key": up.key, "responses": [
        {"tool_arguments": json.dumps({"cmd": "echo sluice-ran-$((6*7))"})},
    ]})
    before = upstream_stats(sluice, up.key).get("count", 0)
    res = codex_exec(sluice, tmp_path, up.model, "Run the check.", "read-only")
    assert res.returncode == 0, shown(res)
    assert MOCK_TEXT in res.stdout, shown(res)
    stats = upstream_stats(sluice, up.key)
    assert stats["count"] >= before + 2, stats.get("count")
    after_call = json.dumps(stats["last_bodies"][-1])
    assert "sluice-ran-42" in after_call, after_call[-3000:]
