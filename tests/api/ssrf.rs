//! The SSRF guard exercised for real: the real upstream client (reqwest + `GuardedResolver`)
//! sends real requests to a name whose DNS answer the test decides.
//!
//! Why a fixed-answer inner resolver rather than a tiny DNS server: the guard wraps an
//! inner resolver (the system's in production), and the system resolver takes its
//! nameserver from /etc/resolv.conf for the whole process — a test cannot point one client
//! at its own DNS server. Replacing only the innermost lookup keeps everything that matters
//! real: the guard, reqwest's connector, the port taken from the URL, the mock upstream.
//!
//! Safety of the test itself: refused answers never reach a socket. The answers that must
//! pass point at 127.0.0.1, where the mock listens, so a guard that wrongly let a mixed
//! answer through would show up as a request the mock counted.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::json;
use sluice::cache::embed::Embedder;
use sluice::config::{AlertSettings, Secret, Settings, UpstreamTimeouts, WebhookSettings};
use sluice::mock::{MockConfig, MockServer};
use sluice::ops::alerts::Alerter;
use sluice::startup::{Application, StartupError};
use sluice::upstream::catalog::Catalog;
use sluice::upstream::client::UpstreamClient;
use sluice::upstream::UpstreamError;

use crate::helpers::*;

/// Answers every name with the same addresses, and counts the lookups.
struct FixedDns {
    answer: Vec<IpAddr>,
    lookups: AtomicUsize,
}

impl FixedDns {
    fn answering(answer: &[&str]) -> Arc<FixedDns> {
        Arc::new(FixedDns {
            answer: answer.iter().map(|a| a.parse().unwrap()).collect(),
            lookups: AtomicUsize::new(0),
        })
    }
}

