//! Each parsed command handed to its implementation: the ones that need no database
//! first (`mock`, `migrate-store`, `serve`, `check-config`), then those that open it. A
//! command that wrote audit rows leaves the signed audit head following them.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::args::{
    AdminCommand, AuditCommand, CacheCommand, Cli, Command, SecretsCommand, TeamCommand,
    TokenCommand, UserCommand,
};
use super::token_commands::BudgetFlags;
use super::{IssueArgs, UserArgs};
use crate::config;
use crate::store::Db;

/// Runs the command `args` names.
pub async fn run(args: Cli) -> anyhow::Result<()> {
    let now = Utc::now();
    if let Command::Mock {
        listen,
        workers,
        text,
    } = &args.command
    {
        return super::mock::run(listen, *workers, text.as_deref()).await;
    }
    if let Command::MigrateStore { from, to } = &args.command {
        return super::store_copy::migrate_store(from, to, now).await;
    }
    let settings = config::load(args.config.as_deref())?;
    if let Command::Serve { demo: true, .. } = args.command {
        return super::demo::serve_demo(settings).await;
    }
    if let Command::CheckConfig = args.command {
        return super::check_config::check_config(&settings);
    }
    if let Command::Serve {
        demo: false,
        ladder,
    } = args.command
    {
        return super::serve::serve(settings, ladder, args.config.clone()).await;
    }
    settings.validate()?;
    if let Command::Restore { file } = &args.command {
        return super::backup::restore(&settings, file, now).await;
    }
    if let Command::Secrets {
        command: SecretsCommand::Rotate { new_key_file },
    } = &args.command
    {
        return super::rotate::rotate(&settings, new_key_file.as_deref(), now).await;
    }
    if let Command::Reconcile {
        provider,
        files,
        json,
    } = &args.command
    {
        let code = super::reconcile::run(&settings, *provider, files, *json, now).await?;
        std::process::exit(code);
    }
    let db = match args.command {
        Command::Audit {
            command: AuditCommand::Verify,
        } => Db::connect_to_verify(&settings).await?,
        _ => Db::connect(&settings).await?,
    };
    match args.command {
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
            super::tenant_commands::team_create(&db, &name, budget, tags, now).await?;
        }
        Command::Team {
            command: TeamCommand::Edit { name, tags },
        } => super::tenant_commands::team_edit(&db, &name, &tags, now).await?,
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
            super::tenant_commands::user_create(&db, &args, now).await?;
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
            super::admin_commands::create(&db, who, password_stdin, break_glass, now).await?;
        }
        Command::Admin {
            command: AdminCommand::Unlock { username },
        } => super::admin_commands::unlock(&db, &username, now).await?,
        Command::Admin {
            command:
                AdminCommand::ResetPassword {
                    username,
                    password_stdin,
                },
        } => super::admin_commands::reset_password(&db, &username, password_stdin, now).await?,
        Command::Backup { to } => super::backup::backup_now(&db, &settings, to, now).await?,
        Command::Cache {
            command: CacheCommand::Invalidate { tag },
        } => super::cache::invalidate(&db, &tag, now).await?,
        Command::Audit {
            command: AuditCommand::Verify,
        } => return super::audit_commands::verify(db, &settings).await,
        Command::Audit {
            command: AuditCommand::Rearm { reason },
        } => return super::audit_commands::rearm(db, &settings, &reason, now).await,
        Command::Serve { .. }
        | Command::CheckConfig
        | Command::Mock { .. }
        | Command::MigrateStore { .. }
        | Command::Secrets { .. }
        | Command::Reconcile { .. }
        | Command::Restore { .. } => {}
    }
    super::export_audit_head(
        &db,
        Path::new(&settings.backup.dir),
        &settings.backup.head_name,
        now,
    )
    .await;
    db.close().await;
    Ok(())
}

/// The token commands, each handed to `cli::token_commands`.
async fn token_command(db: &Db, command: TokenCommand, now: DateTime<Utc>) -> anyhow::Result<()> {
    use super::token_commands as tokens;
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
