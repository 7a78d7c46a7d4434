//! Address classification: is an IP address a publicly routable unicast destination?
//!
//! Everything that is not plainly public unicast is classified with a short, human-readable
//! reason: loopback, private-use (RFC 1918), shared/CGNAT, link-local (including the cloud
//! metadata address 169.254.169.254), unique-local (fc00::/7, including fd00:ec2::254),
//! multicast, unspecified, broadcast, documentation, benchmarking and other reserved ranges of
//! the IANA special-purpose registries. IPv6 addresses that embed an IPv4 address
//! (IPv4-mapped, IPv4-compatible, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, Teredo `2001::/32`)
//! are classified by the embedded IPv4 address too, so a blocked IPv4 address cannot be
//! reached through its IPv6 spelling.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not a public unicast destination.
///
/// The `Display` text is short and stable enough to appear in a decision's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrClass {
    /// `0.0.0.0/8`, `::/128`.
    Unspecified,
    /// `127.0.0.0/8`, `::1/128`.
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// RFC 6598 shared address space (carrier-grade NAT): `100.64/10`.
    SharedCgnat,
    /// `169.254/16` (including 169.254.169.254), `fe80::/10`.
    LinkLocal,
    /// Unique local addresses `fc00::/7` (including fd00:ec2::254).
    UniqueLocal,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// TEST-NET-1/2/3, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18/15`, `2001:2::/48`.
    Benchmarking,
    /// Other reserved or special-purpose ranges (`240/4`, `192.0.0/24`, `192.88.99/24`,
    /// `100::/64`, `2001::/23`, `fec0::/10`, anything outside `2000::/3`, ...).
    Reserved,
}

impl std::fmt::Display for AddrClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddrClass::Unspecified => "unspecified",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private-use (RFC 1918)",
            AddrClass::SharedCgnat => "shared address space (CGNAT, RFC 6598)",
            AddrClass::LinkLocal => "link-local",
            AddrClass::UniqueLocal => "unique-local (fc00::/7)",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Documentation => "documentation range",
            AddrClass::Benchmarking => "benchmarking range",
            AddrClass::Reserved => "reserved / special-purpose",
        })
    }
}

/// The result of classifying an address: `None` means public unicast.
///
/// When the address is IPv6 and embeds an IPv4 address, `via` names the embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classification {
    /// The class of the address (or of the IPv4 address it embeds).
    pub class: AddrClass,
    /// The embedding through which the class was found, e.g. `"6to4"`; `None` when the
    /// address itself is in the range.
    pub via: Option<&'static str>,
}

impl std::fmt::Display for Classification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.via {
            None => write!(f, "{}", self.class),
            Some(via) => write!(f, "{} (embedded via {via})", self.class),
        }
    }
}

/// Maps an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) to its IPv4 address; other addresses
/// are returned unchanged. The gateway works on canonical addresses throughout, so
/// `[::ffff:127.0.0.1]` and `127.0.0.1` are the same destination.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Classifies `ip`. `None` means it is a public unicast address that the gateway may reach
/// without an `allow_private` exception.
pub fn classify(ip: IpAddr) -> Option<Classification> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|class| Classification { class, via: None }),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: u32, net: u32, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    ip & mask == net & mask
}

/// Classifies an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> Option<AddrClass> {
    let a = u32::from(ip);
    let net = |o: [u8; 4]| u32::from(Ipv4Addr::from(o));
    // Order matters only where ranges nest (255.255.255.255 inside 240/4).
    let table: &[([u8; 4], u32, AddrClass)] = &[
        ([0, 0, 0, 0], 8, AddrClass::Unspecified),
        ([10, 0, 0, 0], 8, AddrClass::Private),
        ([100, 64, 0, 0], 10, AddrClass::SharedCgnat),
        ([127, 0, 0, 0], 8, AddrClass::Loopback),
        ([169, 254, 0, 0], 16, AddrClass::LinkLocal),
        ([172, 16, 0, 0], 12, AddrClass::Private),
        ([192, 0, 0, 0], 24, AddrClass::Reserved),
        ([192, 0, 2, 0], 24, AddrClass::Documentation),
        ([192, 88, 99, 0], 24, AddrClass::Reserved),
        ([192, 168, 0, 0], 16, AddrClass::Private),
        ([198, 18, 0, 0], 15, AddrClass::Benchmarking),
        ([198, 51, 100, 0], 24, AddrClass::Documentation),
        ([203, 0, 113, 0], 24, AddrClass::Documentation),
        ([224, 0, 0, 0], 4, AddrClass::Multicast),
        ([255, 255, 255, 255], 32, AddrClass::Broadcast),
        ([240, 0, 0, 0], 4, AddrClass::Reserved),
    ];
    table
        .iter()
        .find(|(n, p, _)| in_v4(a, net(*n), *p))
        .map(|(_, _, c)| *c)
}

