//! Parsing and normalisation of the destinations a client asks for.
//!
//! A destination arrives as an authority (`host:port`) in a CONNECT request, in an
//! absolute-form request URL, in a `Host` header or in a redirect's `Location`. Every form is
//! parsed by the same strict code:
//!
//! * userinfo (`user@host`), paths, queries, fragments, backslashes, percent-escapes,
//!   whitespace and control characters are refused (they have no business in an authority,
//!   and they are how `allowed.com@evil.com` / `evil.com#@allowed.com` tricks work);
//! * names are mapped with UTS-46 (IDNA: lowercasing, width folding, punycode), then one
//!   trailing dot is stripped, and each label is checked (letters, digits, `-`, `_`);
//! * a host that "ends in a number" is parsed as an IPv4 address exactly as URL parsers and
//!   `inet_aton` do (decimal `2130706433`, octal `0177.0.0.1`, hex `0x7f.1`, short `127.1`),
//!   so a number never reaches the resolver as a name; if it is not a valid IPv4 address it
//!   is refused;
//! * bracketed IPv6 literals are parsed (no zone ids) and IPv4-mapped ones become IPv4.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::addr::canonical;

/// The longest host text we look at, before any normalisation.
const MAX_RAW_HOST: usize = 1024;

/// A normalised destination host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lowercase ASCII (punycode), no trailing dot.
    Name(String),
    /// An IP address (IPv4-mapped IPv6 addresses are stored as IPv4).
    Ip(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A normalised host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The TCP port (never 0).
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]:{}", self.port),
            h => write!(f, "{h}:{}", self.port),
        }
    }
}

/// Why a requested destination could not be parsed. The messages never echo the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Nothing where the host should be.
    #[error("empty host")]
    EmptyHost,
    /// `user@host` or `user:password@host`.
    #[error("userinfo (`user@`) in the destination is not allowed")]
    Userinfo,
    /// A CONNECT target without a port.
    #[error("missing port")]
    MissingPort,
    /// Not a number in 1..=65535.
    #[error("port is not a number in 1..=65535")]
    BadPort,
    /// A character that cannot appear in an authority.
    #[error("invalid character in destination")]
    BadChar,
    /// Unparseable bracketed IPv6 literal (or one with a zone id).
    #[error("invalid IPv6 literal")]
    BadIpv6,
    /// Ends in a number but is not a valid IPv4 address in any accepted form.
    #[error("host ends in a number but is not a valid IPv4 address")]
    BadIpv4,
    /// Fails IDNA (UTS-46) processing.
    #[error("host name fails IDNA normalisation")]
    Idna,
    /// Violates DNS name syntax after normalisation.
    #[error("invalid host name: {0}")]
    BadName(&'static str),
}

/// Parses `host[:port]`. Without a port, `default_port` is used, or [`TargetError::MissingPort`]
/// if there is none.
pub fn parse_authority(raw: &str, default_port: Option<u16>) -> Result<Target, TargetError> {
    if raw.contains('@') {
        return Err(TargetError::Userinfo);
    }
    if raw.len() > MAX_RAW_HOST + 6 {
        return Err(TargetError::BadName("too long"));
    }
    if raw.chars().any(|c| {
        c.is_control()
            || c.is_whitespace()
            || matches!(
                c,
                '/' | '?' | '#' | '\\' | '%' | '<' | '>' | '^' | '|' | '"' | '`'
            )
    }) {
        return Err(TargetError::BadChar);
    }
    let (host, port) = if raw.starts_with('[') {
        let end = raw.find(']').ok_or(TargetError::BadIpv6)?;
        let (h, rest) = raw.split_at(end + 1);
        match rest.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if rest.is_empty() => (h, None),
            None => return Err(TargetError::BadChar),
        }
    } else {
        match raw.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (raw, None),
        }
    };
    if !host.starts_with('[') && host.contains(':') {
        // Unbracketed IPv6 or `a:b:c`.
        return Err(TargetError::BadChar);
    }
    let port = match port {
        Some(p) => parse_port(p)?,
        None => default_port.ok_or(TargetError::MissingPort)?,
    };
    if port == 0 {
        return Err(TargetError::BadPort);
    }
    Ok(Target {
        host: parse_host(host)?,
        port,
    })
}

fn parse_port(p: &str) -> Result<u16, TargetError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::BadPort);
    }
    match p.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => u16::try_from(n).map_err(|_| TargetError::BadPort),
        _ => Err(TargetError::BadPort),
    }
}

