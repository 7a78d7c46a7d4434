#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

fn example() -> Config {
    Config::example().unwrap()
}

#[test]
fn example_parses_and_validates() {
    let c = example();
    let t = &c.tasks["summarize_csv"];
    assert_eq!(t.code, CodePolicy::Allowed);
    assert_eq!(t.inputs.len(), 1);
    assert!(
        t.output
            .schema
            .as_ref()
            .unwrap()
            .value()
            .unwrap()
            .is_object()
    );
    assert_eq!(c.tasks["csv_line_count"].code, CodePolicy::Forbidden);
}

#[test]
fn yaml_is_recognised_by_content() {
    let y = r#"
tenants: { acme: {} }
actors:
  bot: { tenant: acme, token_sha256: "0000000000000000000000000000000000000000000000000000000000000001" }
tasks:
  t:
    description: d
    code: forbidden
    command: ["/bin/true"]
    output: { path: /output/o.json, media_type: application/json, max_bytes: 10, schema: { type: object } }
    allowed_actors: [bot]
"#;
    let c = Config::parse(y).unwrap();
    assert!(c.may_use("bot", "acme", &c.tasks["t"]));
    assert!(!c.may_use("other", "acme", &c.tasks["t"]));
}

fn with(edit: impl Fn(&mut String)) -> Result<Config, ConfigError> {
    let mut s = EXAMPLE_CONFIG.to_string();
    edit(&mut s);
    Config::parse(&s)
}

#[test]
fn refusals_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        ("tenant = \"dev\"", "tenant = \"nope\"", "actors.dev.tenant"),
        (
            "token_sha256 = \"d5e4",
            "token_sha256 = \"D5E4",
            "token_sha256",
        ),
        (
            "mount = \"/input/data.csv\"",
            "mount = \"/etc/passwd\"",
            "inputs[0].mount",
        ),
        (
            "mount = \"/input/data.csv\"",
            "mount = \"/input/../etc\"",
            "inputs[0].mount",
        ),
        (
            "path = \"/output/summary.json\"",
            "path = \"/tmp/x\"",
            "output.path",
        ),
        ("\nseconds = 30\n", "\nseconds = 0\n", "limits.seconds"),
        ("memory_mb = 256", "memory_mb = 1", "limits.memory_mb"),
        (
            "code = \"allowed\"",
            "code = \"maybe\"",
            "unknown variant `maybe`",
        ),
        (
            "allowed_tenants = [\"dev\"]\n\n[[tasks.summarize_csv",
            "allowed_tenants = [\"ghost\"]\n\n[[tasks.summarize_csv",
            "allowed_tenants",
        ),
        (
            "network = \"deny\"\nallowed_tenants = [\"dev\"]\n\n[[tasks.summarize_csv",
            "network = \"allow-all\"\nallowed_tenants = [\"dev\"]\n\n[[tasks.summarize_csv",
            "network",
        ),
        (
            "[tasks.summarize_csv.retention]",
            "[tasks.summarize_csv.retention]\nforever = true",
            "forever",
        ),
    ];
    for (from, to, needle) in cases {
        let r = with(|s| *s = s.replacen(from, to, 1));
        let e = r.err().unwrap_or_else(|| panic!("{to} accepted"));
        assert!(e.0.contains(needle), "{to}: {e}");
    }
}

#[test]
fn code_mount_cannot_overlap_an_input() {
    let r = with(|s| {
        *s = s.replacen(
            "code_mount = \"/input/code.py\"",
            "code_mount = \"/input/data.csv\"",
            1,
        )
    });
    assert!(r.unwrap_err().0.contains("overlap"));
}

#[test]
fn invalid_schema_is_refused() {
    let r = with(|s| {
        *s = s.replacen(
            "\"type\": \"object\",\n  \"additionalProperties\"",
            "\"type\": 12,\n  \"additionalProperties\"",
            1,
        )
    });
    assert!(r.unwrap_err().0.contains("output.schema"));
}

#[test]
fn allowlist_network_parses() {
    let c = with(|s| {
        *s = s.replacen(
            "network = \"deny\"\nallowed_tenants = [\"dev\"]\n\n[[tasks.summarize_csv",
            "network = { allow = [{ host = \"api.example.com\", ports = [443] }] }\nallowed_tenants = [\"dev\"]\n\n[[tasks.summarize_csv",
            1,
        )
    })
    .unwrap();
    assert!(matches!(
        c.tasks["summarize_csv"].network,
        agentjail_manifest::Network::Allow(_)
    ));
}

#[test]
fn tokens_match_by_hash_only() {
    let c = with(|s| {
        *s = s.replace(
            "d5e4ecbb8f38ddf7527a6c7ad5f76bae7a2698cd5caeee1257ec62e8566a180d",
            &sha256_hex(b"s3cret"),
        )
    })
    .unwrap();
    assert_eq!(c.actor_for_token("s3cret").map(|a| a.0), Some("dev"));
    assert!(c.actor_for_token("s3cre").is_none());
    assert!(
        c.actor_for_token(&sha256_hex(b"s3cret")).is_none(),
        "the hash is not a token"
    );
}

#[test]
fn duplicate_token_hashes_are_refused() {
    let r = with(|s| {
        s.push_str("\n[actors.twin]\ntenant = \"dev\"\ntoken_sha256 = \"d5e4ecbb8f38ddf7527a6c7ad5f76bae7a2698cd5caeee1257ec62e8566a180d\"\n")
    });
    assert!(r.unwrap_err().0.contains("shared"));
}

#[test]
fn schema_is_generated() {
    let s = Config::json_schema();
    assert!(s["properties"]["tasks"].is_object());
}

#[test]
fn ct_eq_works() {
    assert!(ct_eq(&[1; 32], &[1; 32]));
    let mut b = [1; 32];
    b[31] = 2;
    assert!(!ct_eq(&[1; 32], &b));
}

#[test]
fn a_live_session_needs_a_code_task_on_the_native_tier() {
    let live = |s: &mut String| {
        *s = s.replacen(
            "[tasks.summarize_csv.limits]",
            "[tasks.summarize_csv.session]\ninterpreter = \"python\"\n[tasks.summarize_csv.limits]",
            1,
        )
    };
    assert!(with(live).is_ok());
    let r = with(|s| {
        live(s);
        *s = s.replacen(
            "network = \"deny\"\nallowed_tenants = [\"dev\"]",
            "network = \"deny\"\nisolation = \"gvisor\"\nallowed_tenants = [\"dev\"]",
            1,
        );
    });
    let e = r
        .err()
        .unwrap_or_else(|| panic!("a live session on gVisor accepted"));
    assert!(e.0.contains("session.interpreter"), "{e}");
}

#[test]
fn a_task_image_must_be_a_sha256_digest() {
    let mut c = example();
    let good = format!("sha256:{}", "0a".repeat(32));
    c.tasks.get_mut("summarize_csv").unwrap().image = Some(good);
    c.validate().unwrap();
    for bad in [
        "python:3.12",
        "sha256:abc",
        &format!("sha256:{}", "0A".repeat(32)),
        &format!("sha512:{}", "0a".repeat(32)),
        &format!("sha256:{}/../x", "0a".repeat(32)),
    ] {
        c.tasks.get_mut("summarize_csv").unwrap().image = Some(bad.to_string());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("tasks.summarize_csv.image"), "{bad}: {e}");
    }
}
