//! The client's address, for everything keyed or recorded by it (the sign-in throttle, audit
//! rows, session rows, logs): the socket's peer, unless that peer is a reverse proxy the
//! operator trusts (`[server] trusted_proxies`). Behind one, every client would otherwise
//! be the proxy, and one per-address limit would be shared by all of them.
//!
//! From a trusted peer the client is the rightmost address in `X-Forwarded-For` that is not
//! itself a trusted proxy: each proxy appends the address it was connected from, so the
//! entries to the right of the first untrusted one were written by proxies we trust, and
//! everything to its left came from the client, who can write anything there. Every
//! `X-Forwarded-For` line counts, in order, as one list (RFC 9110's rule for repeated
//! fields). When every entry is trusted, the leftmost is the client (a trusted host itself,
//! e.g. a health check through the proxy). An entry that is not an address (`unknown`, a
//! name, garbage) where the walk reaches it makes the whole header worthless: the peer is
//! the client then, as it is when there is no header. From an untrusted peer, the header is
//! ignored — anyone can send it.
//!
//! `Forwarded` (RFC 7239) and `X-Real-IP` are never read: every common proxy (nginx,
//! HAProxy, Traefik, Caddy, cloud load balancers) sets `X-Forwarded-For`, and reading a
//! second header a proxy passes through untouched would let the client pick the one it
//! wrote.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use actix_web::HttpRequest;
use ipnet::IpNet;

/// How many `X-Forwarded-For` entries are walked at most; past that, the peer.
const MAX_HOPS: usize = 32;

/// The trusted proxies, parsed once at start; an `app_data` of the HTTP server.
#[derive(Debug, Clone, Default)]
pub struct ClientAddr {
    trusted: Arc<[IpNet]>,
}

