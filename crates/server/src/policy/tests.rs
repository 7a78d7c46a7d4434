//! The unit tests of [`super`] (policy): its decisions over a small configuration.

use super::*;

/// Two tenants; `bot` may use `code_task` by name, every actor of `acme` may use `fixed`
/// and `net`; `stranger` (tenant `other`) may use none.
const CONFIG: &str = r#"
tenants: { acme: {}, other: {} }
actors:
  bot: { tenant: acme, token_sha256: "0000000000000000000000000000000000000000000000000000000000000001" }
  op: { tenant: acme, operator: true, token_sha256: "0000000000000000000000000000000000000000000000000000000000000002" }
  stranger: { tenant: other, token_sha256: "0000000000000000000000000000000000000000000000000000000000000003" }
tasks:
  code_task:
    description: d
    code: allowed
    code_mount: /input/code.py
    max_code_bytes: 16
    max_args: 1
    command: ["/usr/bin/python3", "/input/code.py"]
    inputs:
      - { mount: /input/a.csv, media_types: [text/csv], max_bytes: 100 }
    output: { path: /output/o.json, media_type: application/json, max_bytes: 10 }
    allowed_actors: [bot]
  fixed:
    description: d
    code: forbidden
    command: ["/bin/true"]
    inputs:
      - { mount: /input/a.csv, media_types: [text/csv], max_bytes: 100 }
      - { mount: /input/b.json, media_types: [application/json], max_bytes: 5 }
    output: { path: /output/o.json, media_type: application/json, max_bytes: 10 }
    allowed_tenants: [acme]
  net:
    description: d
    code: forbidden
    command: ["/bin/true"]
    network: { allow: [{ host: api.example.com, ports: [443] }] }
    output: { path: /output/o.json, media_type: application/json, max_bytes: 10 }
    allowed_tenants: [acme]
"#;

fn config() -> Config {
    Config::parse(CONFIG).unwrap()
}

fn caller(actor: &str) -> Caller {
    let tenant = if actor == "stranger" { "other" } else { "acme" };
    Caller {
        actor: actor.into(),
        tenant: tenant.into(),
        operator: actor == "op",
    }
}

fn id(n: u8) -> String {
    format!("in_{}", format!("{n:x}").repeat(32))
}

fn input(n: u8, media_type: &str, bytes: u64) -> InputRow {
    InputRow {
        id: id(n),
        sha256: format!("{n:x}").repeat(64),
        name: "a.csv".into(),
        media_type: media_type.into(),
        bytes,
        created_at: 0,
    }
}

fn req(task: &str, inputs: &[String], code: Option<&str>, args: Option<&[&str]>) -> RunRequest {
    RunRequest {
        request_id: "r-1".into(),
        task: task.into(),
        inputs: inputs.to_vec(),
        code: code.map(str::to_owned),
        args: args.map(|a| a.iter().map(|s| s.to_string()).collect()),
    }
}

