//! The `sluice` command line. Parsing only; the work is in the library.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use secrecy::SecretString;

use sluice::cli::{self, BudgetChange, IssueArgs, UserArgs};
use sluice::config::{
    self, Ladder, ModelSettings, Provider, RouteSettings, Secret, Settings, UpstreamSettings,
};
use sluice::finance::run::Export;
use sluice::mock::{MockConfig, MockServer};
use sluice::quota::pricing;
use sluice::startup::Application;
use sluice::store::{tokens, Db};

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
        /// The export: OpenAI's Costs API JSON, Anthropic's Cost Report JSON.
        file: PathBuf,
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

fn usd_arg(s: &str) -> anyhow::Result<i64> {
    let (neg, digits) = s.strip_prefix('-').map_or((false, s), |d| (true, d));
    let m = pricing::parse_usd(digits).with_context(|| format!("`{s}` is not a USD amount"))?;
    Ok(if neg { -m } else { m })
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
        let mut cfg = MockConfig {
            workers: *workers,
            ..MockConfig::default()
        };
        if let Some(t) = text {
            cfg.text = t.clone();
        }
        let mock = MockServer::start(listen, cfg)?;
        println!("sluice mock listening on {}", mock.base_url());
        tokio::signal::ctrl_c().await?;
        return Ok(());
    }
    if let Command::MigrateStore { from, to } = &cli.command {
        let done = sluice::ops::migrate_store::migrate_store(from, to, now).await?;
        println!("copied {from} into the PostgreSQL database:\n{done}");
        return Ok(());
    }
    let settings = config::load(cli.config.as_deref())?;
    if let Command::Serve { demo: true, .. } = cli.command {
        return serve_demo(settings).await;
    }
    if let Command::CheckConfig = cli.command {
        settings.validate()?;
        // The admins' prices are in the database: a model of the file needs a price of
        // its own, a bundled one or `free = true`.
        settings.check_priced(&Default::default(), chrono::Utc::now())?;
        print!("{}", settings.to_masked_toml());
        eprintln!(
            "config ok: {} upstreams, {} models",
            settings.upstreams.len(),
            settings.models.len()
        );
        return Ok(());
    }
    if let Command::Serve {
        demo: false,
        ladder,
    } = cli.command
    {
        let mut settings = settings;
        if ladder != Ladder::All {
            tracing::warn!(?ladder, "benchmark ladder: stages after this one are OFF (no auth below `auth`); never run this in production");
        }
        settings.ladder = ladder;
        return serve(settings, cli.config.clone()).await;
    }
    settings.validate()?;
    if let Command::Restore { file } = &cli.command {
        let target = sluice::ops::backup::restore_target(&settings)?;
        let r = sluice::ops::backup::restore(file, &target, now).await?;
        println!(
            "restored {} into {}: integrity {}, ledger invariant holds for {} tokens",
            file.display(),
            target.display(),
            r.integrity,
            r.tokens_checked
        );
        let dir = PathBuf::from(&settings.backup.dir);
        let db = Db::connect(&settings).await?;
        let why = format!("restore of {}", file.display());
        let rearmed = cli::audit_rearm(&db, &dir, &why, "before-restore", now).await;
        db.close().await;
        println!("{}", rearmed?);
        return Ok(());
    }
    if let Command::Secrets {
        command: SecretsCommand::Rotate { new_key_file },
    } = &cli.command
    {
        let new = sluice::secrets::MasterKey::new_for_rotation(new_key_file.as_deref())?;
        let done = sluice::ops::rotate::rotate(&settings, &new, now).await?;
        println!(
            "rotated to the new master key: {} upstream keys sealed again, {} audit rows signed again, the audit head signed again",
            done.upstream_keys, done.audit_rows
        );
        println!("now put the new key where the gateway reads it ({} or the key file), then start the gateways; keep the old key with the backups made before (they open only under it)", sluice::secrets::ENV);
        return Ok(());
    }
    if let Command::Reconcile {
        provider,
        file,
        json,
    } = &cli.command
    {
        let code = reconcile(&settings, *provider, file, *json, now).await?;
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
            let id = cli::team_create_tagged(&db, &name, budget, tags, now).await?;
            println!("team {name} created (id {id})");
        }
        Command::Team {
            command: TeamCommand::Edit { name, tags },
        } => {
            let id = cli::team_edit_tags(&db, &name, &tags, now).await?;
            println!("team {name} (id {id}) updated");
        }
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
            let id = cli::user_create(&db, &args, now).await?;
            println!("user {username} created (id {id})");
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
            let (pw, generated) = new_password(password_stdin)?;
            let who = (username.as_str(), role.as_str(), team.as_deref());
            let id = cli::admin_create_with(&db, who, pw.clone(), break_glass, now).await?;
            println!("admin {username} ({role}) created (id {id})");
            if break_glass {
                println!("{username} is a break-glass login: its password works even with [oidc] password_login = false");
            }
            if generated {
                println!("password (shown once): {pw}");
            }
        }
        Command::Admin {
            command: AdminCommand::Unlock { username },
        } => {
            let n = cli::admin_unlock(&db, &username, now).await?;
            println!("{username} unlocked ({n} counted sign-in attempts forgotten)");
        }
        Command::Admin {
            command:
                AdminCommand::ResetPassword {
                    username,
                    password_stdin,
                },
        } => {
            let (pw, generated) = new_password(password_stdin)?;
            cli::admin_reset_password(&db, &username, pw.clone(), now).await?;
            println!("password of {username} reset; its sessions ended and API keys revoked");
            if generated {
                println!("password (shown once): {pw}");
            }
        }
        Command::Backup { to } => {
            let dir = to.unwrap_or_else(|| PathBuf::from(&settings.backup.dir));
            let path = sluice::ops::backup::backup_now_locked(&db, &dir, settings.backup.keep, now)
                .await?;
            println!("backup written to {}", path.display());
        }
        Command::Cache {
            command: CacheCommand::Invalidate { tag },
        } => {
            let n = sluice::store::cache::delete_tag(&db, &tag).await?.len();
            println!("{n} cache entries tagged {tag} deleted");
        }
        Command::Audit {
            command: AuditCommand::Verify,
        } => {
            let dir = PathBuf::from(&settings.backup.dir);
            let verdict = cli::audit_verify(&db, &dir).await;
            db.close().await;
            println!("{}", verdict?);
            return Ok(());
        }
        Command::Audit {
            command: AuditCommand::Rearm { reason },
        } => {
            let dir = PathBuf::from(&settings.backup.dir);
            let rearmed = cli::audit_rearm(&db, &dir, &reason, "before-rearm", now).await;
            db.close().await;
            println!("{}", rearmed?);
            return Ok(());
        }
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

