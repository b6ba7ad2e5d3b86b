//! The `sluice` command line: the arguments parsed and each command handed to its
//! implementation under `sluice::cli`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use sluice::cli::token_commands::BudgetFlags;
use sluice::cli::{self, IssueArgs, UserArgs};
use sluice::config::{self, Ladder};
use sluice::finance::run::Export;
use sluice::store::Db;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A self-hosted LLM API gateway for teams"
)]
struct Cli {
    /// Config file (default: sluice.toml if present, else built-in defaults).
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
enum AdminCommand {
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
enum TeamCommand {
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
enum UserCommand {
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
enum TokenCommand {
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
enum CacheCommand {
    /// Delete every entry tagged TAG (x-sluice-cache-tags); running gateways follow within 1 s.
    Invalidate {
        #[arg(long)]
        tag: String,
    },
}

#[derive(Subcommand)]
enum SecretsCommand {
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
enum AuditCommand {
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

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        // The redis crate logs every failed node connect and slot refresh of a cluster
        // outage, dozens a second; the gateway's own "windows degraded" line says it once.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,redis=error"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let cli = Cli::parse();
    let now = chrono::Utc::now();
    if let Command::Mock {
        listen,
        workers,
        text,
    } = &cli.command
    {
        return cli::mock::run(listen, *workers, text.as_deref()).await;
    }
    if let Command::MigrateStore { from, to } = &cli.command {
        return cli::store_copy::migrate_store(from, to, now).await;
    }
    let settings = config::load(cli.config.as_deref())?;
    if let Command::Serve { demo: true, .. } = cli.command {
        return cli::demo::serve_demo(settings).await;
    }
    if let Command::CheckConfig = cli.command {
        return cli::check_config::check_config(&settings);
    }
    if let Command::Serve {
        demo: false,
        ladder,
    } = cli.command
    {
        return cli::serve::serve(settings, ladder, cli.config.clone()).await;
    }
    settings.validate()?;
    if let Command::Restore { file } = &cli.command {
        return cli::backup::restore(&settings, file, now).await;
    }
    if let Command::Secrets {
        command: SecretsCommand::Rotate { new_key_file },
    } = &cli.command
    {
        return cli::rotate::rotate(&settings, new_key_file.as_deref(), now).await;
    }
    if let Command::Reconcile {
        provider,
        files,
        json,
    } = &cli.command
    {
        let code = cli::reconcile::run(&settings, *provider, files, *json, now).await?;
        std::process::exit(code);
    }
    let db = match cli.command {
        Command::Audit {
            command: AuditCommand::Verify,
        } => Db::connect_to_verify(&settings).await?,
        _ => Db::connect(&settings).await?,
    };
    match cli.command {
        Command::Migrate => println!(
            "database {} ({}) is up to date",
            settings.database.masked_url(),
            db.engine()
        ),
        Command::Team {
            command:
                TeamCommand::Create {
                    name,
                    budget_usd,
                    tags,
                },
        } => {
            let (budget, tags) = (budget_usd.as_deref(), tags.as_deref());
            cli::tenant_commands::team_create(&db, &name, budget, tags, now).await?;
        }
        Command::Team {
            command: TeamCommand::Edit { name, tags },
        } => cli::tenant_commands::team_edit(&db, &name, &tags, now).await?,
        Command::User {
            command:
                UserCommand::Create {
                    username,
                    team,
                    rpm,
                    tpm,
                    budget_usd,
                    reset,
                },
        } => {
            let args = UserArgs {
                username: &username,
                team: team.as_deref(),
                rpm,
                tpm,
                budget_usd: budget_usd.as_deref(),
                reset: reset.as_deref(),
            };
            cli::tenant_commands::user_create(&db, &args, now).await?;
        }
        Command::Token { command } => token_command(&db, command, now).await?,
        Command::Admin {
            command:
                AdminCommand::Create {
                    username,
                    role,
                    team,
                    password_stdin,
                    break_glass,
                },
        } => {
            let who = (username.as_str(), role.as_str(), team.as_deref());
            cli::admin_commands::create(&db, who, password_stdin, break_glass, now).await?;
        }
        Command::Admin {
            command: AdminCommand::Unlock { username },
        } => cli::admin_commands::unlock(&db, &username, now).await?,
        Command::Admin {
            command:
                AdminCommand::ResetPassword {
                    username,
                    password_stdin,
                },
        } => cli::admin_commands::reset_password(&db, &username, password_stdin, now).await?,
        Command::Backup { to } => cli::backup::backup_now(&db, &settings, to, now).await?,
        Command::Cache {
            command: CacheCommand::Invalidate { tag },
        } => cli::cache::invalidate(&db, &tag).await?,
        Command::Audit {
            command: AuditCommand::Verify,
        } => return cli::audit_commands::verify(db, &settings).await,
        Command::Audit {
            command: AuditCommand::Rearm { reason },
        } => return cli::audit_commands::rearm(db, &settings, &reason, now).await,
        Command::Serve { .. }
        | Command::CheckConfig
        | Command::Mock { .. }
        | Command::MigrateStore { .. }
        | Command::Secrets { .. }
        | Command::Reconcile { .. }
        | Command::Restore { .. } => {}
    }
    cli::export_audit_head(&db, std::path::Path::new(&settings.backup.dir), now).await;
    db.close().await;
    Ok(())
}

/// The token commands, each handed to `cli::token_commands`.
async fn token_command(
    db: &Db,
    command: TokenCommand,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    use cli::token_commands as tokens;
    match command {
        TokenCommand::Issue {
            user,
            budget_usd,
            reset,
            expires,
            rpm,
            tpm,
            models,
            max_priority,
            downgrade_model,
            tags,
            json,
        } => {
            let args = IssueArgs {
                user: &user,
                budget_usd: budget_usd.as_deref(),
                reset: reset.as_deref(),
                expires: expires.as_deref(),
                rpm,
                tpm,
                models: models.as_deref(),
                max_priority,
                downgrade_model: downgrade_model.as_deref(),
            };
            tokens::issue(db, &args, tags.as_deref(), json, now).await
        }
        TokenCommand::Revoke { id } => tokens::revoke(db, id, now).await,
        TokenCommand::List { json } => tokens::list(db, json).await,
        TokenCommand::Budget {
            id,
            limit_usd,
            top_up_usd,
            adjust_usd,
            reason,
        } => {
            let flags = BudgetFlags {
                limit_usd,
                top_up_usd,
                adjust_usd,
                reason,
            };
            tokens::budget(db, id, flags, now).await
        }
    }
}