/// Every refusal a run request can get before the store is asked, with its stable code,
/// and the requests next to them that pass.
#[test]
fn run_requests_are_refused_before_any_lookup() {
    let cfg = config();
    let one = [id(1)];
    let two = [id(1), id(2)];
    let long = "x".repeat(17);
    let cases: Vec<(&str, RunRequest, Result<&str, Refusal>)> = vec![
        (
            "admitted",
            req("code_task", &one, Some("print(1)"), None),
            Ok("code_task"),
        ),
        ("tenant ACL", req("fixed", &two, None, None), Ok("fixed")),
        (
            "not a task name",
            req("Code_Task", &one, Some("x"), None),
            Err(Refusal::UnknownTask),
        ),
        (
            "path as task",
            req("../fixed", &two, None, None),
            Err(Refusal::UnknownTask),
        ),
        (
            "no such task",
            req("nope", &one, None, None),
            Err(Refusal::UnknownTask),
        ),
        (
            "code for a fixed program",
            req("fixed", &two, Some("x"), None),
            Err(Refusal::CodeNotAccepted),
        ),
        (
            "no code",
            req("code_task", &one, None, None),
            Err(Refusal::CodeRequired),
        ),
        (
            "code too long",
            req("code_task", &one, Some(&long), None),
            Err(Refusal::CodeTooLarge { max: 16 }),
        ),
        (
            "NUL in code",
            req("code_task", &one, Some("a\0b"), None),
            Err(Refusal::CodeTooLarge { max: 16 }),
        ),
        (
            "too many args",
            req("code_task", &one, Some("x"), Some(&["a", "b"])),
            Err(Refusal::TooManyArgs { max: 1 }),
        ),
        (
            "args on a task with none",
            req("fixed", &two, None, Some(&["a"])),
            Err(Refusal::TooManyArgs { max: 0 }),
        ),
        (
            "absolute path arg",
            req("code_task", &one, Some("x"), Some(&["/etc/passwd"])),
            Err(Refusal::BadArg { index: 0 }),
        ),
        (
            "dot-dot arg",
            req("code_task", &one, Some("x"), Some(&["a/../b"])),
            Err(Refusal::BadArg { index: 0 }),
        ),
        (
            "control char arg",
            req("code_task", &one, Some("x"), Some(&["a\nb"])),
            Err(Refusal::BadArg { index: 0 }),
        ),
        (
            "one arg is fine",
            req("code_task", &one, Some("x"), Some(&["--v"])),
            Ok("code_task"),
        ),
        (
            "too few inputs",
            req("fixed", &one, None, None),
            Err(Refusal::InputCount { expected: 2 }),
        ),
        (
            "too many inputs",
            req("code_task", &two, Some("x"), None),
            Err(Refusal::InputCount { expected: 1 }),
        ),
        (
            "path as input id",
            req("code_task", &["/etc/passwd".into()], Some("x"), None),
            Err(Refusal::BadInputId { index: 0 }),
        ),
        (
            "upper-case id",
            req("fixed", &[id(1), id(1).to_uppercase()], None, None),
            Err(Refusal::BadInputId { index: 1 }),
        ),
    ];
    for (what, r, want) in cases {
        let got = check_request(&cfg, &caller("bot"), &r).map(|c| c.task_name);
        assert_eq!(got, want, "{what}");
    }
    // Access: by actor name, by tenant, and neither.
    let r = req("code_task", &one, Some("x"), None);
    assert_eq!(
        check_request(&cfg, &caller("op"), &r).map(|c| c.task_name),
        Err(Refusal::TaskNotPermitted)
    );
    let r = req("fixed", &two, None, None);
    assert_eq!(
        check_request(&cfg, &caller("stranger"), &r).map(|c| c.task_name),
        Err(Refusal::TaskNotPermitted)
    );
    // ... and a refused caller learns nothing about the request's other faults.
    let r = req("fixed", &one, Some("x"), None);
    assert_eq!(
        check_request(&cfg, &caller("stranger"), &r).map(|c| c.task_name),
        Err(Refusal::TaskNotPermitted)
    );
}

#[test]
fn inputs_must_exist_in_the_tenant_and_fit_their_slots() {
    let cfg = config();
    let r = req("fixed", &[id(1), id(2)], None, None);
    let checked = || check_request(&cfg, &caller("bot"), &r).unwrap();
    assert_eq!(checked().input_ids(), &[id(1), id(2)]);
    let ok = || {
        vec![
            Some(input(1, "text/csv", 100)),
            Some(input(2, "application/json", 5)),
        ]
    };
    let a = checked().admit(ok()).unwrap();
    assert_eq!((a.task_name, a.inputs.len()), ("fixed", 2));
    let cases: Vec<(&str, Vec<Option<InputRow>>, Refusal)> = vec![
        (
            "missing (or another tenant's)",
            vec![Some(input(1, "text/csv", 1)), None],
            Refusal::NoSuchInput { index: 1 },
        ),
        (
            "wrong media type",
            vec![
                Some(input(1, "application/json", 1)),
                Some(input(2, "application/json", 1)),
            ],
            Refusal::InputMediaType {
                index: 0,
                media_type: "application/json".into(),
                accepted: vec!["text/csv".into()],
            },
        ),
        (
            "one byte too many",
            vec![
                Some(input(1, "text/csv", 100)),
                Some(input(2, "application/json", 6)),
            ],
            Refusal::InputTooLarge { index: 1, max: 5 },
        ),
    ];
    for (what, rows, want) in cases {
        assert_eq!(checked().admit(rows).unwrap_err(), want, "{what}");
    }
}

#[test]
fn the_manifest_comes_from_the_task_and_resolved_ids_only() {
    let cfg = config();
    let r = req("code_task", &[id(1)], Some("print(1)"), Some(&["--v"]));
    let a = check_request(&cfg, &caller("bot"), &r)
        .unwrap()
        .admit(vec![Some(input(1, "text/csv", 1))])
        .unwrap();
    let objects = Path::new("/data/objects");
    let m = a.manifest(
        0,
        JobPaths {
            objects,
            schema: None,
        },
    );
    assert_eq!(m.command, ["/usr/bin/python3", "/input/code.py", "--v"]);
    assert_eq!(m.request_id.as_deref(), Some("r-1"));
    let sources: Vec<(&str, &str)> = m
        .inputs
        .iter()
        .map(|i| (i.source.as_str(), i.mount.as_str()))
        .collect();
    let obj = format!("/data/objects/{}", "1".repeat(64));
    assert_eq!(sources, [(obj.as_str(), "/input/a.csv")]);
    // The code travels by value, never as a host path.
    assert_eq!(
        m.inline_inputs,
        [InlineInput {
            mount: "/input/code.py".into(),
            content: "print(1)".into()
        }]
    );
    assert!(m.inputs.iter().all(|i| i.mode == Mode::ReadOnly));
    assert_eq!(m.network, Network::Deny);
    assert_eq!(m.output.as_deref(), Some("/output/o.json"));
    assert_eq!(m.output_schema, None);
}