/// `sluice reconcile`: the report printed, `reconcile_mismatch` sent when a row is flagged;
/// the exit code (0 all match, 2 unreadable export, 3 flagged).
async fn reconcile(
    settings: &Settings,
    export: Export,
    file: &std::path::Path,
    json: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<i32> {
    use sluice::finance::FinanceError;
    let db = Db::connect(settings).await?;
    let done = sluice::finance::run::reconcile_file(&db, settings, export, file, "cli", now).await;
    let dir = std::path::Path::new(&settings.backup.dir);
    let r = match done {
        Ok(r) => r,
        Err(FinanceError::Unreadable(why)) => {
            db.close().await;
            eprintln!("error: {why}");
            return Ok(2);
        }
        Err(e) => {
            db.close().await;
            return Err(e.into());
        }
    };
    cli::export_audit_head(&db, dir, now).await;
    db.close().await;
    print!("{}", cli::reconcile_report(&r, json));
    if r.run.flagged == 0 {
        return Ok(0);
    }
    let message = format!(
        "{} of {} rows of the {} export {} differ from Sluice's spend past the threshold (reconciliation {})",
        r.run.flagged,
        r.rows.len(),
        r.run.provider,
        r.run.source,
        r.run.id
    );
    let subject = format!("reconciliation:{}", r.run.id);
    sluice::ops::alerts::send_now(&settings.alerts, "reconcile_mismatch", &subject, &message).await;
    Ok(3)
}

/// A new admin password: from standard input, else `SLUICE_ADMIN_PASSWORD`, else a
/// generated one (the flag says whether to print it).
fn new_password(stdin: bool) -> anyhow::Result<(String, bool)> {
    Ok(if stdin {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        (s.trim_end_matches(['\n', '\r']).to_string(), false)
    } else if let Ok(p) = std::env::var("SLUICE_ADMIN_PASSWORD") {
        (p, false)
    } else {
        (
            sluice::auth::token::generate().text[6..30].to_string(),
            true,
        )
    })
}

async fn token_command(
    db: &Db,
    command: TokenCommand,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
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
            let t = cli::token_issue_tagged(db, &args, tags.as_deref(), now).await?;
            let budget = t.limit_micros.map(pricing::usd);
            if json {
                println!(
                    "{}",
                    serde_json::json!({"id": t.id, "token": t.text, "user": user, "budget_usd": budget})
                );
            } else {
                println!(
                    "token {} issued for {user} (budget: {})",
                    t.id,
                    budget.as_deref().unwrap_or("unlimited")
                );
                println!("{}", t.text);
                eprintln!("This is the only time the token is shown.");
            }
        }
        TokenCommand::Revoke { id } => {
            cli::token_revoke(db, id, now).await?;
            println!("token {id} revoked");
        }
        TokenCommand::List { json } => {
            let rows = tokens::list(db).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "{:>5}  {:<10} {:<16} {:<12} {:>14} {:>14}  state",
                    "id", "prefix", "user", "team", "limit", "spent"
                );
                for r in rows {
                    let limit = r
                        .limit_micros
                        .map(pricing::usd)
                        .unwrap_or_else(|| "unlimited".into());
                    let state = if r.revoked { "revoked" } else { "active" };
                    println!(
                        "{:>5}  {:<10} {:<16} {:<12} {:>14} {:>14}  {state}",
                        r.id,
                        r.prefix,
                        r.user,
                        r.team,
                        limit,
                        pricing::usd(r.spent_micros)
                    );
                }
            }
        }
        TokenCommand::Budget {
            id,
            limit_usd,
            top_up_usd,
            adjust_usd,
            reason,
        } => {
            let change = match (limit_usd, top_up_usd, adjust_usd) {
                (Some(l), None, None) => BudgetChange::Limit(if l == "none" {
                    None
                } else {
                    Some(usd_arg(&l)?)
                }),
                (None, Some(t), None) => BudgetChange::TopUp(usd_arg(&t)?),
                (None, None, Some(a)) => {
                    let reason = reason.context("--adjust-usd needs --reason")?;
                    BudgetChange::Adjust {
                        micros: usd_arg(&a)?,
                        reason,
                    }
                }
                _ => bail!("give exactly one of --limit-usd, --top-up-usd, --adjust-usd"),
            };
            cli::token_budget(db, id, change, now).await?;
            println!("token {id} budget updated");
        }
    }
    Ok(())
}

