use super::*;

const SEED: &str = r#"request_id: example-095
image_digest: sha256:reviewed-image-placeholder
user: nonroot
inputs:
  - source: authorized-report.csv
    mount: /input/report.csv
    mode: read-only
output: /output/summary.json
network: deny
limits:
  seconds: 30
  memory_mb: 256
  processes: 16
  output_mb: 5
command: ["python3", "/input/summarize.py"]
"#;

fn policy(dir: &Path) -> SourcePolicy {
    SourcePolicy {
        base_dir: dir.to_owned(),
        roots: Some(vec![dir.canonicalize().unwrap()]),
    }
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

#[test]
fn seed_manifest_parses_as_written_plus_command() {
    let m = Manifest::parse(SEED).unwrap();
    assert_eq!(m.request_id.as_deref(), Some("example-095"));
    assert_eq!(m.limits, Limits::default());
    assert_eq!(m.inputs[0].mode, Mode::ReadOnly);
}

#[test]
fn json_is_recognised_by_content() {
    let m = Manifest::parse(r#"{"command":["true"],"limits":{"seconds":5}}"#).unwrap();
    assert_eq!(m.limits.seconds, 5);
    assert_eq!(m.limits.memory_mb, 256);
}

#[test]
fn unknown_field_is_named_with_its_line() {
    let err = Manifest::parse("command: [true]\nlimits:\n  seconds: 3\n  gpus: 2\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("gpus"), "{err}");
    assert!(err.contains("line 4"), "{err}");
    let err = Manifest::parse("{\"command\":[\"true\"],\n\"bogus\":1}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("bogus") && err.contains("line 2"), "{err}");
}

#[test]
fn refuses_root_user_and_writable_inputs() {
    let e = Manifest::parse("command: [x]\nuser: root\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("root"), "{e}");
    let e = Manifest::parse(
        "command: [x]\ninputs:\n - {source: a, mount: /input/a, mode: read-write}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("read-write"), "{e}");
}

#[test]
fn refuses_bad_limits() {
    let d = tempfile::tempdir().unwrap();
    for (k, v) in [
        ("seconds", 0u64),
        ("memory_mb", 1),
        ("processes", 100000),
        ("output_mb", 0),
    ] {
        let text = format!("command: [x]\nlimits:\n  {k}: {v}\n");
        let e = Manifest::parse(&text)
            .unwrap()
            .validate(&policy(d.path()), now())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("limits.{k}")), "{e}");
    }
}

#[test]
fn refuses_mounts_outside_input_and_work() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("a"), "x").unwrap();
    for mount in [
        "/etc/passwd",
        "/input/../etc/x",
        "/output/a",
        "/input",
        "relative",
        "/input/./a",
    ] {
        let text = format!("command: [x]\ninputs:\n - {{source: a, mount: \"{mount}\"}}\n");
        let e = Manifest::parse(&text)
            .unwrap()
            .validate(&policy(d.path()), now())
            .unwrap_err()
            .to_string();
        assert!(e.contains("inputs[0].mount"), "{mount}: {e}");
    }
}

/// Inline inputs (the service's code, by value) are mounted where inputs are, overlap nothing,
/// and are bounded in number and size; a valid one is kept with its mount normalized.
#[test]
fn inline_inputs_are_checked_like_mounts_and_bounded() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("a"), "x").unwrap();
    let check = |text: String| {
        Manifest::parse(&text)
            .unwrap()
            .validate(&policy(d.path()), now())
    };
    for mount in [
        "/etc/x",
        "/output/a",
        "/input",
        "/work/../etc/x",
        "/input/a",
        "/input/a/b",
    ] {
        let e = check(format!(
            "command: [x]\ninputs:\n - {{source: a, mount: /input/a}}\ninline_inputs:\n - {{mount: \"{mount}\", content: y}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("inline_inputs[0].mount"), "{mount}: {e}");
    }
    let e = check("command: [x]\ninline_inputs:\n - {mount: /work/a, content: y}\n - {mount: /work/a, content: z}\n".into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("inline_inputs[1].mount") && e.contains("overlaps"),
        "{e}"
    );
    let nine: String = (0..9)
        .map(|i| format!(" - {{mount: /input/f{i}, content: y}}\n"))
        .collect();
    let e = check(format!("command: [x]\ninline_inputs:\n{nine}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 8 inline inputs"), "{e}");
    let mut m = Manifest::for_command(vec!["x".into()]);
    m.inline_inputs.push(InlineInput {
        mount: "/input/big".into(),
        content: "y".repeat(bounds::MAX_INLINE_BYTES + 1),
    });
    let e = m
        .clone()
        .validate(&policy(d.path()), now())
        .unwrap_err()
        .to_string();
    assert!(e.contains("inline_inputs[0].content"), "{e}");
    m.inline_inputs[0].content.pop();
    m.inline_inputs[0].mount = "/work//code.py".into();
    let vm = m.validate(&policy(d.path()), now()).unwrap();
    assert_eq!(vm.inline[0].mount, "/work/code.py");
    assert_eq!(vm.inline[0].content.len(), bounds::MAX_INLINE_BYTES);
}

#[test]
fn refuses_sources_escaping_the_manifest_folder() {
    let outer = tempfile::tempdir().unwrap();
    let inner = outer.path().join("m");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(outer.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outer.path().join("secret"), inner.join("link")).unwrap();
    for src in ["../secret", "link", "/etc/hostname"] {
        let text = format!("command: [x]\ninputs:\n - {{source: \"{src}\", mount: /input/a}}\n");
        let e = Manifest::parse(&text)
            .unwrap()
            .validate(&policy(&inner), now())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("inputs[0].source") && e.contains("outside"),
            "{src}: {e}"
        );
    }
}

#[test]
fn refuses_expired_manifest() {
    let d = tempfile::tempdir().unwrap();
    let e = Manifest::parse("command: [x]\nexpires_at: 2020-01-01T00:00:00Z\n")
        .unwrap()
        .validate(&policy(d.path()), now())
        .unwrap_err()
        .to_string();
    assert!(e.contains("expired"), "{e}");
    assert!(
        Manifest::parse("command: [x]\nexpires_at: 2999-01-01T00:00:00Z\n")
            .unwrap()
            .validate(&policy(d.path()), now())
            .is_ok()
    );
}

#[test]
fn output_must_be_below_output() {
    let d = tempfile::tempdir().unwrap();
    let e = Manifest::parse("command: [x]\noutput: /work/x.json\n")
        .unwrap()
        .validate(&policy(d.path()), now())
        .unwrap_err()
        .to_string();
    assert!(e.contains("`output`"), "{e}");
}

#[test]
fn digest_is_stable_and_sensitive() {
    let a = Manifest::parse("command: [a, b]\nenv: {B: '1', A: '2'}\n").unwrap();
    let b = Manifest::parse(r#"{"env":{"A":"2","B":"1"},"command":["a","b"]}"#).unwrap();
    assert_eq!(a.canonical_digest().unwrap(), b.canonical_digest().unwrap());
    let c = Manifest::parse("command: [a, c]\nenv: {B: '1', A: '2'}\n").unwrap();
    assert_ne!(a.canonical_digest().unwrap(), c.canonical_digest().unwrap());
}

#[test]
fn schema_is_generated_from_types() {
    let s = Manifest::json_schema();
    assert!(s["properties"]["limits"].is_object());
    assert_eq!(s["required"], serde_json::json!(["command"]));
}

#[test]
fn network_is_deny_or_an_allowlist() {
    let m = Manifest::parse("command: [x]\nnetwork: deny\n").unwrap();
    assert_eq!(m.network, Network::Deny);
    let m = Manifest::parse(
        "command: [x]\nnetwork:\n  allow:\n    - host: api.example.com\n      ports: [443]\n  allow_private: [127.0.0.1/32]\n",
    )
    .unwrap();
    match &m.network {
        Network::Allow(p) => {
            assert_eq!(p.allow[0].host, "api.example.com");
            assert_eq!(p.allow_private, vec!["127.0.0.1/32".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    let back = serde_json::to_value(&m).unwrap();
    assert_eq!(back["network"]["allow"][0]["ports"][0], 443);
    assert!(Manifest::parse("command: [x]\nnetwork: allow-all\n").is_err());
    assert_eq!(
        serde_json::to_value(Manifest::for_command(vec!["x".into()])).unwrap()["network"],
        "deny"
    );
}

#[test]
fn yaml_aliases_cannot_expand_beyond_the_budget() {
    // 200 KB of text repeated 100 times by aliases would be 20 MB of strings.
    let big = "x".repeat(200_000);
    let text = format!("command: [&s \"{big}\", {}]\n", vec!["*s"; 100].join(", "));
    let e = Manifest::parse(&text).unwrap_err().to_string();
    assert!(e.contains("expands to more than"), "{e}");
    // Modest reuse is still fine.
    let m = Manifest::parse("command: &c [/bin/echo]\nenv: {A: &v x, B: *v}\n").unwrap();
    assert_eq!(m.env["B"], "x");
}

#[test]
fn workspace_is_checked_and_its_checkpoint_resolved_like_a_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ck.tar"), b"").unwrap();
    let sha = format!("sha256:{}", "a".repeat(64));
    let check = |ws: &str| {
        Manifest::parse(&format!("command: [\"true\"]\nworkspace: {ws}\n"))
            .and_then(|m| m.validate(&policy(dir.path()), now()))
    };
    let ok = check(&format!(
        "{{restore: ck.tar, restore_sha256: \"{sha}\", collect: true}}"
    ))
    .unwrap();
    let w = ok.workspace.unwrap();
    assert_eq!(w.restore.as_ref().unwrap().1, sha);
    assert!(w.restore.unwrap().0.is_absolute());
    assert_eq!((w.max_bytes, w.max_files), (64 << 20, 10_000));
    // Without a workspace the manifest's digest is what it was.
    let plain = Manifest::for_command(vec!["true".into()]);
    assert!(!serde_json::to_string(&plain).unwrap().contains("workspace"));
    for (ws, why) in [
        ("{restore: ck.tar}".to_string(), "restore_sha256"),
        (
            format!("{{restore_sha256: \"{sha}\"}}"),
            "without `restore`",
        ),
        (
            "{restore: ck.tar, restore_sha256: \"sha256:AB\"}".into(),
            "64 lowercase hex",
        ),
        (
            format!("{{restore: ../ck.tar, restore_sha256: \"{sha}\"}}"),
            "workspace.restore",
        ),
        ("{max_mb: 0}".into(), "workspace.max_mb"),
        ("{max_mb: 1025}".into(), "workspace.max_mb"),
        ("{max_files: 10001}".into(), "workspace.max_files"),
        ("{colect: true}".into(), "colect"),
    ] {
        let err = check(&ws).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(why), "{ws}: {err}");
    }
    let gvisor =
        Manifest::parse("command: [\"true\"]\nisolation: gvisor\nworkspace: {collect: true}\n")
            .unwrap()
            .validate(&policy(dir.path()), now());
    assert!(gvisor.unwrap_err().to_string().contains("gvisor"));
}
