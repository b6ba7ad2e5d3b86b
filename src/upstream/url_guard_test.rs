//! The SSRF table: every range the guard knows, in the spellings an attacker would use.

use super::*;

#[test]
fn refuses_ssrf_targets() {
    use UrlGuardError::*;
    let cases = [
        ("http://169.254.169.254/latest", Forbidden),
        ("https://api.example.com/v1?x=1", QueryOrFragment),
        ("https://api.example.com/internal/action#", QueryOrFragment),
        ("https://api.example.com/v1?", QueryOrFragment),
        ("http://0.0.0.0:80/v1", Forbidden),
        ("http://[fe80::1]/v1", Forbidden),
        ("http://[fd00:ec2::254]/", Forbidden),
        ("http://metadata.google.internal/", Forbidden),
        ("http://127.0.0.1:8000/v1", Private),
        ("http://2130706433/v1", Private),
        ("http://0x7f000001/v1", Private),
        ("http://0177.0.0.1/v1", Private),
        ("http://127.1/v1", Private),
        ("http://[::ffff:127.0.0.1]/v1", Private),
        ("http://[::1]/v1", Private),
        ("http://10.0.0.5/v1", Private),
        ("http://192.168.1.2/v1", Private),
        ("http://localhost:11434/v1", Private),
        // Metadata in other spellings: decimal, hex, octal, and IPv6 forms carrying it.
        ("http://2852039166/", Forbidden),
        ("http://0xa9fea9fe/", Forbidden),
        ("http://0251.0376.0251.0376/", Forbidden),
        ("http://[::ffff:169.254.169.254]/", Forbidden),
        ("http://[::169.254.169.254]/", Forbidden),
        ("http://[64:ff9b::169.254.169.254]/", Forbidden),
        ("http://[2002:a9fe:a9fe::1]/", Forbidden),
        // A zone id does not parse: refused, never passed on to the connector.
        ("http://[fe80::1%25eth0]/v1", Malformed),
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
    for url in [
        "http://169.254.169.254/",
        "http://100.100.100.200/",
        "http://[fd00:ec2::254]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://metadata.tencentyun.com/",
        "http://instance-data/",
    ] {
        assert_eq!(
            check_base_url(url, true),
            Err(UrlGuardError::Forbidden),
            "{url}"
        );
    }
    assert_eq!(check_base_url("https://api.openai.com/v1", false), Ok(()));
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn every_range_is_classified() {
    use Reach::*;
    let cases = [
        // IPv4
        ("8.8.8.8", Public),
        ("1.1.1.1", Public),
        ("127.0.0.1", Private),
        ("127.255.255.254", Private),
        ("10.1.2.3", Private),
        ("172.16.0.1", Private),
        ("172.31.255.255", Private),
        ("192.168.0.1", Private),
        ("100.64.0.1", Private),
        ("100.127.255.255", Private),
        ("198.18.0.1", Private),
        ("192.0.0.8", Private),
        ("192.0.2.1", Private),
        ("0.0.0.0", Forbidden),
        ("0.1.2.3", Forbidden),
        ("169.254.169.254", Forbidden), // AWS, GCP, Azure, DigitalOcean, OpenStack…
        ("169.254.170.2", Forbidden),   // ECS task metadata
        ("169.254.0.23", Forbidden),    // Tencent
        ("100.100.100.200", Forbidden), // Alibaba
        ("192.0.0.192", Forbidden),     // Oracle
        ("168.63.129.16", Forbidden),   // Azure WireServer
        ("224.0.0.1", Forbidden),
        ("240.0.0.1", Forbidden),
        ("255.255.255.255", Forbidden),
        // IPv6, native
        ("2606:4700::1111", Public),
        ("::1", Private),
        ("fc00::1", Private),
        ("fd12:3456::1", Private),
        ("fec0::1", Private), // site-local
        ("fefe::1", Private), // site-local, upper end of fec0::/10
        ("::", Forbidden),
        ("fe80::1", Forbidden),
        ("ff02::1", Forbidden),
        ("fd00:ec2::254", Forbidden), // AWS metadata over IPv6
        ("fd00:ec2::23", Forbidden),
        ("100::1", Forbidden),
        // IPv4-mapped and IPv4-translated
        ("::ffff:8.8.8.8", Public),
        ("::ffff:127.0.0.1", Private),
        ("::ffff:10.0.0.1", Private),
        ("::ffff:169.254.169.254", Forbidden),
        ("::ffff:0:169.254.169.254", Forbidden),
        ("::ffff:0:10.0.0.1", Private),
        // IPv4-compatible
        ("::8.8.8.8", Public),
        ("::127.0.0.1", Private),
        ("::10.0.0.1", Private),
        ("::169.254.169.254", Forbidden),
        ("::100.100.100.200", Forbidden),
        // NAT64 well-known prefix
        ("64:ff9b::8.8.8.8", Public),
        ("64:ff9b::7f00:1", Private),
        ("64:ff9b::192.168.1.1", Private),
        ("64:ff9b::169.254.169.254", Forbidden),
        ("64:ff9b::100.100.100.200", Forbidden),
        // Local-use NAT64
        ("64:ff9b:1::8.8.8.8", Private),
        ("64:ff9b:1::169.254.169.254", Forbidden),
        // 6to4
        ("2002:808:808::1", Public),
        ("2002:7f00:1::1", Private),
        ("2002:c0a8:101::1", Private),
        ("2002:a9fe:a9fe::1", Forbidden),
        ("2002:6464:64c8::", Forbidden),
        // Teredo: server 65.54.227.120, client (inverted) in the last 32 bits
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Private),
        ("2001:0:4136:e378::5601:5601", Forbidden), // client !0x56015601 = 169.254.169.254
        ("2001:0:a9fe:a9fe::1", Forbidden),         // server 169.254.169.254
    ];
    for (addr, want) in cases {
        assert_eq!(reach(ip(addr)), want, "{addr}");
    }
}

#[test]
fn private_is_refused_only_without_the_opt_in() {
    assert_eq!(check_ip(ip("fec0::1"), false), Err(UrlGuardError::Private));
    assert_eq!(check_ip(ip("fec0::1"), true), Ok(()));
    assert_eq!(
        check_ip(ip("64:ff9b::a9fe:a9fe"), true),
        Err(UrlGuardError::Forbidden)
    );
    assert_eq!(check_ip(ip("64:ff9b::8.8.8.8"), false), Ok(()));
}

/// A resolver with fixed answers, as the integration tests use.
struct Fixed(Vec<IpAddr>);

impl Resolve for Fixed {
    fn resolve(&self, _: Name) -> Resolving {
        let addrs: Vec<SocketAddr> = self.0.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
        Box::pin(async move {
            let addrs: Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

async fn resolve(allow_private: bool, answer: &[&str], name: &str) -> Result<Vec<IpAddr>, String> {
    let inner = Arc::new(Fixed(answer.iter().map(|a| ip(a)).collect()));
    let guard = GuardedResolver::new(allow_private, inner);
    let name: Name = name.parse().map_err(|_| "name".to_string())?;
    match guard.resolve(name).await {
        Ok(addrs) => Ok(addrs.map(|a| a.ip()).collect()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test]
async fn the_resolver_refuses_a_name_with_any_bad_address() {
    assert_eq!(
        resolve(false, &["8.8.8.8"], "api.example.com").await,
        Ok(vec![ip("8.8.8.8")])
    );
    for answer in [
        &["8.8.8.8", "10.0.0.1"][..],
        &["8.8.8.8", "169.254.169.254"],
        &["64:ff9b::a9fe:a9fe"],
        &["2002:c0a8:101::1"],
        &["::127.0.0.1"],
        &["fec0::1"],
        &[],
    ] {
        assert!(
            resolve(false, answer, "api.example.com").await.is_err(),
            "{answer:?}"
        );
    }
    // With the opt-in, private answers pass and metadata answers still do not.
    assert!(resolve(true, &["10.0.0.1", "::1"], "llm.lan").await.is_ok());
    assert!(resolve(true, &["10.0.0.1", "100.100.100.200"], "llm.lan")
        .await
        .is_err());
    assert!(resolve(true, &["8.8.8.8"], "metadata.google.internal")
        .await
        .is_err());
}

/// Issue 15, "try to break the guard": IPv4 in every spelling the URL parser accepts,
/// trailing dots, case, IDN and full-width forms, userinfo and fragment tricks, malformed
/// ports. Each is refused for the address it really reaches (`url` applies WHATWG host
/// parsing — IDNA mapping, then IPv4 in decimal, octal, hex and shortened forms — the same
/// parser reqwest sends with, so what is checked is what is connected to).
#[test]
fn odd_spellings_reach_the_address_they_spell() {
    use UrlGuardError::*;
    let cases: &[(&str, Result<(), UrlGuardError>)] = &[
        ("http://0x7f.1/v1", Err(Private)),
        ("http://0x7f.0.0.1/v1", Err(Private)),
        ("http://127.1/v1", Err(Private)),
        ("http://127.0.1/v1", Err(Private)),
        ("http://017700000001/v1", Err(Private)),
        ("http://127.000.000.001/v1", Err(Private)),
        ("http://127.0.0.1./v1", Err(Private)),
        ("http://2130706433./v1", Err(Private)),
        ("http://１２７.０.０.１/v1", Err(Private)),
        ("http://0/v1", Err(Forbidden)),
        ("http://[::]/v1", Err(Forbidden)),
        ("http://[::ffff:7f00:1]/v1", Err(Private)),
        ("http://[0:0:0:0:0:ffff:169.254.169.254]/", Err(Forbidden)),
        ("http://[::ffff:a9fe:a9fe]/", Err(Forbidden)),
        ("http://169.254.169.254./", Err(Forbidden)),
        ("http://0xa9.0xfe.0xa9.0xfe/", Err(Forbidden)),
        ("http://169.254.43518/", Err(Forbidden)),
        ("HTTP://169.254.169.254/", Err(Forbidden)),
        ("http:169.254.169.254/", Err(Forbidden)),
        ("http:/\\169.254.169.254/", Err(Forbidden)),
        (" http://169.254.169.254/ ", Err(Forbidden)),
        ("http://169.254.169\t.254/", Err(Forbidden)),
        ("http://localhost./v1", Err(Private)),
        ("http://LOCALHOST/v1", Err(Private)),
        ("http://api.localhost./v1", Err(Private)),
        ("http://metadata./", Err(Forbidden)),
        ("http://METADATA.GOOGLE.INTERNAL/", Err(Forbidden)),
        ("http://metadata.google.internal./", Err(Forbidden)),
        ("http://ｍｅｔａｄａｔａ.google.internal/", Err(Forbidden)),
        ("http://ⓜⓔⓣⓐⓓⓐⓣⓐ.google.internal/", Err(Forbidden)),
        ("http://instance-data./", Err(Forbidden)),
        // Userinfo: the host is what follows the last `@`, and any userinfo is refused.
        ("http://api.openai.com@169.254.169.254/", Err(UserInfo)),
        ("http://api.openai.com:443@169.254.169.254/", Err(UserInfo)),
        ("http://@169.254.169.254/", Err(Forbidden)),
        // After `#` or a backslash (a path separator in http URLs) the host is over.
        ("http://169.254.169.254#@api.openai.com/", Err(Forbidden)),
        ("http://169.254.169.254\\@api.openai.com/", Err(Forbidden)),
        ("http://api.openai.com\\@169.254.169.254/v1", Ok(())),
        ("http://127.0.0.1:99999/v1", Err(Malformed)),
        ("http://127.0.0.1:0x50/v1", Err(Malformed)),
        ("https://api.openai.com:443/v1", Ok(())),
        // A public name stays a name at load; its DNS answer is checked at every connect.
        ("http://169.254.169.254.nip.io/v1", Ok(())),
    ];
    for (url, want) in cases {
        assert_eq!(check_base_url(url, false), *want, "{url}");
    }
    // The connector dials what the parser says: the checked host is the connected one.
    let url = url::Url::parse("http://api.openai.com\\@169.254.169.254/v1").unwrap();
    assert_eq!(url.host_str(), Some("api.openai.com"));
}

/// DNS answers mixing families, and answers carrying a port: the port is the URL's, the
/// address decides, and one refused address (of either family) refuses the name.
#[tokio::test]
async fn mixed_family_answers_are_refused_whole() {
    for answer in [
        &["2606:4700::1111", "169.254.169.254"][..],
        &["8.8.8.8", "fd00:ec2::254"],
        &["8.8.8.8", "::ffff:169.254.169.254"],
        &["2606:4700::1111", "2002:a9fe:a9fe::1"],
        &["8.8.8.8", "::"],
        &["8.8.8.8", "0.0.0.0"],
    ] {
        assert!(
            resolve(true, answer, "api.example.com").await.is_err(),
            "{answer:?}"
        );
    }
    assert_eq!(
        resolve(false, &["2606:4700::1111", "8.8.8.8"], "api.example.com").await,
        Ok(vec![ip("2606:4700::1111"), ip("8.8.8.8")])
    );
    for name in ["localhost.", "LOCALHOST", "metadata.google.internal."] {
        assert!(resolve(false, &["8.8.8.8"], name).await.is_err(), "{name}");
    }
}
