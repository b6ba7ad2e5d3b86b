//! The run's rules for an attempt held on a full connection.

use std::time::Duration;

use super::departure::bills_nothing;
use super::run::Run;
use crate::error::ApiError;
use crate::upstream::retry::{self, Tier};
use crate::upstream::UpstreamError;

fn url(s: &str) -> reqwest::Url {
    reqwest::Url::parse(s).expect("url")
}

/// Review finding (s19-final, N1): an attempt held at its connection's stream cap never
/// went out. It bills nothing, and no other key of that host (the same connection, by
/// client and origin) is tried; every attempt held is the gateway busy, not the
/// upstream failing.
#[test]
fn an_attempt_held_on_a_full_connection_spares_that_hosts_other_keys() {
    assert!(bills_nothing(Tier::Held));
    assert_eq!(
        retry::classify(&UpstreamError::Held),
        Tier::Held,
        "no breaker count: `ServerError` is the tier that counts"
    );
    let mut run = Run::new();
    let openai = url("https://api.openai.com/v1/chat/completions");
    run.failed(Tier::Held, (false, &openai));
    assert!(run.held_at((false, &url("https://api.openai.com:443/v1/responses"))));
    assert!(
        !run.held_at((true, &openai)),
        "another client, another pool"
    );
    assert!(!run.held_at((false, &url("https://api.anthropic.com/v1/messages"))));
    assert!(!run.held_at((false, &url("http://api.openai.com/v1/chat/completions"))));
    assert!(matches!(
        run.tried(),
        ApiError::UpstreamBusy { retry_after: 1 }
    ));

    // Held and rate limited elsewhere (review finding, s20, S6): every key only resting.
    let anthropic = url("https://api.anthropic.com/v1/messages");
    let mut limited = Run::new();
    limited.failed(Tier::Held, (false, &openai));
    limited.wait(Duration::from_millis(2500));
    limited.failed(Tier::RateLimited, (false, &anthropic));
    assert!(matches!(
        limited.tried(),
        ApiError::ServiceDegraded { retry_after: 3 }
    ));

    run.failed(Tier::ServerError, (false, &anthropic));
    assert!(matches!(run.tried(), ApiError::UpstreamError));
    assert!(!Run::new().held_at((false, &openai)));
}