fn in_v6(ip: u128, net: u128, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    ip & mask == net & mask
}

fn v4_at(ip: u128, shift: u32) -> Ipv4Addr {
    // Truncation to the 32 bits at `shift` is the point here.
    Ipv4Addr::from(((ip >> shift) & 0xffff_ffff) as u32)
}

fn embedded(v4: Ipv4Addr, via: &'static str) -> Option<Classification> {
    classify_v4(v4).map(|class| Classification {
        class,
        via: Some(via),
    })
}

/// Classifies an IPv6 address, including the IPv4 addresses it may embed.
pub fn classify_v6(ip: Ipv6Addr) -> Option<Classification> {
    let a = u128::from(ip);
    let own = |class| Some(Classification { class, via: None });
    let net = |s: [u16; 8]| u128::from(Ipv6Addr::from(s));
    if a == 0 {
        return own(AddrClass::Unspecified);
    }
    if a == 1 {
        return own(AddrClass::Loopback);
    }
    // ::ffff:0:0/96 IPv4-mapped: exactly as the IPv4 address.
    if in_v6(a, net([0, 0, 0, 0, 0, 0xffff, 0, 0]), 96) {
        return embedded(v4_at(a, 0), "IPv4-mapped");
    }
    // 64:ff9b::/96 well-known NAT64 prefix: classified as the IPv4 address it translates to.
    if in_v6(a, net([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]), 96) {
        return embedded(v4_at(a, 0), "NAT64 64:ff9b::/96");
    }
    // 64:ff9b:1::/48 local-use NAT64 (RFC 8215).
    if in_v6(a, net([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]), 48) {
        return own(AddrClass::Reserved);
    }
    // 2002::/16 6to4: the IPv4 address is in bits 16..48.
    if in_v6(a, net([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16) {
        return embedded(v4_at(a, 80), "6to4 2002::/16");
    }
    // 2001::/32 Teredo: server IPv4 in bits 32..64, client IPv4 (inverted) in the last 32.
    if in_v6(a, net([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32) {
        let server = v4_at(a, 64);
        let client = Ipv4Addr::from(!u32::from(v4_at(a, 0)));
        return embedded(server, "Teredo server").or_else(|| embedded(client, "Teredo client"));
    }
    let table: &[([u16; 8], u32, AddrClass)] = &[
        // ::/96 IPv4-compatible (deprecated) and the rest of ::/8.
        ([0, 0, 0, 0, 0, 0, 0, 0], 8, AddrClass::Reserved),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, AddrClass::Reserved),
        (
            [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
            32,
            AddrClass::Documentation,
        ),
        ([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48, AddrClass::Benchmarking),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, AddrClass::Reserved),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, AddrClass::Documentation),
        ([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16, AddrClass::Reserved),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, AddrClass::UniqueLocal),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, AddrClass::LinkLocal),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, AddrClass::Reserved),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, AddrClass::Multicast),
    ];
    if let Some((_, _, c)) = table.iter().find(|(n, p, _)| in_v6(a, net(*n), *p)) {
        return own(*c);
    }
    // Only 2000::/3 is allocated as global unicast.
    if !in_v6(a, net([0x2000, 0, 0, 0, 0, 0, 0, 0]), 3) {
        return own(AddrClass::Reserved);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Option<AddrClass> {
        let ip: IpAddr = s.parse().unwrap();
        classify(ip).map(|c| c.class)
    }

    #[test]
    fn ipv4_table() {
        use AddrClass::*;
        let cases: &[(&str, Option<AddrClass>)] = &[
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("10.0.0.1", Some(Private)),
            ("10.255.255.255", Some(Private)),
            ("11.0.0.1", None),
            ("100.63.255.255", None),
            ("100.64.0.1", Some(SharedCgnat)),
            ("100.127.255.255", Some(SharedCgnat)),
            ("100.128.0.0", None),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("169.254.169.254", Some(LinkLocal)),
            ("169.254.0.1", Some(LinkLocal)),
            ("169.255.0.1", None),
            ("172.15.255.255", None),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.0", None),
            ("192.0.0.8", Some(Reserved)),
            ("192.0.2.1", Some(Documentation)),
            ("192.88.99.1", Some(Reserved)),
            ("192.168.1.1", Some(Private)),
            ("192.169.0.1", None),
            ("198.18.0.1", Some(Benchmarking)),
            ("198.19.255.255", Some(Benchmarking)),
            ("198.20.0.0", None),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.255", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.254", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("1.1.1.1", None),
            ("8.8.8.8", None),
            ("93.184.216.34", None),
            ("223.255.255.255", None),
        ];
        for (ip, want) in cases {
            assert_eq!(c(ip), *want, "{ip}");
        }
    }

    #[test]
    fn ipv6_table() {
        use AddrClass::*;
        let cases: &[(&str, Option<AddrClass>)] = &[
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("::2", Some(Reserved)),
            // IPv4-compatible (deprecated) of a public address: still reserved.
            ("::8.8.8.8", Some(Reserved)),
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:10.1.2.3", Some(Private)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::127.0.0.1", Some(Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::8.8.8.8", None),
            ("64:ff9b:1::1", Some(Reserved)),
            ("100::1", Some(Reserved)),
            ("2002:7f00:1::", Some(Loopback)),
            ("2002:a00:1::1", Some(Private)),
            ("2002:808:808::1", None),
            // Teredo: server 65.54.227.120 (public), client 127.0.0.1 inverted = 80ff:fffe.
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Some(Loopback)),
            // Teredo with a private server.
            ("2001:0:a00:1::", Some(Private)),
            // Teredo with public server and public client (8.8.8.8 inverted = f7f7:f7f7).
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", None),
            ("2001:db8::1", Some(Documentation)),
            ("2001:2::1", Some(Benchmarking)),
            ("2001:10::1", Some(Reserved)),
            ("3fff::1", Some(Documentation)),
            ("5f00::1", Some(Reserved)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd00:ec2::254", Some(UniqueLocal)),
            ("fdff:ffff::1", Some(UniqueLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(Reserved)),
            ("ff02::1", Some(Multicast)),
            ("4000::1", Some(Reserved)),
            ("e000::1", Some(Reserved)),
            ("2606:4700:4700::1111", None),
            ("2a00:1450:4001:80b::200e", None),
        ];
        for (ip, want) in cases {
            assert_eq!(c(ip), *want, "{ip}");
        }
    }

    #[test]
    fn embedding_is_named() {
        let cl = classify("2002:7f00:1::".parse().unwrap()).unwrap();
        assert_eq!(cl.via, Some("6to4 2002::/16"));
        assert!(cl.to_string().contains("loopback"));
        assert!(cl.to_string().contains("6to4"));
    }

    #[test]
    fn canonical_maps_only_v4_mapped() {
        assert_eq!(
            canonical("::ffff:127.0.0.1".parse().unwrap()),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            canonical("::127.0.0.1".parse().unwrap()),
            "::127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            canonical("2001:db8::1".parse().unwrap()),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn mapped_nat64_6to4_agree_with_v4(raw in any::<u32>(), tail in any::<u64>()) {
                let v4 = Ipv4Addr::from(raw);
                let want = classify_v4(v4);
                let mapped = v4.to_ipv6_mapped();
                prop_assert_eq!(classify(IpAddr::V6(mapped)).map(|c| c.class), want);
                let nat64 = Ipv6Addr::from((0x0064_ff9b_u128 << 96) | u128::from(raw));
                prop_assert_eq!(classify(IpAddr::V6(nat64)).map(|c| c.class), want);
                // 6to4 of a non-public address is never public.
                let six = Ipv6Addr::from((0x2002_u128 << 112) | (u128::from(raw) << 80) | u128::from(tail));
                if want.is_some() {
                    prop_assert_eq!(classify(IpAddr::V6(six)).map(|c| c.class), want);
                }
            }

            #[test]
            fn outside_global_unicast_is_never_public(raw in any::<u128>()) {
                let ip = Ipv6Addr::from(raw);
                let in_2000_3 = raw >> 125 == 0b001;
                let special = (raw >> 32) == 0x0064_ff9b_0000_0000_0000_0000
                    || (raw >> 32) == 0xffff;
                if !in_2000_3 && !special {
                    prop_assert!(classify(IpAddr::V6(ip)).is_some());
                }
            }

            #[test]
            fn classify_never_panics(raw in any::<u128>(), raw4 in any::<u32>()) {
                let _ = classify(IpAddr::V6(Ipv6Addr::from(raw)));
                let _ = classify(IpAddr::V4(Ipv4Addr::from(raw4)));
            }
        }
    }
}
