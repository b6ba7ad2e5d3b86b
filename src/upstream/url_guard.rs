//! Where an upstream may point. Base URLs come only from the config; this refuses the ones
//! that would turn the gateway into a tool against its own network (SSRF): metadata and
//! link-local addresses always, loopback and private ranges unless the upstream opts in with
//! `allow_private_network` (local vLLM, Ollama, llama.cpp). The same check runs again on every
//! address DNS returns at request time (`GuardedResolver`), so a name cannot rebind past it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlGuardError {
    #[error("base_url is not a valid URL")]
    Malformed,
    #[error("base_url must use http or https")]
    Scheme,
    #[error("base_url must not carry a user name or password")]
    UserInfo,
    #[error("base_url points at a link-local, metadata, unspecified or multicast address")]
    Forbidden,
    #[error("base_url points at a loopback or private address; set allow_private_network = true to allow it")]
    Private,
}

/// Checks a configured base URL. IP literals in any spelling (`2130706433`, `0x7f000001`,
/// `[::ffff:127.0.0.1]`) are normalised by the URL parser before the address test.
pub fn check_base_url(raw: &str, allow_private: bool) -> Result<(), UrlGuardError> {
    let url = url::Url::parse(raw).map_err(|_| UrlGuardError::Malformed)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlGuardError::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlGuardError::UserInfo);
    }
    match url.host() {
        None => Err(UrlGuardError::Malformed),
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), allow_private),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), allow_private),
        Some(url::Host::Domain(name)) => check_name(name, allow_private),
    }
}

fn check_name(name: &str, allow_private: bool) -> Result<(), UrlGuardError> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "metadata.google.internal"
        || name == "metadata"
        || name.ends_with(".internal") && name.starts_with("metadata")
    {
        return Err(UrlGuardError::Forbidden);
    }
    if (name == "localhost" || name.ends_with(".localhost")) && !allow_private {
        return Err(UrlGuardError::Private);
    }
    Ok(())
}

/// The address classes an upstream may never reach, and those it may reach only by opt-in.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), UrlGuardError> {
    let ip = match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    let (forbidden, private) = match ip {
        IpAddr::V4(v4) => (forbidden_v4(v4), private_v4(v4)),
        IpAddr::V6(v6) => (forbidden_v6(v6), private_v6(v6)),
    };
    if forbidden {
        Err(UrlGuardError::Forbidden)
    } else if private && !allow_private {
        Err(UrlGuardError::Private)
    } else {
        Ok(())
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    ip.is_unspecified()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.octets()[0] == 0
}

fn private_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || (o[0] == 100 && (64..128).contains(&o[1]))
        || (o[0] == 198 && (18..20).contains(&o[1]))
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) // AWS metadata over IPv6
}

fn private_v6(ip: Ipv6Addr) -> bool {
    ip.is_loopback() || (ip.segments()[0] & 0xfe00) == 0xfc00 // unique local
}

/// DNS resolution for upstreams that did not opt in to private networks: every address a
/// name resolves to must pass `check_ip`, so DNS cannot point a public name at 127.0.0.1.
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = addrs
                .into_iter()
                .filter(|a| check_ip(a.ip(), false).is_ok())
                .collect();
            if allowed.is_empty() {
                let err: Box<dyn std::error::Error + Send + Sync> =
                    format!("{host} resolves only to addresses upstreams may not reach").into();
                return Err(err);
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_ssrf_targets() {
        use UrlGuardError::*;
        let cases = [
            ("http://169.254.169.254/latest", Forbidden),
            ("http://0.0.0.0:80/v1", Forbidden),
            ("http://[fe80::1]/v1", Forbidden),
            ("http://[fd00:ec2::254]/", Forbidden),
            ("http://metadata.google.internal/", Forbidden),
            ("http://127.0.0.1:8000/v1", Private),
            ("http://2130706433/v1", Private),
            ("http://0x7f000001/v1", Private),
            ("http://[::ffff:127.0.0.1]/v1", Private),
            ("http://[::1]/v1", Private),
            ("http://10.0.0.5/v1", Private),
            ("http://192.168.1.2/v1", Private),
            ("http://localhost:11434/v1", Private),
            ("file:///etc/passwd", Scheme),
            ("http://user:pw@api.openai.com/v1", UserInfo),
            ("not a url", Malformed),
        ];
        for (url, want) in cases {
            assert_eq!(check_base_url(url, false), Err(want), "{url}");
        }
    }

    #[test]
    fn opt_in_allows_private_but_never_metadata() {
        assert_eq!(check_base_url("http://127.0.0.1:8000/v1", true), Ok(()));
        assert_eq!(check_base_url("http://localhost:11434/v1", true), Ok(()));
        assert_eq!(
            check_base_url("http://169.254.169.254/", true),
            Err(UrlGuardError::Forbidden)
        );
        assert_eq!(check_base_url("https://api.openai.com/v1", false), Ok(()));
    }
}
