"""Fixtures for the SDK compatibility suite.

Per test session: pick free ports, write a config into a temp dir, start
`sluice mock` and `sluice serve` as subprocesses, wait for /healthz, issue a
sub-token through the CLI. Everything is torn down at the end of the session.

The binary is taken from $SLUICE_BIN, default <repo>/target/debug/sluice.
This suite builds nothing: run `cargo build` first.

The gateway's database is a SQLite file in the temp dir, or with
TEST_STORE=postgres (the api suite's variable) a database on a throwaway
PostgreSQL server of this session (scripts/pg-scratch.sh), the master key
every PostgreSQL gateway needs in a 0600 `[database] key_file`.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO_ROOT / "target" / "debug" / "sluice"

UPSTREAM_KEY = "sk-upstream-canary-AAAA1111"
ANTHROPIC_UPSTREAM_KEY = "sk-ant-upstream-canary-BBBB2222"
AZURE_UPSTREAM_KEY = "az-upstream-canary-CCCC3333"
GEMINI_UPSTREAM_KEY = "gem-upstream-canary-DDDD4444"
MOCK_TEXT = (
    "Hello from the Sluice mock upstream. "
    "This answer is fixed so that tests can check every byte of it."
)
MOCK_PROMPT_TOKENS = 12
MOCK_COMPLETION_TOKENS = 24

STORE = os.environ.get("TEST_STORE", "sqlite")
PG_SCRATCH = REPO_ROOT / "scripts" / "pg-scratch.sh"

COMPAT_UPSTREAM_KEY = "sk-compat-upstream-canary-EEEE5555"
BEDROCK_UPSTREAM_KEY = "bedrock-sdk-key"


@dataclass(frozen=True)
class Model:
    """A model the gateway serves: its name, the upstream's model, prices per million."""

    name: str
    upstream_model: str
    input_usd: float
    # A price names its output too (0 for an embedding model): none at all is refused.
    output_usd: float
    # Azure OpenAI: the deployment the route calls.
    deployment: str | None = None


@dataclass(frozen=True)
class Upstream:
    """One upstream of the session's config, on the session's `sluice mock`.

    `path` is what its `base_url` adds to the mock's address (`/v1` for OpenAI-format
    kinds, as their SDKs take it); `settings` are the kind's own config keys. Adding a
    provider kind to every SDK test is one row of `UPSTREAMS`."""

    id: str
    kind: str
    key: str
    models: tuple[Model, ...]
    path: str = ""
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def model(self) -> str:
        """The upstream's chat model (its first)."""
        return self.models[0].name


UPSTREAMS = (
    Upstream("mock-a", "openai", UPSTREAM_KEY, path="/v1", models=(
        Model("gpt-4o-mini", "gpt-4o-mini", 0.15, 0.60),
        Model("text-embedding-3-small", "text-embedding-3-small", 0.02, 0.0),
    )),
    Upstream("mock-claude", "anthropic", ANTHROPIC_UPSTREAM_KEY, models=(
        Model("claude-mock", "claude-mock-upstream", 0.80, 4.00),
    )),
    Upstream("mock-gemini", "gemini", GEMINI_UPSTREAM_KEY, models=(
        Model("gemini-mock", "gemini-mock-upstream", 0.30, 2.50),
    )),
    Upstream("mock-bedrock", "bedrock", BEDROCK_UPSTREAM_KEY, settings=(("region", "us-east-1"),), models=(
        Model("claude-bedrock", "anthropic.claude-3-5-sonnet-20240620-v1:0", 3.0, 15.0),
    )),
    Upstream("mock-azure", "azure_openai", AZURE_UPSTREAM_KEY, settings=(("api_version", "2024-10-21"),), models=(
        Model("azure-mini", "gpt-4o-mini", 0.15, 0.60, deployment="sdk-deployment"),
    )),
    Upstream("mock-compat", "openai_compatible", COMPAT_UPSTREAM_KEY, path="/v1", models=(
        Model("compat-mini", "compat-mini-upstream", 0.15, 0.60),
    )),
)


def upstream_of(kind: str) -> Upstream:
    return next(u for u in UPSTREAMS if u.kind == kind)


# The kinds a Responses API request reaches through the internal form (translated).
TRANSLATED_KINDS = ("azure_openai", "openai_compatible", "gemini", "bedrock")


