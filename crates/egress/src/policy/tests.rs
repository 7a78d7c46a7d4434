//! The unit tests of [`super`] (the compiled allowlist): compiling and matching.

use super::*;
use crate::host::parse_authority;
use agentjail_manifest::AllowRule;

fn policy(rules: &[(&str, &[u16])], private: &[&str]) -> Result<CompiledPolicy, PolicyError> {
    compile_policy(&EgressPolicy {
        allow: rules
            .iter()
            .map(|(h, p)| AllowRule {
                host: (*h).into(),
                ports: p.to_vec(),
            })
            .collect(),
        allow_private: private.iter().map(|s| (*s).into()).collect(),
        ..EgressPolicy::default()
    })
}

fn allowed(p: &CompiledPolicy, authority: &str) -> bool {
    match parse_authority(authority, None) {
        Ok(t) => p.match_target(&t).is_ok(),
        Err(_) => false,
    }
}

#[test]
fn exact_and_wildcard_rules() {
    let p = policy(
        &[
            ("api.example.com", &[443]),
            ("*.pypi.example", &[443, 80]),
            ("BÜCHER.example", &[443]),
            ("trailing.example.", &[443]),
        ],
        &[],
    )
    .unwrap();
    let cases = [
        ("api.example.com:443", true),
        ("API.Example.COM:443", true),
        ("api.example.com.:443", true),
        ("api.example.com:80", false),
        ("example.com:443", false),
        ("x.api.example.com:443", false),
        ("api.example.com.evil.com:443", false),
        ("evilapi.example.com:443", false),
        ("files.pypi.example:443", true),
        ("a.b.c.pypi.example:80", true),
        ("pypi.example:443", false),
        ("xpypi.example:443", false),
        (".pypi.example:443", false),
        ("files.pypi.example:8080", false),
        ("xn--bcher-kva.example:443", true),
        ("bücher.example:443", true),
        ("BÜCHER.EXAMPLE.:443", true),
        ("trailing.example:443", true),
        ("allowed.com@api.example.com:443", false),
        ("api.example.com@evil.com:443", false),
        ("evil.com#@api.example.com:443", false),
    ];
    for (a, want) in cases {
        assert_eq!(allowed(&p, a), want, "{a}");
    }
}

#[test]
fn refusal_reasons() {
    let p = policy(&[("api.example.com", &[443])], &[]).unwrap();
    let t = parse_authority("api.example.com:80", None).unwrap();
    assert_eq!(
        p.match_target(&t).unwrap_err().to_string(),
        "port 80 is not allowed for api.example.com"
    );
    let t = parse_authority("evil.com:443", None).unwrap();
    assert_eq!(
        p.match_target(&t).unwrap_err().to_string(),
        "host evil.com is not in the allowlist"
    );
    let t = parse_authority("2130706433:443", None).unwrap();
    assert_eq!(
        p.match_target(&t).unwrap_err().to_string(),
        "IP literal 127.0.0.1 is not in the allowlist"
    );
    let t = parse_authority("api.example.com:443", None).unwrap();
    assert_eq!(p.match_target(&t).unwrap(), "api.example.com:443");
}

#[test]
fn ip_literals_match_only_exact_ip_rules() {
    let p = policy(
        &[("allowed.test", &[80]), ("127.0.0.1", &[8080])],
        &["127.0.0.1/32"],
    )
    .unwrap();
    for form in [
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
    ] {
        assert!(allowed(&p, &format!("{form}:8080")), "{form}");
        assert!(!allowed(&p, &format!("{form}:80")), "{form}");
    }
    // A name rule never matches an IP, an IP rule never matches a name.
    assert!(!allowed(&p, "127.0.0.2:8080"));
    assert!(!allowed(&p, "[::1]:8080"));
    assert!(!allowed(&p, "[::127.0.0.1]:8080"));
    let p = policy(&[("allowed.test", &[80])], &["127.0.0.0/8"]).unwrap();
    for form in ["127.0.0.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]"] {
        assert!(!allowed(&p, &format!("{form}:80")), "{form}");
    }
}

