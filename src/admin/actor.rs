//! Who is acting, and the permission rules, in one place. Every operation (HTML or JSON)
//! asks the `Actor` before it reads or writes:
//! - `admin`: everything, every team;
//! - `lead`: their own team only — anything of another team answers 404, as if it did not
//!   exist; never a role change, never a team's budget, never more than the team's budget;
//! - `finance`: reads everything, changes nothing (403).

use std::future::{ready, Ready};

use actix_web::{FromRequest, HttpMessage, HttpRequest};
use chrono::{DateTime, Utc};

use super::error::AdminError;
use crate::store::audit::{self, AuditEntry};
use crate::store::sessions::{self, AdminRow};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    Lead,
    Finance,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "lead" => Some(Role::Lead),
            "finance" => Some(Role::Finance),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Lead => "lead",
            Role::Finance => "finance",
        }
    }
}

/// How the actor authenticated.
#[derive(Debug, Clone)]
pub enum Via {
    /// A browser session; holds the SHA-256 of the session id and the CSRF token.
    Session { id_hash: String, csrf: String },
    /// An admin API key; holds the SHA-256 of the key and its display prefix.
    ApiKey {
        key_hash: crate::auth::token::TokenHash,
        prefix: String,
    },
}

#[derive(Debug, Clone)]
pub struct Actor {
    pub id: i64,
    pub username: String,
    pub role: Role,
    pub team_id: Option<i64>,
    pub address: String,
    pub via: Via,
    /// The name audit rows carry: the username, and for a single sign-on login its
    /// provider's subject and issuer too.
    pub audit_name: String,
    /// Signed in by single sign-on (a login with a provider identity).
    pub sso: bool,
}

/// How audit rows name a single sign-on login: the readable name, the subject, the issuer.
pub fn sso_audit_name(name: &str, issuer: &str, subject: &str) -> String {
    format!("{name} (oidc sub={subject} iss={issuer})")
}

impl Actor {
    pub fn from_row(row: AdminRow, address: String, via: Via) -> Option<Actor> {
        let login = match (&row.oidc_issuer, &row.oidc_subject) {
            (Some(iss), Some(sub)) => sso_audit_name(&row.username, iss, sub),
            _ => row.username.clone(),
        };
        // A key's actions name the key (the prefix its `apikey.create` row shows): a leaked
        // key's are then told from its owner's own, and only that key revoked (s26 attack
        // admin #4).
        let audit_name = match &via {
            Via::ApiKey { prefix, .. } => format!("{login} (api key {prefix})"),
            Via::Session { .. } => login,
        };
        Some(Actor {
            audit_name,
            sso: row.oidc_subject.is_some(),
            role: Role::parse(&row.role)?,
            id: row.id,
            username: row.username,
            team_id: row.team_id,
            address,
            via,
        })
    }

    /// The team this actor's reads are limited to (`None` = every team). A lead without a
    /// team sees nothing (team -1 does not exist).
    pub fn scope(&self) -> Option<i64> {
        match self.role {
            Role::Lead => Some(self.team_id.unwrap_or(-1)),
            Role::Admin | Role::Finance => None,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// May this actor change anything at all?
    pub fn can_write(&self) -> bool {
        self.role != Role::Finance
    }

    /// Credentials and privileges (API keys, logins, passwords, roles) change only in a
    /// signed-in browser session: a leaked API key must not be able to make itself
    /// permanent, directly or through a login it creates or arms.
    pub fn require_session(&self, what: &str) -> Result<(), AdminError> {
        match self.via {
            Via::Session { .. } => Ok(()),
            Via::ApiKey { .. } => Err(AdminError::Forbidden(format!(
                "An API key cannot {what}; do it in a signed-in browser session."
            ))),
        }
    }

    pub fn require_write(&self) -> Result<(), AdminError> {
        if self.can_write() {
            Ok(())
        } else {
            Err(AdminError::read_only())
        }
    }

    /// Admin-only operations: finance is told no (403), a lead is told nothing exists (404).
    pub fn require_admin(&self) -> Result<(), AdminError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::Lead => Err(AdminError::NotFound),
            Role::Finance => Err(AdminError::read_only()),
        }
    }