impl ClientAddr {
    /// Parses `[server] trusted_proxies`: addresses (`127.0.0.1`, `::1`) or CIDR ranges
    /// (`10.0.0.0/8`); an error names the key and the entry.
    pub fn new(list: &[String]) -> Result<ClientAddr, String> {
        let trusted = list
            .iter()
            .map(|entry| {
                let text = entry.trim();
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| mapped_as_v4(net.trunc()))
                    .map_err(|_| {
                        format!("server.trusted_proxies: `{entry}` is not an IP address or a CIDR range (e.g. \"10.0.0.0/8\", \"127.0.0.1\", \"fd00::/8\")")
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClientAddr {
            trusted: trusted.into(),
        })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's address of a request from `peer` carrying `headers` (module doc).
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        self.forwarded_for(headers).unwrap_or(peer)
    }

    /// The rightmost untrusted `X-Forwarded-For` entry (or the leftmost, all being
    /// trusted); `None` without the header, or when an entry walked is not an address.
    fn forwarded_for(&self, headers: &HeaderMap) -> Option<IpAddr> {
        // Split as bytes, and decoded only where the walk reaches: a byte that is not
        // visible ASCII in the client's own part of a line (left of the proxy's entry) must
        // not make the whole line, and so the header, worthless.
        let mut hops = Vec::new();
        for line in headers.get_all("x-forwarded-for") {
            hops.extend(line.as_bytes().split(|b| *b == b','));
        }
        let mut furthest = None;
        for hop in hops.iter().rev().take(MAX_HOPS) {
            let ip = hop_address(std::str::from_utf8(hop).ok()?.trim())?;
            if !self.trusts(ip) {
                return Some(ip);
            }
            furthest = Some(ip);
        }
        // Every entry walked was a trusted proxy; more than `MAX_HOPS` of them is not a
        // chain anyone runs.
        furthest.filter(|_| hops.len() <= MAX_HOPS)
    }
}

/// An IPv4-mapped IPv6 entry (`::ffff:10.0.0.1`, `::ffff:10.0.0.0/104`) as the IPv4 one it
/// names: peers and entries are compared as IPv4 (`to_canonical`), which a mapped entry
/// would never match.
fn mapped_as_v4(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// One `X-Forwarded-For` entry: an address, also written with a port (`203.0.113.7:4711`,
/// `[2001:db8::1]:4711`) or in brackets, as some proxies do.
fn hop_address(text: &str) -> Option<IpAddr> {
    let ip = text
        .parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            text.strip_prefix('[')?
                .strip_suffix(']')?
                .parse::<IpAddr>()
                .ok()
        })?;
    Some(ip.to_canonical())
}

/// The client's address of `req` as text (empty when the socket's peer is unknown).
pub fn client_ip(req: &HttpRequest) -> String {
    let Some(peer) = req.peer_addr() else {
        return String::new();
    };
    match req.app_data::<ClientAddr>() {
        Some(c) => c.resolve(peer.ip(), req.headers()),
        None => peer.ip().to_canonical(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(
                HeaderName::from_static("x-forwarded-for"),
                HeaderValue::from_str(l).unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_forwarded_address_from_a_trusted_peer() {
        let c = ClientAddr::new(&["10.0.0.0/8".into(), "127.0.0.1".into()]).unwrap();
        let proxy = ip("10.1.2.3");
        let at = |lines: &[&str]| c.resolve(proxy, &headers(lines)).to_string();
        assert_eq!(at(&["203.0.113.7"]), "203.0.113.7");
        // What the client wrote to the left of the proxy's entry is not believed.
        assert_eq!(at(&["1.2.3.4, 203.0.113.7"]), "203.0.113.7");
        assert_eq!(at(&["1.2.3.4, 203.0.113.7, 10.9.9.9"]), "203.0.113.7");
        // Repeated lines are one list, in order.
        assert_eq!(at(&["1.2.3.4", "203.0.113.7, 10.9.9.9"]), "203.0.113.7");
        // Ports and brackets, IPv6, IPv4-mapped IPv6.
        assert_eq!(at(&["203.0.113.7:4711"]), "203.0.113.7");
        assert_eq!(at(&["[2001:db8::1]:4711"]), "2001:db8::1");
        assert_eq!(at(&["[2001:db8::1]"]), "2001:db8::1");
        assert_eq!(at(&["::ffff:203.0.113.7"]), "203.0.113.7");
        // Every entry trusted: the leftmost.
        assert_eq!(at(&["10.5.5.5, 10.9.9.9"]), "10.5.5.5");
        // No header, an empty one, or an entry walked that is not an address: the peer.
        assert_eq!(at(&[]), "10.1.2.3");
        assert_eq!(at(&[""]), "10.1.2.3");
        assert_eq!(at(&["203.0.113.7, unknown"]), "10.1.2.3");
        assert_eq!(at(&["203.0.113.7, 10.9.9.9, bad"]), "10.1.2.3");
        assert_eq!(at(&["300.1.1.1"]), "10.1.2.3");
        // Garbage left of the client's entry is never reached, bytes that are not ASCII too.
        assert_eq!(at(&["nonsense, 203.0.113.7"]), "203.0.113.7");
        let mut h = HeaderMap::new();
        for line in [&b"\xff\xfe, 203.0.113.7"[..], b"\xff", b"203.0.113.8"] {
            h.append(
                HeaderName::from_static("x-forwarded-for"),
                HeaderValue::from_bytes(line).unwrap(),
            );
        }
        assert_eq!(c.resolve(proxy, &h).to_string(), "203.0.113.8");
        let mut h = HeaderMap::new();
        h.append(
            HeaderName::from_static("x-forwarded-for"),
            HeaderValue::from_bytes(b"203.0.113.7, 10.1.1.1\xff").unwrap(),
        );
        assert_eq!(c.resolve(proxy, &h).to_string(), "10.1.2.3");
        // An absurd chain of trusted hops: the peer.
        let long = vec!["10.0.0.1"; MAX_HOPS + 1].join(",");
        assert_eq!(at(&[long.as_str()]), "10.1.2.3");
        // A trusted peer that connects over IPv4-mapped IPv6 (a dual-stack listener).
        assert_eq!(
            c.resolve(ip("::ffff:127.0.0.1"), &headers(&["198.51.100.9"]))
                .to_string(),
            "198.51.100.9"
        );
    }

    /// A proxy written as IPv4-mapped IPv6 (as `ss` shows a dual-stack listener's peers) is
    /// that IPv4 proxy: peers and entries are compared as IPv4, and such an entry matched
    /// nothing — every client stayed the proxy, silently.
    #[test]
    fn a_proxy_written_as_ipv4_mapped_ipv6_is_trusted() {
        for entry in ["::ffff:10.1.2.3", "::ffff:10.0.0.0/104"] {
            let c = ClientAddr::new(&[entry.into()]).unwrap();
            for peer in ["10.1.2.3", "::ffff:10.1.2.3"] {
                assert_eq!(
                    c.resolve(ip(peer), &headers(&["203.0.113.7"])).to_string(),
                    "203.0.113.7",
                    "{entry} from {peer}"
                );
            }
            assert_eq!(
                c.resolve(ip("10.1.2.3"), &headers(&["203.0.113.7, ::ffff:10.1.2.3"]))
                    .to_string(),
                "203.0.113.7",
                "{entry}: its own hop"
            );
        }
        // An IPv6 range wider than the mapped block stays an IPv6 range.
        let c = ClientAddr::new(&["::/0".into()]).unwrap();
        assert_eq!(
            c.resolve(ip("10.1.2.3"), &headers(&["203.0.113.7"]))
                .to_string(),
            "10.1.2.3"
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let c = ClientAddr::new(&["10.0.0.0/8".into()]).unwrap();
        let h = headers(&["10.0.0.1, 203.0.113.7"]);
        assert_eq!(
            c.resolve(ip("198.51.100.1"), &h).to_string(),
            "198.51.100.1"
        );
        // No list: nobody is trusted.
        let none = ClientAddr::new(&[]).unwrap();
        assert_eq!(none.resolve(ip("127.0.0.1"), &h).to_string(), "127.0.0.1");
    }

    #[test]
    fn a_bad_entry_is_an_error_naming_the_key_and_the_entry() {
        for bad in ["10.0.0.0/33", "localhost", "10.0.0", ""] {
            let e = ClientAddr::new(&["127.0.0.1".into(), bad.into()]).unwrap_err();
            assert!(
                e.contains("server.trusted_proxies") && e.contains(&format!("`{bad}`")),
                "{e}"
            );
        }
        let mut s = crate::config::Settings::default();
        s.server.trusted_proxies = vec!["192.168.0.0/16".into(), "fd00::/8".into(), "::1".into()];
        s.validate().unwrap();
        s.server.trusted_proxies.push("10.0.0.0/8x".into());
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("server.trusted_proxies") && e.contains("10.0.0.0/8x"),
            "{e}"
        );
    }

    #[test]
    fn the_list_comes_from_the_file_or_the_environment() {
        use std::collections::BTreeMap;
        let file = "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\n";
        let s = crate::config::load_from(Some(file), &BTreeMap::new()).unwrap();
        assert_eq!(s.server.trusted_proxies, ["10.0.0.0/8", "::1"]);
        let env = BTreeMap::from([(
            "SLUICE_SERVER_TRUSTED_PROXIES".to_string(),
            "172.16.0.0/12, 127.0.0.1".to_string(),
        )]);
        let s = crate::config::load_from(None, &env).unwrap();
        assert_eq!(s.server.trusted_proxies, ["172.16.0.0/12", "127.0.0.1"]);
        assert!(crate::config::load_from(None, &BTreeMap::new())
            .unwrap()
            .server
            .trusted_proxies
            .is_empty());
    }
}