#[test]
fn compile_errors_name_the_entry() {
    type Case<'a> = (&'a [(&'a str, &'a [u16])], &'a [&'a str], &'a str);
    let cases: &[Case] = &[
        (
            &[("", &[443])],
            &[],
            "network.allow[0]: host \"\" is invalid",
        ),
        (
            &[("ok.example", &[443]), ("bad host", &[443])],
            &[],
            "network.allow[1]: host \"bad host\"",
        ),
        (&[("*.com", &[443])], &[], "at least two labels"),
        (&[("*", &[443])], &[], "network.allow[0]"),
        (
            &[("a.*.example.com", &[443])],
            &[],
            "only allowed as the whole leftmost label",
        ),
        (&[("*.127.0.0.1", &[443])], &[], "wildcard cannot cover IP"),
        (&[("api.example.com", &[])], &[], "lists no ports"),
        (&[("api.example.com", &[0])], &[], "port 0"),
        (&[("user@api.example.com", &[443])], &[], "userinfo"),
        (&[("api.example.com:443", &[443])], &[], "network.allow[0]"),
        (
            &[("10.0.0.1", &[443])],
            &[],
            "10.0.0.1 is a private-use (RFC 1918) address",
        ),
        (&[("169.254.169.254", &[80])], &[], "link-local"),
        (&[("256.1.1.1", &[80])], &[], "not a valid IPv4"),
        (
            &[],
            &["10.0.0.0/33"],
            "network.allow_private[0]: \"10.0.0.0/33\"",
        ),
        (&[], &["ten"], "not an IP address or CIDR"),
        (&[], &["0.0.0.0/0"], "disable the address check"),
        (&[], &["::/0"], "disable the address check"),
        (&[(" api.example.com", &[443])], &[], "whitespace"),
    ];
    for (rules, private, want) in cases {
        let err = policy(rules, private).unwrap_err().to_string();
        assert!(err.contains(want), "{err:?} does not contain {want:?}");
        assert!(!err.contains('\n'));
    }
}

#[test]
fn private_ip_rule_allowed_with_exception() {
    let p = policy(
        &[("10.0.0.1", &[443]), ("::1", &[80])],
        &["10.0.0.0/8", "::1"],
    )
    .unwrap();
    assert_eq!(
        p.rules(),
        vec!["10.0.0.1:443".to_string(), "[::1]:80".into()]
    );
    assert!(allowed(&p, "10.0.0.1:443"));
    assert!(allowed(&p, "[::1]:80"));
}

#[test]
fn address_check_with_and_without_exceptions() {
    let p = policy(&[("a.example", &[443])], &["127.0.0.1/32", "fd00::/8"]).unwrap();
    let ok = |s: &str| {
        p.check_address(s.parse().unwrap())
            .map_err(|e| e.to_string())
    };
    assert_eq!(ok("93.184.216.34"), Ok(None));
    assert!(
        ok("127.0.0.1")
            .unwrap()
            .unwrap()
            .contains("allow_private 127.0.0.1/32")
    );
    assert!(ok("::ffff:127.0.0.1").is_ok());
    assert!(ok("fd00:ec2::254").is_ok());
    assert_eq!(ok("127.0.0.2"), Err("address 127.0.0.2 is loopback".into()));
    assert!(ok("10.0.0.1").unwrap_err().contains("private-use"));
    assert!(ok("169.254.169.254").unwrap_err().contains("link-local"));
    assert!(ok("100.64.1.1").unwrap_err().contains("CGNAT"));
    assert!(ok("::1").unwrap_err().contains("loopback"));
    assert!(ok("fc00::1").unwrap_err().contains("unique-local"));
    // The exception is for the address itself, not for what a 6to4 address embeds.
    assert!(ok("2002:7f00:1::").unwrap_err().contains("6to4"));
}