#[test]
fn replays_uploads_reads_and_reconciles_have_their_refusals() {
    assert_eq!(check_request_id("r-1"), Ok(()));
    for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(129)] {
        assert_eq!(check_request_id(bad), Err(Refusal::BadRequestId), "{bad:?}");
    }
    assert_eq!(check_replay("h1", "h1"), Ok(()));
    assert_eq!(check_replay("h1", "h2"), Err(Refusal::RequestIdConflict));

    assert_eq!(check_upload("a.csv", "text/csv", 10, 10), Ok(()));
    assert_eq!(
        check_upload(".env", "text/csv", 1, 10),
        Err(Refusal::BadFileName)
    );
    assert_eq!(
        check_upload("../x", "text/csv", 1, 10),
        Err(Refusal::BadFileName)
    );
    assert_eq!(check_upload("a", "text", 1, 10), Err(Refusal::BadMediaType));
    assert_eq!(
        check_upload("a", "text/csv", 11, 10),
        Err(Refusal::UploadTooLarge { max: 10 })
    );

    assert_eq!(check_artifact(RunState::Ok, true, false), Ok(()));
    assert_eq!(
        check_artifact(RunState::Ok, true, true),
        Err(Refusal::OutputsExpired)
    );
    assert_eq!(
        check_artifact(RunState::OutputRejected, true, false),
        Err(Refusal::NoArtifact {
            state: RunState::OutputRejected
        })
    );
    assert_eq!(
        check_artifact(RunState::Ok, false, false),
        Err(Refusal::NoArtifact {
            state: RunState::Ok
        })
    );
    assert_eq!(check_receipt(RunState::Timeout, true, false), Ok(()));
    assert_eq!(
        check_receipt(RunState::Timeout, true, true),
        Err(Refusal::OutputsExpired)
    );
    assert_eq!(
        check_receipt(RunState::Queued, false, false),
        Err(Refusal::NoReceipt {
            state: RunState::Queued
        })
    );

    let cfg = config();
    assert_eq!(check_reconcile(&caller("op"), RunState::Unknown), Ok(()));
    assert_eq!(
        check_reconcile(&caller("bot"), RunState::Unknown),
        Err(Refusal::NotOperator)
    );
    assert_eq!(
        check_reconcile(&caller("op"), RunState::Ok),
        Err(Refusal::NotUnknown {
            state: RunState::Ok
        })
    );
    assert!(check_retry(cfg.tasks.get("fixed")).is_ok());
    assert_eq!(check_retry(None).unwrap_err(), Refusal::TaskGone);
    assert_eq!(
        check_retry(cfg.tasks.get("net")).unwrap_err(),
        Refusal::RetryWithNetwork
    );
    assert_eq!(
        check_retry_inputs(vec![Some(input(1, "text/csv", 1)), None]).unwrap_err(),
        Refusal::InputExpired
    );
    assert_eq!(check_retry_code(&cfg.tasks["fixed"]), Ok(()));
    assert_eq!(
        check_retry_digest("t", Some("sha256:a"), "sha256:a"),
        Ok(())
    );
    assert_eq!(
        check_retry_digest("t", Some("sha256:a"), "sha256:b")
            .unwrap_err()
            .code(),
        "task-changed"
    );
    assert_eq!(
        check_retry_digest("t", None, "sha256:b").unwrap_err(),
        Refusal::NoManifestDigest
    );
    assert_eq!(
        check_retry_code(&cfg.tasks["code_task"]),
        Err(Refusal::CodeNotKept)
    );
}

