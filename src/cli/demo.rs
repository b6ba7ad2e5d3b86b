//! `sluice serve --demo`: the gateway offline, with an in-process mock upstream, an admin
//! and a demo token printed once.

use secrecy::SecretString;

use super::signals::run_until_signalled;
use super::IssueArgs;
use crate::config::{ModelSettings, Provider, RouteSettings, Secret, Settings, UpstreamSettings};
use crate::mock::{MockConfig, MockServer};
use crate::startup::Application;
use crate::store::Db;

/// `serve --demo`: the gateway with an in-process mock upstream, an admin and a token.
pub async fn serve_demo(mut settings: Settings) -> anyhow::Result<()> {
    crate::ops::fd_limit::raise();
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
                tier_model: None,
            }],
            fallbacks: vec![],
            price: crate::config::PriceKeys::usd(0.15, 0.60),
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
    let pw = crate::auth::token::generate().text[6..30].to_string();
    let admin = super::admin_create(&db, "admin", "admin", None, pw.clone(), now).await;
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
    let token = super::token_issue(&db, &args, now).await?;
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