async fn serve(settings: Settings, config: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    sluice::ops::fd_limit::raise();
    let app = Application::build(settings).await?;
    tracing::info!(port = app.port(), "sluice listening");
    let reload = reloader(&app, config);
    run_until_signalled(app, Some(reload)).await
}

/// SIGHUP's action: the config file `config` read again (`ops::reload`).
fn reloader(app: &Application, config: Option<std::path::PathBuf>) -> Reload {
    let state = app.state();
    Box::new(move || {
        let state = state.clone();
        let config = config.clone();
        tokio::spawn(async move {
            sluice::ops::reload::reload_config(&state, config.as_deref()).await;
        });
    })
}

/// Serves until a signal: SIGTERM stops gracefully (requests and streams get
/// `server.shutdown_timeout_seconds`, then the ones still running are ended and settled);
/// SIGINT and SIGQUIT end them at once (settled all the same), also when they come during
/// the grace a SIGTERM gave (an operator's Ctrl-C, a supervisor escalating), and so does a
/// second SIGTERM. See `startup::Shutdown`. SIGHUP runs `reload`.
async fn run_until_signalled(app: Application, reload: Option<Reload>) -> anyhow::Result<()> {
    let shutdown = app.shutdown();
    tokio::spawn(async move {
        let mut signals = StopSignals::new(reload);
        let grace = match signals.next().await {
            Stop::Graceful => shutdown.timeout(),
            Stop::Now => std::time::Duration::ZERO,
        };
        tracing::info!(
            grace_seconds = grace.as_secs(),
            "shutdown: no longer accepting connections"
        );
        if !grace.is_zero() {
            let now = shutdown.clone();
            tokio::spawn(async move {
                signals.next().await;
                tracing::info!("shutdown: a second signal ends the grace");
                now.end_now();
            });
        }
        shutdown.stop(grace).await;
    });
    app.run_until_stopped().await?;
    Ok(())
}

