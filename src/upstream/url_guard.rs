//! Where an upstream may point. Base URLs come only from the config; this refuses the ones
//! that would turn the gateway into a tool against its own network (SSRF). Two classes:
//! - *forbidden*, always, whatever the upstream's settings: cloud metadata services (AWS,
//!   GCP, Azure, Alibaba, Oracle, ECS task metadata…), link-local, unspecified, multicast,
//!   broadcast and reserved addresses;
//! - *private*, unless the upstream opts in with `allow_private_network` (local vLLM,
//!   Ollama, llama.cpp): loopback, RFC 1918, CGNAT, unique- and site-local IPv6.
//!
//! IPv6 addresses that carry an IPv4 address (IPv4-mapped and -compatible, NAT64, 6to4,
//! Teredo) are classified by the address they carry as well as by their own range, so
//! `64:ff9b::a9fe:a9fe` is the metadata service it translates to.
//!
//! The same check runs again on every address DNS returns at request time
//! (`GuardedResolver`, used by every upstream client): a name cannot rebind past it, and a
//! name with one refused address among several is refused whole.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlGuardError {
    #[error("base_url is not a valid URL")]
    Malformed,
    #[error("base_url must use http or https")]
    Scheme,
    #[error("base_url must not carry a user name or password")]
    UserInfo,
    #[error("base_url must not carry a query or a fragment (`?`, `#`): the paths the gateway appends would end up in it")]
    QueryOrFragment,
    #[error(
        "base_url points at a metadata, link-local, unspecified, multicast or reserved address"
    )]
    Forbidden,
    #[error("base_url points at a loopback or private address; set allow_private_network = true to allow it")]
    Private,
}

/// How far an address may be reached. Ordered: the stricter of two classes is the larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    Public,
    Private,
    Forbidden,
}

/// Checks a configured base URL. IP literals in any spelling (`2130706433`, `0x7f000001`,
/// `0177.0.0.1`, `[::ffff:127.0.0.1]`) are normalised by the URL parser before the address
/// test; IPv6 zone ids (`[fe80::1%25eth0]`) do not parse and are refused as malformed.
pub fn check_base_url(raw: &str, allow_private: bool) -> Result<(), UrlGuardError> {
    let url = url::Url::parse(raw).map_err(|_| UrlGuardError::Malformed)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlGuardError::Scheme);
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlGuardError::UserInfo);
    }
    check_host(&url, allow_private)?;
    // `…/internal/action#` + `/chat/completions` would reach `/internal/action` itself.
    if url.query().is_some() || url.fragment().is_some() {
        return Err(UrlGuardError::QueryOrFragment);
    }
    Ok(())
}

/// Checks an alert webhook URL: http(s), and never a metadata, link-local or reserved
/// address; private addresses and a user name in the URL (basic auth) are allowed.
pub fn check_webhook_url(raw: &str) -> Result<(), UrlGuardError> {
    let url = url::Url::parse(raw).map_err(|_| UrlGuardError::Malformed)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlGuardError::Scheme);
    }
    check_host(&url, true)
}

fn check_host(url: &url::Url, allow_private: bool) -> Result<(), UrlGuardError> {
    match url.host() {
        None => Err(UrlGuardError::Malformed),
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), allow_private),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), allow_private),
        Some(url::Host::Domain(name)) => check_name(name, allow_private),
    }
}

/// Names of metadata services (they resolve to forbidden addresses anyway; refusing the
/// name also covers a resolver that answers them with something else).
const METADATA_NAMES: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "metadata.azure.com",
    "metadata.tencentyun.com",
    "metadata.platformequinix.com",
    "metadata.packet.net",
    "instance-data",
    "instance-data.ec2.internal",
];

fn check_name(name: &str, allow_private: bool) -> Result<(), UrlGuardError> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if METADATA_NAMES.contains(&name.as_str())
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
    match reach(ip) {
        Reach::Forbidden => Err(UrlGuardError::Forbidden),
        Reach::Private if !allow_private => Err(UrlGuardError::Private),
        _ => Ok(()),
    }
}

pub fn reach(ip: IpAddr) -> Reach {
    match ip {
        IpAddr::V4(v4) => reach_v4(v4),
        IpAddr::V6(v6) => reach_v6(v6),
    }
}

/// Metadata services on addresses outside the link-local range.
const METADATA_V4: &[Ipv4Addr] = &[
    Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud (inside CGNAT 100.64/10)
    Ipv4Addr::new(192, 0, 0, 192),     // Oracle Cloud (classic)
    Ipv4Addr::new(168, 63, 129, 16),   // Azure WireServer (a public address)
];

