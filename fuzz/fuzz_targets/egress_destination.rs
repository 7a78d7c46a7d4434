//! The egress gateway's destination parsing: a CONNECT authority or a proxy request's host
//! (`parse_authority`, `parse_host`), a redirect's Location (`redirect_target`), the
//! allowlist's rules (`compile_policy`, from the manifest) and the match of a parsed
//! destination against them, and the classification of the addresses a name resolves to.
//! The credentialed path too: the path rule of a credentialed host (`unambiguous_path`: a
//! path it admits means the same after any number of percent-decodings), and the masking of
//! an echoed secret in a body that arrives in chunks (`BodyMasker`: same length out, no copy
//! left, wherever the chunks are cut), and the search for a request smuggled in a request
//! body (`SmuggleScanner`: the same verdict wherever the chunks are cut, and a body it passes
//! comes out unchanged). (The HTTP framing itself is hyper's.)
#![no_main]

use std::net::{IpAddr, Ipv6Addr};

use agentjail_egress::credential::{BodyMasker, Needles, SmuggleScanner, unambiguous_path};
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
    credentialed(rule, dest, data);
    for default in [None, Some(80), Some(443)] {
        if let Ok(t) = parse_authority(dest, default) {
            assert_ne!(t.port, 0, "a parsed destination never has port 0");
            if let Ok(p) = &policy {
                let _ = p.match_target(&t);
            }
        }
    }
});

/// Percent-decodes `s` once (invalid escapes are kept as they are).
fn decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(h) = std::str::from_utf8(h)
            && h.bytes().all(|b| b.is_ascii_hexdigit())
            && let Ok(v) = u8::from_str_radix(h, 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

fn credentialed(secret: &str, path: &str, data: &[u8]) {
    if unambiguous_path(path).is_ok() {
        // What an upstream decodes is what the gateway matched: the same segments, no dot
        // segment, no `\` or `;`, and nothing left to decode a second time.
        let once = decode(path.as_bytes());
        assert_eq!(decode(&once), once, "{path:?} decodes twice");
        assert_eq!(
            once.iter().filter(|&&b| b == b'/').count(),
            path.bytes().filter(|&b| b == b'/').count(),
            "{path:?} hides a `/`"
        );
        assert!(!once.contains(&b'\\') && !once.contains(&b';'), "{path:?}");
        assert!(
            once.split(|&b| b == b'/')
                .all(|seg| seg != b"." && seg != b".."),
            "{path:?} hides a dot segment"
        );
    }
    // The first line as a secret, the whole input as a body cut where its bytes say.
    if secret.contains('*') {
        return; // the mask's own byte
    }
    let needles = Needles::new([secret.as_bytes()]);
    let mut m = BodyMasker::new(needles.clone());
    let mut out = Vec::new();
    let mut rest = data;
    let mut cuts = data.iter().cycle();
    while !rest.is_empty() {
        let n = (usize::from(*cuts.next().unwrap_or(&1)) % 17)
            .max(1)
            .min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        out.extend(m.push(chunk));
        rest = tail;
    }
    out.extend(m.finish());
    assert_eq!(out.len(), data.len(), "masking changed the body's length");
    let mut again = out.clone();
    assert_eq!(
        needles.mask(&mut again),
        0,
        "a copy of the secret was left in the body"
    );

    let mut sc = SmuggleScanner::default();
    let mut passed = Vec::new();
    let mut refused = false;
    let mut rest = data;
    let mut cuts = data.iter().rev().cycle();
    while !rest.is_empty() {
        let n = (usize::from(*cuts.next().unwrap_or(&1)) % 23)
            .max(1)
            .min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        match sc.push(chunk) {
            Ok(b) => passed.extend(b),
            Err(_) => {
                refused = true;
                break;
            }
        }
        rest = tail;
    }
    if !refused {
        match sc.finish() {
            Ok(b) => {
                passed.extend(b);
                assert_eq!(passed, data, "a body that passed came out changed");
            }
            Err(_) => refused = true,
        }
    }
    let mut one = SmuggleScanner::default();
    let whole = match one.push(data) {
        Ok(_) => one.finish().is_err(),
        Err(_) => true,
    };
    assert_eq!(
        refused, whole,
        "the verdict depends on where the chunks are cut"
    );
}