def config_text(gw_port: int, mock_port: int, database: str, backup_dir: Path) -> str:
    """The session's config: the server, the store, and every row of `UPSTREAMS`."""
    out = [
        f'[server]\nlisten = "127.0.0.1:{gw_port}"\n',
        f"[database]\n{database}\n",
        f'[backup]\ndir = "{backup_dir}"\n',
        "[ratelimit]\nwindow_seconds = 2\n",
    ]
    for u in UPSTREAMS:
        lines = [
            "[[upstreams]]",
            f'id = "{u.id}"',
            f'provider = "{u.kind}"',
            f'base_url = "http://127.0.0.1:{mock_port}{u.path}"',
            f'api_key = "{u.key}"',
            "allow_private_network = true",
            *(f'{k} = "{v}"' for k, v in u.settings),
        ]
        out.append("\n".join(lines) + "\n")
        for m in u.models:
            route = f'upstream = "{u.id}", model = "{m.upstream_model}"'
            if m.deployment:
                route += f', deployment = "{m.deployment}"'
            lines = [
                "[[models]]",
                f'name = "{m.name}"',
                f"routes = [{{ {route} }}]",
                f"input_usd_per_mtok = {m.input_usd}",
                f"output_usd_per_mtok = {m.output_usd}",
            ]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# SIGTERM ends the session as Ctrl-C does: through the fixtures' teardown, so the gateway,
# the mock and the PostgreSQL server stop with it (Python would die without it).
signal.signal(signal.SIGTERM, _interrupt)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(method: str, url: str, body=None, headers=None, timeout=5.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else None)


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout=15.0):
    deadline = time.monotonic() + timeout
    last_err = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.returncode} before {url} answered; "
                f"log:\n{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            last_err = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} not healthy after {timeout}s (last error: {last_err})")


def stop(proc: subprocess.Popen | None, timeout=5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


@dataclass
class Sluice:
    bin: Path
    workdir: Path
    config_path: Path
    db_path: Path  # the SQLite file (unused on PostgreSQL)
    gw_port: int
    mock_port: int
    gateway_log: Path
    gateway_out: Path
    mock_log: Path
    token: str = ""
    token_id: int = 0
    gateway: subprocess.Popen | None = None
    mock: subprocess.Popen | None = None
    # Every sub-token text issued during the session (for the leak check).
    issued_tokens: list[str] = field(default_factory=list)
    store: str = "sqlite"
    # The throwaway PostgreSQL server's folder (its data under data/), on PostgreSQL.
    pg_dir: Path | None = None
    pg_url: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}/v1"

    @property
    def mock_url(self) -> str:
        return f"http://127.0.0.1:{self.mock_port}"

    def cli(self, *args: str, check=True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin), "--config", str(self.config_path), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if check and res.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
            )
        return res

    def issue_token(self, user: str, budget_usd: str = "5", *extra: str) -> dict:
        res = self.cli("token", "issue", "--user", user, "--budget-usd", budget_usd, "--json", *extra)
        info = json.loads(res.stdout)
        self.issued_tokens.append(info["token"])
        return info

    def mock_stats(self) -> dict:
        _, body = http_json("GET", f"{self.mock_url}/_mock/stats")
        return body

    def stop_gateway(self) -> None:
        stop(self.gateway)

    def query(self, sql: str) -> list[tuple[str, ...]]:
        """Rows of one SELECT on the gateway's database, each value as text (NULL as "")."""
        if self.store == "postgres":
            res = subprocess.run(
                ["psql", self.pg_url, "-v", "ON_ERROR_STOP=1", "-tAF", "\t", "-c", sql],
                check=True, capture_output=True, text=True, timeout=60,
            )
            return [tuple(line.split("\t")) for line in res.stdout.splitlines() if line]
        con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=10)
        try:
            return [tuple("" if v is None else str(v) for v in row) for row in con.execute(sql)]
        finally:
            con.close()

    def store_files(self) -> list[Path]:
        """Every file the store's data can be in: the SQLite file and its WAL, or the
        PostgreSQL server's whole data folder after a CHECKPOINT (tables, WAL, indexes)."""
        if self.store == "postgres":
            subprocess.run(
                ["psql", self.pg_url, "-v", "ON_ERROR_STOP=1", "-qc", "CHECKPOINT"],
                check=True, capture_output=True, timeout=60,
            )
            return sorted(p for p in (self.pg_dir / "data").rglob("*") if p.is_file())
        db = self.db_path
        return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]


def start_postgres(owner_pid: int) -> tuple[Path, str]:
    """A throwaway PostgreSQL server and an empty database on it (scripts/pg-scratch.sh):
    its folder and the database's URL."""
    res = subprocess.run(
        [str(PG_SCRATCH), "start", str(owner_pid)], capture_output=True, text=True, timeout=180
    )
    if res.returncode != 0:
        raise RuntimeError(f"pg-scratch.sh start failed ({res.returncode}):\n{res.stderr}")
    values = dict(shlex.split(line)[0].split("=", 1) for line in res.stdout.splitlines() if line)
    return Path(values["PG_SCRATCH_DIR"]), values["PG_SCRATCH_URL"]