fn reach_v4(ip: Ipv4Addr) -> Reach {
    let o = ip.octets();
    if METADATA_V4.contains(&ip)
        || o[0] == 0 // "this network", 0.0.0.0 included
        || ip.is_link_local() // 169.254/16: AWS/GCP/Azure/… metadata, ECS 169.254.170.2
        || ip.is_broadcast()
        || ip.is_multicast()
        || o[0] >= 240
    // reserved
    {
        Reach::Forbidden
    } else if ip.is_loopback()
        || ip.is_private()
        || (o[0] == 100 && (64..128).contains(&o[1])) // CGNAT
        || (o[0] == 198 && (18..20).contains(&o[1])) // benchmarking
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || ip.is_documentation()
    {
        Reach::Private
    } else {
        Reach::Public
    }
}

fn v4_at(seg: &[u16; 8], hi: usize) -> Ipv4Addr {
    let [a, b] = seg[hi].to_be_bytes();
    let [c, d] = seg[hi + 1].to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn reach_v6(ip: Ipv6Addr) -> Reach {
    let seg = ip.segments();
    if ip.is_unspecified()
        || ip.is_multicast()
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || (seg[0] == 0xfd00 && seg[1] == 0x0ec2) // AWS Nitro services: metadata fd00:ec2::254, DNS, NTP
        || (seg[0] == 0x0100 && seg[1..4] == [0, 0, 0])
    // discard-only 100::/64
    {
        return Reach::Forbidden;
    }
    if ip.is_loopback() {
        return Reach::Private;
    }
    // Forms that carry an IPv4 address: (own class, the carried address).
    let carried: Option<(Reach, Ipv4Addr)> = match seg {
        // IPv4-mapped ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some((Reach::Public, v4_at(&seg, 6))),
        // IPv4-translated (SIIT) ::ffff:0:a.b.c.d
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some((Reach::Public, v4_at(&seg, 6))),
        // IPv4-compatible ::a.b.c.d (deprecated; :: and ::1 are handled above)
        [0, 0, 0, 0, 0, 0, _, _] => Some((Reach::Public, v4_at(&seg, 6))),
        // NAT64 well-known prefix 64:ff9b::/96: a public IPv4 through the translator
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some((Reach::Public, v4_at(&seg, 6))),
        // Local-use NAT64 64:ff9b:1::/48 (RFC 8215): a site's own translator, and where the
        // IPv4 sits depends on its prefix length: private, and the common /96 spot checked.
        [0x64, 0xff9b, 1, ..] => Some((Reach::Private, v4_at(&seg, 6))),
        // 6to4 2002:a.b.c.d::/48
        [0x2002, ..] => Some((Reach::Public, v4_at(&seg, 1))),
        // Teredo 2001:0::/32: server at bits 32..64, client (inverted) at bits 96..128.
        [0x2001, 0, ..] => {
            let client = Ipv4Addr::from(!u32::from(v4_at(&seg, 6)));
            let server = reach_v4(v4_at(&seg, 2));
            Some((server.max(Reach::Private), client))
        }
        _ => None,
    };
    if let Some((own, v4)) = carried {
        return own.max(reach_v4(v4));
    }
    if (seg[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (seg[0] & 0xffc0) == 0xfec0
    // site-local fec0::/10 (deprecated)
    {
        Reach::Private
    } else {
        Reach::Public
    }
}

/// Name resolution without a guard: the system's resolver (`getaddrinfo` on a blocking
/// thread, as `tokio::net::lookup_host` does). `GuardedResolver` wraps it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// DNS resolution for upstreams: every address the inner resolver returns must pass
/// `check_ip` (metadata always refused, private ranges only with `allow_private`), else the
/// name is refused whole — a name that mixes a public and a refused address is a rebinding
/// attempt, and the connector would try the addresses in turn.
///
/// The inner resolver is a parameter so tests can drive the real client and guard with
/// fixed DNS answers (a real DNS server would need a configurable nameserver that the
/// system resolver does not offer per client); production uses `SystemResolver`.
#[derive(Clone)]
pub struct GuardedResolver {
    allow_private: bool,
    inner: Arc<dyn Resolve>,
}

impl GuardedResolver {
    pub fn new(allow_private: bool, inner: Arc<dyn Resolve>) -> Self {
        Self {
            allow_private,
            inner,
        }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let inner = self.inner.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let refuse = |why: String| -> Box<dyn std::error::Error + Send + Sync> {
                format!("{host} {why}; the gateway may not reach it").into()
            };
            if let Err(e) = check_name(&host, allow_private) {
                return Err(refuse(format!("is refused by name ({e})")));
            }
            let addrs: Vec<SocketAddr> = inner.resolve(name).await?.collect();
            if addrs.is_empty() {
                return Err(refuse("resolves to no address".into()));
            }
            if let Some(bad) = addrs
                .iter()
                .find(|a| check_ip(a.ip(), allow_private).is_err())
            {
                let class = reach(bad.ip());
                return Err(refuse(format!("resolves to a {class:?} address")));
            }
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
#[path = "url_guard_test.rs"]
mod tests;