/// Parses and normalises a host (no port).
pub fn parse_host(raw: &str) -> Result<Host, TargetError> {
    if raw.is_empty() {
        return Err(TargetError::EmptyHost);
    }
    if raw.len() > MAX_RAW_HOST {
        return Err(TargetError::BadName("too long"));
    }
    if raw.contains('@') {
        return Err(TargetError::Userinfo);
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(TargetError::BadIpv6)?;
        if inner.contains('%') {
            return Err(TargetError::BadIpv6);
        }
        let v6: Ipv6Addr = inner.parse().map_err(|_| TargetError::BadIpv6)?;
        return Ok(Host::Ip(canonical(IpAddr::V6(v6))));
    }
    if raw.contains(['[', ']', ':']) {
        return Err(TargetError::BadChar);
    }
    let ascii = idna::domain_to_ascii_cow(raw.as_bytes(), idna::AsciiDenyList::URL)
        .map_err(|_| TargetError::Idna)?;
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if name.is_empty() {
        return Err(TargetError::EmptyHost);
    }
    if ends_in_number(name) {
        return parse_ipv4(name)
            .map(|v4| Host::Ip(IpAddr::V4(v4)))
            .ok_or(TargetError::BadIpv4);
    }
    validate_name(name)?;
    Ok(Host::Name(name.to_owned()))
}