impl Resolve for FixedDns {
    fn resolve(&self, _: Name) -> Resolving {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let addrs: Vec<SocketAddr> = self
            .answer
            .iter()
            .map(|ip| SocketAddr::new(*ip, 0))
            .collect();
        Box::pin(async move {
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// One chat call through the real upstream client to `upstream.test:<mock port>`, whose
/// DNS answers `answer`. Returns the outcome, how many lookups ran and what the mock saw.
async fn call_through_dns(
    allow_private: bool,
    answer: &[&str],
) -> (Result<u16, UpstreamError>, usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut settings = test_settings(dir.path(), &mock);
    let port = mock.base_url().rsplit(':').next().unwrap().to_string();
    settings.upstreams[0].base_url = format!("http://upstream.test:{port}/v1");
    settings.upstreams[0].allow_private_network = allow_private;
    settings
        .validate()
        .expect("a public name passes the config check");
    let catalog = Catalog::from_settings(&settings);
    let dns = FixedDns::answering(answer);
    let client = UpstreamClient::with_resolver(&UpstreamTimeouts::default(), dns.clone()).unwrap();
    let body = json!({"model": "gpt-4o-mini-upstream", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]});
    let route = &catalog.model("gpt-4o-mini").unwrap().routes[0];
    let result = client
        .post(
            &catalog.deployments[0],
            catalog.deployments[0].url(route, sluice::endpoint::Endpoint::Chat, false),
            Bytes::from(body.to_string()),
            Instant::now() + Duration::from_secs(10),
            ((None, None), |_| ()),
        )
        .await
        .map(|r| r.status().as_u16());
    (
        result,
        dns.lookups.load(Ordering::SeqCst),
        mock.state.total_count(),
    )
}

#[tokio::test]
async fn dns_answers_upstreams_may_not_reach_are_refused_without_the_opt_in() {
    let refused: &[&[&str]] = &[
        &["127.0.0.1"],                   // loopback
        &["10.0.0.7"],                    // private
        &["169.254.169.254"],             // metadata
        &["100.100.100.200"],             // Alibaba metadata
        &["fd00:ec2::254"],               // AWS metadata over IPv6
        &["64:ff9b::a9fe:a9fe"],          // NAT64 of the metadata address
        &["64:ff9b::7f00:1"],             // NAT64 of loopback
        &["2002:7f00:1::1"],              // 6to4 of loopback
        &["2002:a9fe:a9fe::1"],           // 6to4 of the metadata address
        &["::127.0.0.1"],                 // IPv4-compatible loopback
        &["::ffff:127.0.0.1"],            // IPv4-mapped loopback
        &["fec0::1"],                     // site-local
        &["2001:0:4136:e378::5601:5601"], // Teredo, client = metadata address
    ];
    assert_refused_through_dns(false, refused).await;
}

#[tokio::test]
async fn metadata_in_dns_is_refused_even_with_the_opt_in() {
    // The control: with the opt-in, a name answering loopback reaches the mock.
    let (result, lookups, seen) = call_through_dns(true, &["127.0.0.1"]).await;
    assert_eq!(result.unwrap(), 200);
    assert_eq!((lookups, seen), (1, 1));
    let refused: &[&[&str]] = &[
        &["169.254.169.254"],
        &["169.254.170.2"], // ECS task metadata
        &["100.100.100.200"],
        &["fd00:ec2::254"],
        &["::ffff:169.254.169.254"],
        &["64:ff9b::a9fe:a9fe"],
        // One bad address among good ones refuses the name: the connector would try
        // 127.0.0.1 first, so a guard that only filtered would let this reach the mock.
        &["127.0.0.1", "169.254.169.254"],
        &["127.0.0.1", "64:ff9b::a9fe:a9fe"],
    ];
    assert_refused_through_dns(true, refused).await;
}

/// Each DNS answer in `refused` makes the call fail to connect after one lookup, with
/// nothing reaching the upstream.
async fn assert_refused_through_dns(allow_private: bool, refused: &[&[&str]]) {
    for answer in refused {
        let (result, lookups, seen) = call_through_dns(allow_private, answer).await;
        assert!(
            matches!(result, Err(UpstreamError::Connect(_))),
            "{answer:?}: {result:?}"
        );
        assert_eq!(lookups, 1, "{answer:?}: the name went through the guard");
        assert_eq!(seen, 0, "{answer:?}: nothing reached the upstream");
    }
}

/// The config error that keeps a gateway with `settings` from starting (`url` names the
/// case in a failure).
async fn start_refused(settings: Settings, url: &str) -> String {
    match Application::build(settings).await {
        Err(StartupError::Config(e)) => e.to_string(),
        Err(e) => panic!("{url}: {e}"),
        Ok(_) => panic!("{url}: the gateway started"),
    }
}

#[tokio::test]
async fn base_urls_that_carry_a_forbidden_address_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let cases = [
        ("http://[64:ff9b::a9fe:a9fe]/v1", true),
        ("http://[2002:a9fe:a9fe::1]/v1", true),
        ("http://[::169.254.169.254]/v1", true),
        ("http://100.100.100.200/v1", true),
        ("http://0251.0376.0251.0376/v1", true),
        ("http://[64:ff9b::7f00:1]/v1", false),
        ("http://[fec0::1]/v1", false),
        ("http://[::127.0.0.1]/v1", false),
        ("http://[fe80::1%25eth0]/v1", true),
    ];
    for (url, allow_private) in cases {
        let mut settings = test_settings(dir.path(), &mock);
        settings.upstreams[0].base_url = url.into();
        settings.upstreams[0].allow_private_network = allow_private;
        let e = start_refused(settings, url).await;
        assert!(e.starts_with("upstream `a`: base_url"), "{url}: {e}");
    }
}

/// One embedding through the real `http` embedder to `embed.test:<mock port>`, whose DNS
/// answers `answer`: the outcome, the lookups, what the mock saw.
async fn embed_through_dns(allow_private: bool, answer: &[&str]) -> (bool, usize, u64) {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let port = mock.base_url().rsplit(':').next().unwrap().to_string();
    let dns = FixedDns::answering(answer);
    let embedder = Embedder::http(
        &format!("http://embed.test:{port}/v1"),
        "text-embedding-3-small",
        None,
        allow_private,
        Duration::from_secs(5),
        dns.clone(),
    )
    .unwrap();
    let embedded = embedder.embed("why does the light blink").await.is_ok();
    (
        embedded,
        dns.lookups.load(Ordering::SeqCst),
        mock.state.total_count(),
    )
}

/// Issue 15, SSRF siblings: the `http` cache embedder resolved names without the guard, so
/// a name answering a metadata address was reached. Every refused answer below starts with
/// 127.0.0.1, where the mock listens: an unguarded client connects there first, and the
/// mock counts it (the test never sends anything towards a metadata address).
#[tokio::test]
async fn the_http_embedder_resolves_through_the_guard() {
    assert_eq!(
        embed_through_dns(true, &["127.0.0.1"]).await,
        (true, 1, 1),
        "the control: a local embedding server, opted in"
    );
    let refused: &[(bool, &[&str])] = &[
        (false, &["127.0.0.1"]),
        (false, &["::ffff:127.0.0.1"]),
        (true, &["127.0.0.1", "169.254.169.254"]),
        (true, &["127.0.0.1", "100.100.100.200"]),
        (true, &["127.0.0.1", "fd00:ec2::254"]),
        (true, &["127.0.0.1", "64:ff9b::a9fe:a9fe"]),
    ];
    for (allow_private, answer) in refused {
        let (embedded, lookups, seen) = embed_through_dns(*allow_private, answer).await;
        assert!(!embedded, "{answer:?}");
        assert_eq!(lookups, 1, "{answer:?}: the name went through the guard");
        assert_eq!(seen, 0, "{answer:?}: nothing reached the embedding server");
    }
}

/// The embedder's base URL is checked like an upstream's: metadata never, loopback and
/// private only with `cache.http_allow_private_network`.
#[tokio::test]
async fn an_embedder_url_upstreams_may_not_use_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let cases = [
        (format!("{}/v1", mock.base_url()), false),
        ("http://10.0.0.7/v1".to_string(), false),
        ("http://169.254.169.254/v1".to_string(), true),
        ("http://[::ffff:a9fe:a9fe]/v1".to_string(), true),
        ("http://metadata.google.internal./v1".to_string(), true),
    ];
    for (url, allow_private) in cases {
        let mut settings = test_settings(dir.path(), &mock);
        settings.cache.embedder = "http".into();
        settings.cache.http_model = "m".into();
        settings.cache.http_url = url.clone();
        settings.cache.http_allow_private_network = allow_private;
        let e = start_refused(settings, &url).await;
        assert!(e.contains("cache.http_url"), "{url}: {e}");
    }
}

/// Answers each name from a table and counts the lookups of each.
struct TableDns {
    answers: HashMap<&'static str, Vec<IpAddr>>,
    lookups: parking_lot::Mutex<HashMap<String, usize>>,
}

impl Resolve for TableDns {
    fn resolve(&self, name: Name) -> Resolving {
        *self
            .lookups
            .lock()
            .entry(name.as_str().to_string())
            .or_default() += 1;
        let addrs: Vec<SocketAddr> = self
            .answers
            .get(name.as_str())
            .into_iter()
            .flatten()
            .map(|ip| SocketAddr::new(*ip, 0))
            .collect();
        Box::pin(async move {
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// Issue 15, SSRF siblings: alert webhooks resolved names without the guard. Two hooks on
/// the mock's port: `bad.test` answers loopback and the metadata address (an unguarded
/// client delivers to the mock, in Slack's format), `good.test` loopback alone (delivered,
/// in the generic format). Webhooks are tried in order, each up to four times, so once the
/// generic body has arrived the bad hook is done: it must have delivered nothing.
#[tokio::test]
async fn alert_webhooks_resolve_through_the_guard() {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let port = mock.base_url().rsplit(':').next().unwrap().to_string();
    let hook = |name: &str, format: &str| WebhookSettings {
        url: Secret(secrecy::SecretString::from(format!(
            "http://{name}:{port}/_mock/webhook"
        ))),
        format: format.into(),
    };
    let dns = Arc::new(TableDns {
        answers: HashMap::from([
            (
                "bad.test",
                vec![
                    "127.0.0.1".parse().unwrap(),
                    "169.254.169.254".parse().unwrap(),
                ],
            ),
            ("good.test", vec!["127.0.0.1".parse().unwrap()]),
        ]),
        lookups: parking_lot::Mutex::new(HashMap::new()),
    });
    let settings = AlertSettings {
        webhooks: vec![hook("bad.test", "slack"), hook("good.test", "generic")],
        ..AlertSettings::default()
    };
    let alerter = Alerter::with_resolver(&settings, dns.clone());
    alerter.raise("breaker_open", "a", "breaker opened");
    let mut received = vec![];
    for _ in 0..500 {
        received = mock.state.stats("webhook").last_bodies.into();
        if !received.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(received.len(), 1, "one delivery: {received:?}");
    assert_eq!(
        received[0]["source"], "sluice",
        "the generic hook's: {received:?}"
    );
    assert_eq!(received[0]["kind"], "breaker_open");
    let lookups = dns.lookups.lock().clone();
    assert_eq!(
        lookups.get("bad.test"),
        Some(&4),
        "every attempt refused: {lookups:?}"
    );
    assert_eq!(lookups.get("good.test"), Some(&1));
}

/// A webhook URL is checked at load: metadata addresses never, in any spelling; private
/// addresses and basic auth in the URL are fine (an internal chat relay).
#[tokio::test]
async fn webhook_urls_that_point_at_metadata_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let check = |url: &str| {
        let mut settings = test_settings(dir.path(), &mock);
        settings.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(url.to_string())),
            format: "generic".into(),
        }];
        settings.validate().map_err(|e| e.to_string())
    };
    for url in [
        "http://169.254.169.254/hook",
        "http://2852039166/hook",
        "http://[::ffff:169.254.169.254]/hook",
        "http://100.100.100.200/hook",
        "http://metadata.google.internal/hook",
        "http://hooks.example.com@169.254.169.254/hook",
    ] {
        let err = check(url).expect_err(url);
        assert!(
            err.contains("alert webhook url points at a metadata"),
            "{url}: {err}"
        );
    }
    for url in [
        "http://10.0.0.7/hook",
        "http://127.0.0.1:9/hook",
        "https://user:secret@chat.internal.example/hook",
    ] {
        assert_eq!(check(url), Ok(()), "{url}");
    }
    assert!(check("file:///etc/passwd").is_err());
}

/// The embedder never follows a redirect: the embeddings endpoint answers 307 to the mock's
/// webhook route (a redirect keeps a POST a POST), and nothing arrives there.
#[tokio::test]
async fn the_http_embedder_follows_no_redirect() {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let base = mock.base_url();
    mock.state.sticky(
        "*",
        Some(sluice::mock::Script {
            status: Some(307),
            headers: vec![("location".into(), format!("{base}/_mock/webhook"))],
            ..Default::default()
        }),
    );
    let embedder = Embedder::http(
        &format!("{base}/v1"),
        "text-embedding-3-small",
        None,
        true,
        Duration::from_secs(5),
        Arc::new(sluice::upstream::url_guard::SystemResolver),
    )
    .unwrap();
    let err = embedder.embed("hello").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "embedding failed: embedding server answered 307 Temporary Redirect"
    );
    assert_eq!(mock.state.total_count(), 1, "the embeddings call only");
    assert_eq!(
        mock.state.stats("webhook").count,
        0,
        "the redirect was not followed"
    );
}