/// The codes are public (problem types, MCP `error`, audit `reason`, metric labels): each
/// refusal keeps the code and text it had before policy got its own module.
#[test]
fn codes_and_texts_are_stable() {
    let s = RunState::Running;
    let table: Vec<(Refusal, &str, &str)> = vec![
        (
            Refusal::BadRequestId,
            "invalid-request",
            "`request_id` must be 1-128 of A-Z a-z 0-9 . _ : -, and not `.` or `..`",
        ),
        (Refusal::UnknownTask, "unknown-task", "no such task"),
        (
            Refusal::TaskNotPermitted,
            "forbidden",
            "the actor may not use this task",
        ),
        (
            Refusal::CodeNotAccepted,
            "forbidden",
            "this task runs a fixed program and accepts no code",
        ),
        (
            Refusal::CodeRequired,
            "invalid-request",
            "this task needs `code`",
        ),
        (
            Refusal::CodeTooLarge { max: 3 },
            "invalid-request",
            "`code` must be at most 3 bytes without NUL",
        ),
        (
            Refusal::TooManyArgs { max: 2 },
            "invalid-request",
            "this task takes at most 2 args",
        ),
        (
            Refusal::BadArg { index: 1 },
            "invalid-request",
            "args[1]: at most 256 characters, no control characters, not a path (no leading `/`, no `..`)",
        ),
        (
            Refusal::InputCount { expected: 1 },
            "input-mismatch",
            "this task takes exactly 1 input(s)",
        ),
        (
            Refusal::BadInputId { index: 0 },
            "invalid-request",
            "inputs[0]: not an input id (ids come from POST /v1/inputs)",
        ),
        (
            Refusal::NoSuchInput { index: 2 },
            "not-found",
            "inputs[2]: no such input",
        ),
        (
            Refusal::InputMediaType {
                index: 0,
                media_type: "a/b".into(),
                accepted: vec!["text/csv".into()],
            },
            "input-mismatch",
            "inputs[0]: media type a/b is not one of [\"text/csv\"]",
        ),
        (
            Refusal::InputTooLarge { index: 0, max: 9 },
            "input-mismatch",
            "inputs[0]: larger than 9 bytes",
        ),
        (
            Refusal::RequestIdConflict,
            "request-id-conflict",
            "this request_id was used with a different request; use a new request_id",
        ),
        (
            Refusal::Overloaded,
            "overloaded",
            "all run slots and the queue are full; retry later",
        ),
        (
            Refusal::BadFileName,
            "invalid-request",
            "`name` must be 1-128 of A-Z a-z 0-9 . _ - and not start with `.`; it is never a path",
        ),
        (
            Refusal::BadMediaType,
            "invalid-request",
            "`media_type` must look like type/subtype",
        ),
        (
            Refusal::UploadTooLarge { max: 7 },
            "too-large",
            "inputs are at most 7 bytes",
        ),
        (Refusal::NoSuchRun, "not-found", "no such run"),
        (
            Refusal::OutputsExpired,
            "outputs-expired",
            "the run's outputs were deleted by the task's retention",
        ),
        (
            Refusal::NoArtifact { state: s },
            "no-verified-artifact",
            "the run's status is `running`; only a run with status `ok` has a verified artifact",
        ),
        (
            Refusal::NoReceipt { state: s },
            "no-receipt",
            "the run's status is `running` and it has no receipt",
        ),
        (
            Refusal::NotOperator,
            "forbidden",
            "only an operator may reconcile runs",
        ),
        (
            Refusal::NotUnknown { state: s },
            "not-reconcilable",
            "only runs with status `unknown` are reconciled; this one is `running`",
        ),
        (Refusal::TaskGone, "forbidden", "the task no longer exists"),
        (
            Refusal::RetryWithNetwork,
            "forbidden",
            "the task has network access: an external effect may have happened, so it cannot be retried; abandon it",
        ),
        (
            Refusal::InputExpired,
            "not-reconcilable",
            "an input of the run was deleted by retention; abandon it",
        ),
        (
            Refusal::CodeNotKept,
            "not-reconcilable",
            "the run's code is not kept; abandon it and submit a new request_id",
        ),
        (
            Refusal::TaskChanged {
                task: "t".into(),
                first: "sha256:a".into(),
                rebuilt: "sha256:b".into(),
            },
            "task-changed",
            "the task type `t` changed since the first attempt: that attempt's manifest digest is sha256:a, a retry would build sha256:b; it would be a different run, so it is refused; abandon it and submit the request under a new request_id",
        ),
        (
            Refusal::NoManifestDigest,
            "not-reconcilable",
            "the first attempt's manifest digest was not recorded (an older version recorded this run), so a retry cannot be shown to run the same manifest; abandon it",
        ),
        (Refusal::Malformed("m".into()), "invalid-request", "m"),
        (
            Refusal::NotJson,
            "unsupported-media-type",
            "send the request as application/json",
        ),
        (
            Refusal::RequestTooLarge { max: 8 },
            "too-large",
            "requests are at most 8 bytes",
        ),
    ];
    for (r, code, detail) in &table {
        assert_eq!((r.code(), r.detail().as_str()), (*code, *detail), "{r:?}");
        assert_eq!(r.to_string(), format!("{code}: {detail}"));
        assert_eq!(r.retry_after(), (*r == Refusal::Overloaded).then_some(5));
        assert_eq!(r.is_invalid_request(), *code == "invalid-request");
    }
}