def stop_postgres(pg_dir: Path) -> None:
    subprocess.run([str(PG_SCRATCH), "stop", str(pg_dir)], timeout=120)


@pytest.fixture(scope="session")
def pg_scratch():
    """With TEST_STORE=postgres, the session's throwaway PostgreSQL server: its folder and
    the URL of an empty database on it; stopped and removed after the gateway."""
    if STORE != "postgres":
        yield None, ""
        return
    pg_dir, pg_url = start_postgres(os.getpid())
    try:
        yield pg_dir, pg_url
    finally:
        stop_postgres(pg_dir)


@pytest.fixture(scope="session")
def sluice(tmp_path_factory, pg_scratch) -> Sluice:
    bin_path = Path(os.environ.get("SLUICE_BIN", str(DEFAULT_BIN))).resolve()
    if not bin_path.is_file():
        pytest.exit(
            f"sluice binary not found at {bin_path}; run `cargo build` or set SLUICE_BIN",
            returncode=2,
        )

    workdir = tmp_path_factory.mktemp("sluice-sdk")
    gw_port, mock_port = free_port(), free_port()
    while mock_port == gw_port:
        mock_port = free_port()
    if STORE not in ("sqlite", "postgres"):
        pytest.exit(f"TEST_STORE={STORE}: expected sqlite or postgres", returncode=2)
    db_path = workdir / "sluice.db"
    pg_dir, pg_url = pg_scratch
    if STORE == "postgres":
        key_file = workdir / "master.key"
        key_file.write_text(secrets.token_hex(32) + "\n")
        key_file.chmod(0o600)
        database = f'url = "{pg_url}"\nkey_file = "{key_file}"'
    else:
        database = f'url = "sqlite://{db_path}"'  # absolute path -> sqlite:///abs/path
    config_path = workdir / "sluice.toml"
    config_path.write_text(
        config_text(gw_port, mock_port, database, workdir / "backup")  # audit.head: never the repository's backup/
    )

    s = Sluice(
        bin=bin_path,
        workdir=workdir,
        config_path=config_path,
        db_path=db_path,
        gw_port=gw_port,
        mock_port=mock_port,
        gateway_log=workdir / "gateway.stderr.log",
        gateway_out=workdir / "gateway.stdout.log",
        mock_log=workdir / "mock.log",
        store=STORE,
        pg_dir=pg_dir,
        pg_url=pg_url,
    )

    env = dict(os.environ)
    # Config must come from the file only (no stray SLUICE_* overrides from the caller).
    for k in list(env):
        if k.startswith("SLUICE_") and k != "SLUICE_BIN":
            del env[k]

    mock_fh = open(s.mock_log, "wb")
    gw_err = open(s.gateway_log, "wb")
    gw_out = open(s.gateway_out, "wb")
    try:
        s.mock = subprocess.Popen(
            [str(bin_path), "mock", "--listen", f"127.0.0.1:{mock_port}"],
            stdout=mock_fh, stderr=subprocess.STDOUT, env=env, cwd=workdir,
        )
        s.cli("migrate")
        if STORE == "postgres":
            # The suite runs on the engine it says: the tables are in PostgreSQL, no SQLite file.
            res = subprocess.run(
                ["psql", pg_url, "-tAc", "SELECT count(*) FROM information_schema.tables WHERE table_name = 'tokens'"],
                capture_output=True, text=True, timeout=30, check=True,
            )
            assert res.stdout.strip() == "1", f"no tokens table on {pg_url}: {res.stdout!r}"
            assert not db_path.exists(), f"{db_path} exists on TEST_STORE=postgres"
        s.gateway = subprocess.Popen(
            [str(bin_path), "--config", str(config_path), "serve"],
            stdout=gw_out, stderr=gw_err, env=env, cwd=workdir,
        )
        wait_healthy(f"http://127.0.0.1:{gw_port}/healthz", s.gateway, s.gateway_log)
        # The mock has no /healthz; its stats endpoint tells us it is up.
        deadline = time.monotonic() + 10
        while True:
            if s.mock.poll() is not None:
                raise RuntimeError(f"mock exited: {s.mock_log.read_text(errors='replace')}")
            try:
                s.mock_stats()
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        info = s.issue_token("alice", "5")
        s.token, s.token_id = info["token"], info["id"]
        yield s
    finally:
        stop(s.gateway)
        stop(s.mock)
        for fh in (mock_fh, gw_err, gw_out):
            fh.close()


@pytest.fixture(scope="session")
def client(sluice):
    from openai import OpenAI

    return OpenAI(base_url=sluice.base_url, api_key=sluice.token, max_retries=0, timeout=10.0)