    /// Pages admins and finance read but leads do not see (audit log, upstreams).
    pub fn require_global_reader(&self) -> Result<(), AdminError> {
        match self.role {
            Role::Admin | Role::Finance => Ok(()),
            Role::Lead => Err(AdminError::NotFound),
        }
    }

    /// Reading something that belongs to `team`: another team's object does not exist for a lead.
    pub fn see_team(&self, team: i64) -> Result<(), AdminError> {
        match self.scope() {
            Some(own) if own != team => Err(AdminError::NotFound),
            _ => Ok(()),
        }
    }

    /// Changing something that belongs to `team`.
    pub fn change_team(&self, team: i64) -> Result<(), AdminError> {
        self.see_team(team)?;
        self.require_write()
    }

    pub fn csrf(&self) -> &str {
        match &self.via {
            Via::Session { csrf, .. } => csrf,
            Via::ApiKey { .. } => "",
        }
    }

    pub fn session_hash(&self) -> Option<&str> {
        match &self.via {
            Via::Session { id_hash, .. } => Some(id_hash),
            Via::ApiKey { .. } => None,
        }
    }

    /// Fails as an ended session (401) unless the credential this actor came with — its
    /// session, or its API key unrevoked — still exists, read inside `tx`. The gate checked
    /// it before the transaction began; a password change, reset or disabling that ended
    /// it since must not be followed by this actor's write (an API key created after the
    /// change revoked every key would outlive it). Inside the admin write lock every
    /// transaction that ends a credential is before or after this one, so what is read
    /// here holds until `tx` commits. One lookup by primary key or unique index.
    pub async fn hold(&self, tx: &mut crate::store::Tx) -> Result<(), AdminError> {
        let live = match &self.via {
            Via::Session { id_hash, .. } => sessions::session_live(tx, id_hash).await?,
            // A role change ends sessions, not keys: a key's write is held to the role and
            // team it was authorized with (final review F1).
            Via::ApiKey { key_hash, .. } => {
                sessions::api_key_live(tx, key_hash, (self.role.as_str(), self.team_id)).await?
            }
        };
        if live {
            Ok(())
        } else {
            Err(AdminError::Unauthorized)
        }
    }

    /// Appends this actor's audit row inside the caller's transaction, after `hold`: every
    /// admin write transaction calls this, so none commits for a credential ended meanwhile.
    pub async fn audit(
        &self,
        tx: &mut crate::store::Tx,
        action: &str,
        target: &str,
        before: Option<&str>,
        after: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), AdminError> {
        self.hold(tx).await?;
        self.audit_held(tx, action, target, before, after, now)
            .await
    }

    /// `audit` for a transaction that called `hold` first and has since ended the caller's
    /// own credential (a password change ends every session, the caller's too).
    pub async fn audit_held(
        &self,
        tx: &mut crate::store::Tx,
        action: &str,
        target: &str,
        before: Option<&str>,
        after: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), AdminError> {
        let entry = AuditEntry {
            actor: &self.audit_name,
            address: &self.address,
            action,
            target,
            before,
            after,
        };
        audit::append(tx, &entry, now).await?;
        Ok(())
    }
}

/// Handlers take `actor: Actor`; `guard` put it there, so without it the route is refused.
impl FromRequest for Actor {
    type Error = AdminError;
    type Future = Ready<Result<Actor, AdminError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<Actor>()
                .cloned()
                .ok_or(AdminError::Unauthorized),
        )
    }
}

/// The client's address of a request: the socket's peer, or behind a trusted reverse proxy
/// the address it forwarded (`client_addr.rs`; a client's own forwarded headers are never
/// believed).
pub fn peer(req: &HttpRequest) -> String {
    crate::client_addr::client_ip(req)
}
