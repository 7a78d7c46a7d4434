//! The egress gateway's destination parsing: a CONNECT authority or a proxy request's host
//! (`parse_authority`, `parse_host`), a redirect's Location (`redirect_target`), the
//! allowlist's rules (`compile_policy`, from the manifest) and the match of a parsed
//! destination against them, and the classification of the addresses a name resolves to.
//! (The HTTP framing itself is hyper's.)
#![no_main]

use std::net::{IpAddr, Ipv6Addr};

use agentjail_egress::host::{parse_authority, parse_host};
use agentjail_egress::{compile_policy, redirect_target};
use agentjail_manifest::{AllowRule, EgressPolicy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Every 16-byte window is also an address that DNS could return.
    for w in data.chunks(16) {
        let mut b = [0u8; 16];
        b[..w.len()].copy_from_slice(w);
        let ip = IpAddr::V6(Ipv6Addr::from(b));
        let _ = agentjail_egress::addr::classify(agentjail_egress::addr::canonical(ip));
    }
    let _ = redirect_target(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The text split at the first newline: a rule (host, then `allow_private` CIDRs after a
    // space) and a destination.
    let (rule, dest) = text.split_once('\n').unwrap_or((text, text));
    let mut words = rule.split(' ');
    let host = words.next().unwrap_or_default().to_string();
    let allow_private: Vec<String> = words.map(str::to_string).collect();
    let policy = compile_policy(&EgressPolicy {
        allow: vec![AllowRule {
            host,
            ports: vec![443, 80],
        }],
        allow_private,
        ..EgressPolicy::default()
    });
    let _ = parse_host(dest);
    for default in [None, Some(80), Some(443)] {
        if let Ok(t) = parse_authority(dest, default) {
            assert_ne!(t.port, 0, "a parsed destination never has port 0");
            if let Ok(p) = &policy {
                let _ = p.match_target(&t);
            }
        }
    }
});
