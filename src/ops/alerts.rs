//! Alerts, sent by the gateway itself to the `[alerts]` webhooks (generic JSON, Slack,
//! DingTalk, WeCom): breaker opened, a pool with no key left, an upstream key disabled, a
//! token past its alert threshold, rate limiting degraded, a backup failed, the audit head
//! refused or unwritable, the gateway out of its own descriptors or memory on an upstream
//! connect (`local_resources`), stored keys or models that no longer build a catalog
//! (`catalog_stale`), a reconciliation past its threshold (`reconcile_mismatch`, sent by
//! `sluice reconcile` itself: `send_now`). Each alert is
//! logged; webhooks get at most one per condition per cool-off window, sent by a
//! background task with retries — never on, and never failing, a request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reqwest::dns::Resolve;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::config::{AlertSettings, WebhookSettings};
use crate::ops::metrics;
use crate::upstream::client::guarded;
use crate::upstream::url_guard::SystemResolver;

#[derive(Debug, Clone)]
pub struct Alert {
    pub kind: &'static str,
    /// What the alert is about (an upstream id, a model, a token id…).
    pub subject: String,
    pub message: String,
    pub at: chrono::DateTime<chrono::Utc>,
}

pub struct Alerter {
    tx: Option<mpsc::Sender<Alert>>,
    last: Mutex<HashMap<(&'static str, String), Instant>>,
    cooloff: Duration,
}

const QUEUE: usize = 256;
const ATTEMPTS: u32 = 4;

impl Alerter {
    pub fn new(cfg: &AlertSettings) -> Arc<Self> {
        Self::with_resolver(cfg, Arc::new(SystemResolver))
    }

    /// The alerter over another name resolver (tests answer DNS with fixed addresses);
    /// webhooks are reached through the guard either way.
    pub fn with_resolver(cfg: &AlertSettings, dns: Arc<dyn Resolve>) -> Arc<Self> {
        let tx = (!cfg.webhooks.is_empty()).then(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(deliver(cfg.webhooks.clone(), rx, dns));
            tx
        });
        Arc::new(Self {
            tx,
            last: Mutex::new(HashMap::new()),
            cooloff: Duration::from_secs(cfg.cooloff_seconds),
        })
    }

    /// Logs the alert and queues it for the webhooks unless the same condition was sent
    /// within the cool-off window.
    pub fn raise(&self, kind: &'static str, subject: &str, message: &str) {
        self.try_raise(kind, subject, message);
    }

    /// As `raise`; `false` when the webhooks will not get it (within the cool-off, or the
    /// queue full), for a caller that sends it once (`weekly_digest`) to try again later.
    /// With no webhook, logging it is all there is to do.
    pub fn try_raise(&self, kind: &'static str, subject: &str, message: &str) -> bool {
        tracing::warn!(target: "sluice::alert", kind, subject, message, "alert");
        metrics::alert(kind);
        {
            let mut last = self.last.lock();
            let key = (kind, subject.to_string());
            if last.get(&key).is_some_and(|t| t.elapsed() < self.cooloff) {
                return false;
            }
            last.insert(key, Instant::now());
        }
        let Some(tx) = &self.tx else {
            return true;
        };
        let alert = Alert {
            kind,
            subject: subject.to_string(),
            message: message.to_string(),
            at: chrono::Utc::now(),
        };
        let queued = tx.try_send(alert).is_ok();
        if !queued {
            tracing::error!(kind, "alert queue full; webhook delivery skipped");
        }
        queued
    }
}

/// The webhook body in the receiver's format.
pub fn body(format: &str, a: &Alert) -> Value {
    let text = format!("[Sluice] {}: {} ({})", a.kind, a.message, a.subject);
    match format {
        "slack" => json!({"text": text}),
        "dingtalk" | "wecom" => json!({"msgtype": "text", "text": {"content": text}}),
        _ => {
            json!({"source": "sluice", "kind": a.kind, "subject": a.subject, "message": a.message, "at": a.at})
        }
    }
}

/// Sends queued alerts through a guarded client (`upstream::client::guarded`): a webhook
/// may be on a private network (an internal chat relay), never on a metadata address —
/// whatever its name resolves to at delivery.
async fn deliver(
    hooks: Vec<WebhookSettings>,
    mut rx: mpsc::Receiver<Alert>,
    dns: Arc<dyn Resolve>,
) {
    let client = match guarded(true, dns).timeout(Duration::from_secs(5)).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "alert webhooks disabled: cannot build an HTTP client");
            return;
        }
    };
    while let Some(alert) = rx.recv().await {
        for hook in &hooks {
            post(&client, hook, &alert).await;
        }
    }
}

/// Posts `alert` to `hook`, retried with backoff; `false` when every attempt failed.
async fn post(client: &reqwest::Client, hook: &WebhookSettings, alert: &Alert) -> bool {
    let payload = body(&hook.format, alert);
    for attempt in 0..ATTEMPTS {
        match client.post(hook.url.expose()).json(&payload).send().await {
            Ok(r) if r.status().is_success() => return true,
            outcome => {
                let why = outcome
                    .map(|r| r.status().to_string())
                    .unwrap_or_else(|_| "unreachable".into());
                tracing::warn!(kind = alert.kind, attempt, why = %why, "alert webhook failed");
                if attempt + 1 < ATTEMPTS {
                    tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
                }
            }
        }
    }
    false
}

/// Raises an alert from a command that ends right after (`sluice reconcile`): logged and
/// posted to every webhook before it returns, not queued for a background task the process
/// would not wait for. How many webhooks took it.
pub async fn send_now(
    cfg: &AlertSettings,
    kind: &'static str,
    subject: &str,
    message: &str,
) -> usize {
    tracing::warn!(target: "sluice::alert", kind, subject, message, "alert");
    let client = match guarded(true, Arc::new(SystemResolver))
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "alert webhooks unreachable: cannot build an HTTP client");
            return 0;
        }
    };
    let alert = Alert {
        kind,
        subject: subject.to_string(),
        message: message.to_string(),
        at: chrono::Utc::now(),
    };
    let mut sent = 0;
    for hook in &cfg.webhooks {
        sent += usize::from(post(&client, hook, &alert).await);
    }
    sent
}