#[test]
fn credentials_must_be_usable_as_written() {
    let cred =
        |host: &str, header: &str, from: &str, paths: &[&str]| agentjail_manifest::Credential {
            host: host.into(),
            header: header.into(),
            value_from: from.into(),
            paths: paths.iter().map(|p| (*p).into()).collect(),
            methods: agentjail_manifest::Credential::DEFAULT_METHODS
                .iter()
                .map(|m| (*m).into())
                .collect(),
            ports: vec![443],
        };
    let check = |c: agentjail_manifest::Credential, ca: Option<&str>| {
        compile_policy(&EgressPolicy {
            allow: vec![AllowRule {
                host: "api.example.com".into(),
                ports: vec![443],
            }],
            credentials: vec![c],
            upstream_ca_file: ca.map(Into::into),
            ..EgressPolicy::default()
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(
        check(
            cred("API.example.com.", "Authorization", "env:T", &["/v1/"]),
            None
        ),
        Ok(())
    );
    assert!(
        check(
            cred("api.example.com", "X-Key", "file:/run/k", &["/"]),
            Some("/ca.pem")
        )
        .is_ok()
    );
    for (c, want) in [
        (
            cred("other.example.com", "Authorization", "env:T", &["/"]),
            "not admitted",
        ),
        (
            cred("*.example.com", "Authorization", "env:T", &["/"]),
            "wildcard",
        ),
        (
            cred("1.2.3.4", "Authorization", "env:T", &["/"]),
            "IP address",
        ),
        (
            cred("api.example.com", "Host", "env:T", &["/"]),
            "cannot carry",
        ),
        (
            cred("api.example.com", "Proxy-Authorization", "env:T", &["/"]),
            "cannot carry",
        ),
        (
            cred("api.example.com", "bad header", "env:T", &["/"]),
            "valid header",
        ),
        (
            cred("api.example.com", "Authorization", "T", &["/"]),
            "value_from",
        ),
        (
            cred("api.example.com", "Authorization", "file:rel", &["/"]),
            "value_from",
        ),
        (
            cred("api.example.com", "Authorization", "env:", &["/"]),
            "value_from",
        ),
        (
            cred("api.example.com", "Authorization", "env:T", &[]),
            "paths is empty",
        ),
        (
            cred("api.example.com", "Authorization", "env:T", &["v1/"]),
            "must start",
        ),
        (
            cred(
                "api.example.com",
                "Authorization",
                "env:T",
                &["/v1/%2e%2e/"],
            ),
            "encoded",
        ),
        (
            cred("api.example.com", "Authorization", "env:T", &["/v1/..;/"]),
            "`;`",
        ),
        (
            agentjail_manifest::Credential {
                ports: vec![8443],
                ..cred("api.example.com", "Authorization", "env:T", &["/"])
            },
            "port 8443 is not admitted",
        ),
        (
            agentjail_manifest::Credential {
                ports: vec![],
                ..cred("api.example.com", "Authorization", "env:T", &["/"])
            },
            "ports is empty",
        ),
        (
            agentjail_manifest::Credential {
                methods: vec!["GET".into(), "TRACE".into()],
                ..cred("api.example.com", "Authorization", "env:T", &["/"])
            },
            "never carries a credential",
        ),
        (
            agentjail_manifest::Credential {
                methods: vec!["get".into()],
                ..cred("api.example.com", "Authorization", "env:T", &["/"])
            },
            "upper-case",
        ),
        (
            agentjail_manifest::Credential {
                methods: vec![],
                ..cred("api.example.com", "Authorization", "env:T", &["/"])
            },
            "methods is empty",
        ),
    ] {
        let e = check(c.clone(), None).unwrap_err();
        assert!(
            e.contains(want) && e.starts_with("network.credentials[0]"),
            "{c:?}: {e}"
        );
    }
    let e = check(
        cred("api.example.com", "Authorization", "env:T", &["/"]),
        Some("ca.pem"),
    )
    .unwrap_err();
    assert!(e.contains("absolute"), "{e}");
    let e = compile_policy(&EgressPolicy {
        upstream_ca_file: Some("/ca.pem".into()),
        ..EgressPolicy::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("no credentials"), "{e}");
}
