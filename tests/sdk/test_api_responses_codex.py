"""Codex CLI (`@openai/codex`, installed under tests/sdk/codex by scripts/test-deps.sh)
with a custom provider whose `base_url` is Sluice and `wire_api = "responses"`:
`codex exec` completes one turn against the mock.

Named to sort before test_openai_sdk.py, whose last tests stop the session's gateway.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import MOCK_TEXT, REPO_ROOT, UPSTREAM_KEY

CODEX = Path(os.environ.get("CODEX_BIN", REPO_ROOT / "tests" / "sdk" / "codex" / "node_modules" / ".bin" / "codex"))


def test_codex_exec_completes_one_turn(sluice, tmp_path):
    if not CODEX.exists():
        pytest.skip(f"codex not installed at {CODEX} (scripts/test-deps.sh installs it)")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f"""\
model = "gpt-4o-mini"
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
    before = len(sluice.mock_stats()["keys"].get(UPSTREAM_KEY, {}).get("last_paths", []))
    res = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", "read-only", "Say hello."],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    stats = sluice.mock_stats()["keys"].get(UPSTREAM_KEY, {})
    assert res.returncode == 0, f"codex exited {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"
    assert MOCK_TEXT in res.stdout, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-4000:]}"
    paths = stats.get("last_paths", [])
    assert len(paths) > before and paths[-1] == "/v1/responses", paths