fn validate_name(name: &str) -> Result<(), TargetError> {
    if name.len() > 253 {
        return Err(TargetError::BadName("longer than 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(TargetError::BadName("empty label"));
        }
        if label.len() > 63 {
            return Err(TargetError::BadName("label longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(TargetError::BadName("character not allowed in a host name"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(TargetError::BadName("label starts or ends with '-'"));
        }
    }
    Ok(())
}

/// WHATWG URL "ends in a number": the last label (ignoring one empty trailing label) is all
/// digits or a valid IPv4 number (`0x..`, octal).
fn ends_in_number(name: &str) -> bool {
    let mut parts: Vec<&str> = name.split('.').collect();
    if parts.last() == Some(&"") {
        if parts.len() == 1 {
            return false;
        }
        parts.pop();
    }
    match parts.last() {
        Some(last) if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) => true,
        Some(last) => parse_ipv4_number(last).is_some(),
        None => false,
    }
}

/// One part of an IPv4 address in decimal, octal (leading 0) or hex (`0x`).
fn parse_ipv4_number(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() >= 2 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Anything longer than this is out of range for IPv4 in every radix; avoid overflow.
    let trimmed = digits.trim_start_matches('0');
    if trimmed.len() > 11 {
        return Some(u64::MAX);
    }
    if trimmed.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(trimmed, radix).ok()
}

/// The WHATWG IPv4 parser (the forms `inet_aton` accepts): 1 to 4 parts, each decimal, octal
/// or hex; the last part fills the remaining bytes.
fn parse_ipv4(name: &str) -> Option<Ipv4Addr> {
    let mut parts: Vec<&str> = name.split('.').collect();
    if parts.last() == Some(&"") && parts.len() > 1 {
        parts.pop();
    }
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let nums: Vec<u64> = parts
        .iter()
        .map(|p| parse_ipv4_number(p))
        .collect::<Option<_>>()?;
    let (last, init) = nums.split_last()?;
    if init.iter().any(|&n| n > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - init.len() as u32);
    if rest_bits < 64 && *last >= (1u64 << rest_bits) {
        return None;
    }
    let mut v: u64 = *last;
    for (i, n) in init.iter().enumerate() {
        v += n << (8 * (3 - i as u32));
    }
    u32::try_from(v).ok().map(Ipv4Addr::from)
}

/// Where a `Location` value points, when it leaves the current origin.
///
/// `Ok(None)`: a relative reference (same scheme, host and port). `Ok(Some(t))`: an absolute
/// or network-path reference to `t`. `Err`: ambiguous or non-HTTP; such redirects are refused
/// rather than guessed at, because clients disagree on how to parse them.
pub fn redirect_target(location: &[u8]) -> Result<Option<Target>, &'static str> {
    let s = std::str::from_utf8(location).map_err(|_| "Location is not valid UTF-8")?;
    if s.chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '\\' || !c.is_ascii())
    {
        return Err("ambiguous Location (whitespace, control, backslash or non-ASCII)");
    }
    let (scheme, rest) = match s.find(':') {
        Some(i)
            if !s[..i].contains(['/', '?', '#'])
                && s[..i].starts_with(|c: char| c.is_ascii_alphabetic())
                && s[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            (Some(s[..i].to_ascii_lowercase()), &s[i + 1..])
        }
        _ => (None, s),
    };
    let default_port = match scheme.as_deref() {
        None | Some("http") => 80,
        Some("https") => 443,
        Some(_) => return Err("redirect to a non-HTTP URL scheme"),
    };
    let Some(after) = rest.strip_prefix("//") else {
        return if scheme.is_some() {
            Err("absolute Location without an authority")
        } else {
            Ok(None)
        };
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    match parse_authority(&after[..end], Some(default_port)) {
        Ok(t) => Ok(Some(t)),
        Err(TargetError::Userinfo) => Err("Location carries userinfo"),
        Err(_) => Err("Location has an invalid host or port"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Option<String> {
        redirect_target(s.as_bytes())
            .unwrap()
            .map(|t| t.to_string())
    }

    #[test]
    fn redirect_targets() {
        assert_eq!(t("/next"), None);
        assert_eq!(t("next?x=1"), None);
        assert_eq!(t(""), None);
        assert_eq!(t("?q"), None);
        assert_eq!(t("http://Evil.test/x"), Some("evil.test:80".into()));
        assert_eq!(t("HTTPS://evil.test"), Some("evil.test:443".into()));
        assert_eq!(t("//evil.test:8080/x"), Some("evil.test:8080".into()));
        assert_eq!(t("http://2130706433/"), Some("127.0.0.1:80".into()));
        assert_eq!(
            t("http://[::ffff:10.0.0.1]:81/"),
            Some("10.0.0.1:81".into())
        );
        assert_eq!(t("http://evil.test?x"), Some("evil.test:80".into()));
        assert_eq!(t("http://evil.test#x"), Some("evil.test:80".into()));
        for bad in [
            "http://allowed.test@evil.test/",
            "http://user:pw@allowed.test/",
            "http:\\\\evil.test",
            "/\\evil.test",
            "http:evil.test",
            "ftp://evil.test/",
            "javascript:alert(1)",
            "http://evil .test/",
            "http://evil.test:0/",
            "http://evil.test:99999/",
            "http:///x",
            "http://ex\u{e4}mple.test/",
        ] {
            assert!(redirect_target(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(redirect_target(&[0xff, 0xfe]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn redirect_target_never_panics(loc in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)) {
            let _ = redirect_target(&loc);
        }

        #[test]
        fn redirect_target_text_never_panics(loc in "(https?:)?(//)?\\PC{0,60}") {
            let _ = redirect_target(loc.as_bytes());
        }
    }

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }
    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(parse_host("Example.COM").unwrap(), name("example.com"));
        assert_eq!(parse_host("example.com.").unwrap(), name("example.com"));
        assert_eq!(
            parse_host("BÜCHER.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(
            parse_host("xn--bcher-kva.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        // Ideographic full stop and fullwidth letters are mapped by UTS-46.
        assert_eq!(
            parse_host("ａｌｌｏｗｅｄ。test").unwrap(),
            name("allowed.test")
        );
        assert_eq!(
            parse_host("_srv.example.com").unwrap(),
            name("_srv.example.com")
        );
    }

    #[test]
    fn bad_names_are_refused() {
        for bad in [
            "",
            ".",
            "example.com..",
            "a..b",
            "-a.com",
            "a-.com",
            "*.example.com",
            "exa mple.com",
            &"a".repeat(64),
            &format!("{}.com", "a.".repeat(130)),
        ] {
            assert!(parse_host(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_ipv4_form_is_an_ip() {
        for form in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0x7F.0.0.1",
            "127.1",
            "127.0.1",
            "0177.1",
            "0x7f.1",
            "017700000001",
            "127.0.0.1.",
            "１２７.０.０.１",
        ] {
            assert_eq!(parse_host(form).unwrap(), ip("127.0.0.1"), "{form}");
        }
        assert_eq!(parse_host("0").unwrap(), ip("0.0.0.0"));
        assert_eq!(parse_host("0x").unwrap(), ip("0.0.0.0"));
        assert_eq!(parse_host("169.254.43518").unwrap(), ip("169.254.169.254"));
    }

    #[test]
    fn invalid_numeric_hosts_are_refused_not_resolved() {
        for bad in [
            "256.0.0.1",
            "1.2.3.4.5",
            "4294967296",
            "0x100000000",
            "08.0.0.1",
            "1.2.3.09",
            "foo.0x",
            "foo.123",
            "99999999999999999999999",
            "1.2.65536",
        ] {
            assert_eq!(parse_host(bad), Err(TargetError::BadIpv4), "{bad}");
        }
        // Not ending in a number: a name.
        assert_eq!(parse_host("123.example").unwrap(), name("123.example"));
        assert_eq!(parse_host("1e5").unwrap(), name("1e5"));
    }

    #[test]
    fn ipv6_literals() {
        assert_eq!(parse_host("[::1]").unwrap(), ip("::1"));
        assert_eq!(parse_host("[::ffff:127.0.0.1]").unwrap(), ip("127.0.0.1"));
        assert_eq!(parse_host("[::FFFF:7f00:1]").unwrap(), ip("127.0.0.1"));
        assert_eq!(parse_host("[fe80::1%25eth0]"), Err(TargetError::BadIpv6));
        assert_eq!(parse_host("[fe80::1%eth0]"), Err(TargetError::BadIpv6));
        assert_eq!(parse_host("[::1"), Err(TargetError::BadIpv6));
        assert_eq!(parse_host("[example.com]"), Err(TargetError::BadIpv6));
        assert_eq!(parse_host("::1"), Err(TargetError::BadChar));
    }

    #[test]
    fn authorities() {
        let t = parse_authority("Example.com:443", None).unwrap();
        assert_eq!(t.host, name("example.com"));
        assert_eq!(t.port, 443);
        assert_eq!(parse_authority("example.com", Some(80)).unwrap().port, 80);
        assert_eq!(
            parse_authority("example.com", None),
            Err(TargetError::MissingPort)
        );
        let t = parse_authority("[::ffff:127.0.0.1]:8080", None).unwrap();
        assert_eq!((t.host, t.port), (ip("127.0.0.1"), 8080));
        assert_eq!(parse_authority("[::1]", Some(80)).unwrap().port, 80);
        for (bad, err) in [
            ("example.com:0", TargetError::BadPort),
            ("example.com:65536", TargetError::BadPort),
            ("example.com:99999999999", TargetError::BadPort),
            ("example.com:", TargetError::BadPort),
            ("example.com:+80", TargetError::BadPort),
            ("example.com:-1", TargetError::BadPort),
            (":80", TargetError::EmptyHost),
            ("", TargetError::EmptyHost),
            ("allowed.com@evil.com:443", TargetError::Userinfo),
            ("user:pass@allowed.com:443", TargetError::Userinfo),
            ("evil.com#@allowed.com:443", TargetError::Userinfo),
            ("evil.com#.allowed.com:443", TargetError::BadChar),
            ("evil.com/.allowed.com:443", TargetError::BadChar),
            ("evil.com\\.allowed.com:443", TargetError::BadChar),
            ("evil.com%2f.allowed.com:443", TargetError::BadChar),
            ("evil.com?.allowed.com:443", TargetError::BadChar),
            ("allowed.com :443", TargetError::BadChar),
            ("allowed.com\r\n:443", TargetError::BadChar),
            ("::1:443", TargetError::BadChar),
            ("[::1]x:443", TargetError::BadChar),
            ("a:b:443", TargetError::BadChar),
        ] {
            assert_eq!(parse_authority(bad, Some(80)), Err(err), "{bad:?}");
        }
    }

    #[test]
    fn target_display() {
        let t = parse_authority("[2001:db8::1]:443", None).unwrap();
        assert_eq!(t.to_string(), "[2001:db8::1]:443");
        let t = parse_authority("example.com:80", None).unwrap();
        assert_eq!(t.to_string(), "example.com:80");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(s in "\\PC{0,80}") {
                let _ = parse_authority(&s, Some(80));
                let _ = parse_host(&s);
            }

            #[test]
            fn dotted_decimal_roundtrip(raw in any::<u32>()) {
                let v4 = Ipv4Addr::from(raw);
                prop_assert_eq!(parse_host(&v4.to_string()).unwrap(), Host::Ip(IpAddr::V4(v4)));
                prop_assert_eq!(parse_host(&raw.to_string()).unwrap(), Host::Ip(IpAddr::V4(v4)));
                prop_assert_eq!(parse_host(&format!("0x{raw:x}")).unwrap(), Host::Ip(IpAddr::V4(v4)));
                prop_assert_eq!(parse_host(&format!("0{raw:o}")).unwrap(), Host::Ip(IpAddr::V4(v4)));
            }

            #[test]
            fn normalised_names_are_fixed_points(s in "[a-zA-Z0-9]{1,10}(\\.[a-zA-Z]{1,10}){1,3}\\.?") {
                if let Ok(Host::Name(n)) = parse_host(&s) {
                    prop_assert_eq!(parse_host(&n).unwrap(), Host::Name(n.clone()));
                    prop_assert!(!n.ends_with('.'));
                    prop_assert_eq!(n.to_ascii_lowercase(), n);
                }
            }
        }
    }
}
