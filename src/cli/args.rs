//! The `sluice` command line's arguments: every command and its flags (clap's derive).
//! `dispatch` hands each to its implementation.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::Ladder;
use crate::finance::run::Export;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A self-hosted LLM API gateway for teams"
)]
pub struct Cli {
    /// Config file (default: sluice.toml if present, else built-in defaults).
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway (migrates the database first).
    Serve {
        /// Offline demo: an in-process mock upstream, an admin and a demo token printed once.
        #[arg(long)]
        demo: bool,
        /// Benchmark only (bench/README.md): run the request path up to this stage.
        #[arg(long, value_enum, default_value_t = Ladder::All)]
        ladder: Ladder,
    },
    /// Apply database migrations and exit.
    Migrate,
    /// Validate the config and print the effective settings (secrets masked).
    CheckConfig,
    /// Admin accounts for the web UI and admin API.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Teams.
    Team {
        #[command(subcommand)]
        command: TeamCommand,
    },
    /// Users (members who hold sub-tokens).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Sub-tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Write a hot backup of the database now (VACUUM INTO, mode 0600, integrity-checked).
    Backup {
        /// Folder for the backup (default: `[backup] dir`).
        #[arg(long)]
        to: Option<PathBuf>,
    },
    /// Restore a backup into the config's database path (refuses while a gateway runs on it).
    Restore { file: PathBuf },
    /// Copy a SQLite install into an empty PostgreSQL database and verify the copy
    /// (refuses while a gateway runs on the SQLite file).
    MigrateStore {
        /// The SQLite database: sqlite://path.
        #[arg(long)]
        from: String,
        /// The empty PostgreSQL database: postgres://user:pass@host:5432/db.
        #[arg(long)]
        to: String,
    },
    /// The response cache.
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
    /// The audit log.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The master key (upstream keys sealed in the database, the audit chain's key).
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Compare a provider's cost export with Sluice's spend per day, model and account;
    /// stores the run. Exits 0 when every row matches, 3 when a row is past the threshold
    /// (and raises `reconcile_mismatch`), 2 when the file cannot be read.
    Reconcile {
        #[arg(long, value_enum)]
        provider: Export,
        /// The export: OpenAI's Costs API JSON (or the dashboard's cost CSV), Anthropic's
        /// Cost Report JSON; with `--provider openai-usage`, OpenAI's completions Usage API
        /// JSON, compared by tokens (nothing stored). A download's pages saved a file each
        /// are given together.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// A scriptable fake OpenAI + Anthropic upstream for tests and demos.
    Mock {
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: String,
        /// Worker threads.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Answer text (default: a fixed sentence).
        #[arg(long)]
        text: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum AdminCommand {
    Create {
        #[arg(long)]
        username: String,
        #[arg(long)]
        role: String,
        #[arg(long)]
        team: Option<String>,
        /// Read the password from standard input (else SLUICE_ADMIN_PASSWORD, else one is generated and printed).
        #[arg(long)]
        password_stdin: bool,
        /// May sign in with its password even when `[oidc] password_login = false`.
        #[arg(long)]
        break_glass: bool,
    },
    /// Lift the sign-in lock on a login's name (after someone guessed at it).
    Unlock {
        #[arg(long)]
        username: String,
    },
    /// Set a new password for a login: ends its sessions, revokes its API keys, lifts its lock.
    ResetPassword {
        #[arg(long)]
        username: String,
        /// Read the password from standard input (else SLUICE_ADMIN_PASSWORD, else one is generated and printed).
        #[arg(long)]
        password_stdin: bool,
    },
}

#[derive(Subcommand)]
pub enum TeamCommand {
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        budget_usd: Option<String>,
        /// Default tags of the team's requests: key:value,key:value (at most 10).
        #[arg(long)]
        tags: Option<String>,
    },
    /// Change a team's default tags (an empty --tags clears them).
    Edit {
        #[arg(long)]
        name: String,
        #[arg(long)]
        tags: String,
    },
}

#[derive(Subcommand)]
pub enum UserCommand {
    Create {
        #[arg(long)]
        username: String,
        #[arg(long)]
        team: Option<String>,
        #[arg(long)]
        rpm: Option<i64>,
        #[arg(long)]
        tpm: Option<i64>,
        #[arg(long)]
        budget_usd: Option<String>,
        #[arg(long)]
        reset: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Issue a token; its text is printed once and never stored.
    Issue {
        #[arg(long)]
        user: String,
        #[arg(long)]
        budget_usd: Option<String>,
        #[arg(long)]
        reset: Option<String>,
        #[arg(long)]
        expires: Option<String>,
        #[arg(long)]
        rpm: Option<i64>,
        #[arg(long)]
        tpm: Option<i64>,
        /// Allowed models, comma-separated (default: all).
        #[arg(long)]
        models: Option<String>,
        #[arg(long, default_value_t = 2)]
        max_priority: i64,
        #[arg(long)]
        downgrade_model: Option<String>,
        /// Default tags of the token's requests: key:value,key:value (at most 10).
        #[arg(long)]
        tags: Option<String>,
        #[arg(long)]
        json: bool,
    },
    Revoke {
        id: i64,
    },
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change a token's budget without losing its spend.
    Budget {
        id: i64,
        /// New limit in USD (`none` removes the limit).
        #[arg(long)]
        limit_usd: Option<String>,
        /// Raise the limit (and remaining) by this many USD.
        #[arg(long)]
        top_up_usd: Option<String>,
        /// Adjust spend by this many USD (negative returns money), with --reason.
        #[arg(long, allow_hyphen_values = true)]
        adjust_usd: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum CacheCommand {
    /// Delete every entry tagged TAG (x-sluice-cache-tags); running gateways follow within 1 s.
    Invalidate {
        #[arg(long)]
        tag: String,
    },
}

#[derive(Subcommand)]
pub enum SecretsCommand {
    /// Re-encrypt every stored upstream key and re-sign the audit log (checked first under
    /// the current key) and its head under a new master key, in one transaction; refused
    /// while a gateway runs on the database. The current key is read as the gateway reads
    /// it; the new one from --new-key-file or SLUICE_NEW_SECRET_KEY. Key files are never
    /// written: put the new key in place afterwards.
    Rotate {
        /// A 0600 file of 64 hex characters (`openssl rand -hex 32 > FILE; chmod 600 FILE`).
        #[arg(long)]
        new_key_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Check every row, the keyed chain and the signed head (`audit.head` in the backup
    /// folder); exits non-zero naming the first bad row or the head mismatch.
    Verify,
    /// Start a new signed head over the audit log as it is now, after looking into why the
    /// head is missing, forged or does not match (the old one is kept aside; the reason is
    /// recorded in the log).
    Rearm {
        /// Why (recorded in the audit log's `audit.head_started` row).
        #[arg(long)]
        reason: String,
    },
}