/// What a stop signal asks for.
enum Stop {
    /// SIGTERM: the configured grace.
    Graceful,
    /// SIGINT, SIGQUIT: no grace.
    Now,
}

/// The stop signals, listened for from the start to the end of the process (once one is
/// handled here the default action — ending the process — is gone for good, so every
/// later one must be heard too). SIGHUP is heard too, and does not stop anything: it
/// reloads the config file (`reload`; without one, as in the demo, the log says it is not
/// reloaded).
struct StopSignals {
    #[cfg(unix)]
    unix: Option<[tokio::signal::unix::Signal; 4]>,
    reload: Option<Reload>,
}

/// What SIGHUP runs.
type Reload = Box<dyn Fn() + Send>;

impl StopSignals {
    fn new(reload: Option<Reload>) -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = || {
                Ok::<_, std::io::Error>([
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::quit())?,
                    signal(SignalKind::hangup())?,
                ])
            };
            match listen() {
                Ok(signals) => Self {
                    unix: Some(signals),
                    reload,
                },
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the gateway");
                    Self { unix: None, reload }
                }
            }
        }
        #[cfg(not(unix))]
        Self { reload }
    }

    /// Waits for the next stop signal.
    async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        if let Some([term, int, quit, hup]) = self.unix.as_mut() {
            loop {
                return tokio::select! {
                    _ = term.recv() => Stop::Graceful,
                    _ = int.recv() => Stop::Now,
                    _ = quit.recv() => Stop::Now,
                    _ = hup.recv() => {
                        match &self.reload {
                            Some(reload) => reload(),
                            None => tracing::warn!("SIGHUP: this gateway has no config file to reload; still serving the configuration read at start"),
                        }
                        continue;
                    }
                };
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        Stop::Now
    }
}

/// `serve --demo`: the gateway with an in-process mock upstream, an admin and a token.
async fn serve_demo(mut settings: Settings) -> anyhow::Result<()> {
    sluice::ops::fd_limit::raise();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default())?;
    settings.upstreams = vec![UpstreamSettings {
        id: "mock".into(),
        provider: Provider::Openai,
        base_url: format!("{}/v1", mock.base_url()),
        api_key: Secret(SecretString::from("sk-mock-demo-key")),
        rpm_limit: 0,
        tpm_limit: 0,
        max_concurrent: 0,
        max_queue: 0,
        allow_private_network: true,
        ..Default::default()
    }];
    settings.models = ["gpt-4o-mini", "gpt-4o", "text-embedding-3-small"]
        .iter()
        .map(|name| ModelSettings {
            name: (*name).into(),
            aliases: vec![],
            routes: vec![RouteSettings {
                upstream: "mock".into(),
                model: (*name).into(),
                output_cap_param: None,
                deployment: None,
            }],
            fallbacks: vec![],
            price: sluice::config::PriceKeys::usd(0.15, 0.60),
            prices: vec![],
            free: false,
            max_output_tokens: 4096,
            max_input_tokens: 128_000,
            cache_similarity_threshold: None,
            cache_ignore_identifiers: None,
        })
        .collect();
    settings.validate()?;
    let db = Db::connect(&settings).await?;
    let now = chrono::Utc::now();
    let pw = sluice::auth::token::generate().text[6..30].to_string();
    let admin = cli::admin_create(&db, "admin", "admin", None, pw.clone(), now).await;
    let args = IssueArgs {
        user: "demo",
        budget_usd: Some("5"),
        reset: Some("monthly"),
        expires: None,
        rpm: None,
        tpm: None,
        models: None,
        max_priority: 2,
        downgrade_model: None,
    };
    let token = cli::token_issue(&db, &args, now).await?;
    db.close().await;
    let app = Application::build(settings).await?;
    let url = format!("http://127.0.0.1:{}", app.port());
    println!(
        "Sluice demo at {url} (mock upstream at {})",
        mock.base_url()
    );
    if admin.is_ok() {
        println!("  admin login: admin / {pw}   (shown once)");
    }
    println!("  demo token (5 USD/month, shown once): {}", token.text);
    println!(
        "  try: curl {url}/v1/chat/completions -H 'Authorization: Bearer {}' \\",
        token.text
    );
    println!("         -H 'content-type: application/json' -d '{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'");
    run_until_signalled(app, None).await
}
