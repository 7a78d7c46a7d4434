//! The unit tests of [`super`] (the HTTP API): the OpenAPI document, problem types, request
//! fields.

use super::*;

#[test]
fn request_fields_cannot_carry_paths() {
    assert!(valid_request_id("example-095"));
    assert!(valid_request_id("a.b_c:d-1"));
    for bad in ["", "../x", "a/b", "a b", "x\n", &"x".repeat(129)] {
        assert!(!valid_request_id(bad), "{bad:?}");
    }
    assert!(valid_input_id("in_0123456789abcdef0123456789abcdef"));
    for bad in [
        "/etc/passwd",
        "in_../../etc/passwd",
        "in_0123456789ABCDEF0123456789ABCDEF",
        "in_0",
    ] {
        assert!(!valid_input_id(bad), "{bad:?}");
    }
    assert!(valid_arg("--verbose") && valid_arg("x=1"));
    for bad in ["/etc/passwd", "../secret", "a\nb", "x/../../y"] {
        assert!(!valid_arg(bad), "{bad:?}");
    }
    assert!(valid_file_name("report.csv"));
    for bad in ["", ".hidden", "../x", "a/b", "a b"] {
        assert!(!valid_file_name(bad), "{bad:?}");
    }
    assert!(
        valid_media_type("text/csv") && !valid_media_type("text") && !valid_media_type("a/b/c")
    );
}

#[test]
fn run_request_refuses_unknown_fields() {
    let ok = r#"{"request_id":"r","task":"t","inputs":[],"code":"x"}"#;
    assert!(serde_json::from_str::<RunRequest>(ok).is_ok());
    for extra in [
        r#""mounts":[]"#,
        r#""limits":{"seconds":1}"#,
        r#""network":"allow""#,
        r#""image_digest":"x""#,
        r#""source":"/etc""#,
    ] {
        let s = format!(r#"{{"request_id":"r","task":"t","inputs":[],{extra}}}"#);
        assert!(serde_json::from_str::<RunRequest>(&s).is_err(), "{extra}");
    }
}

#[test]
fn problems_have_stable_types() {
    let p = ApiError::unauthorized().problem();
    assert_eq!(p.type_, "https://agentjail.dev/problems/unauthorized");
    assert_eq!(p.status, 401);
    let p = ApiError::internal().problem();
    assert!(!p.detail.contains('/'), "no internal detail: {}", p.detail);
}

#[test]
fn openapi_is_3_1_with_every_path() {
    let doc = serde_json::to_value(openapi()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for p in [
        "/v1/inputs",
        "/v1/runs",
        "/v1/runs/{request_id}",
        "/v1/tasks",
        "/healthz",
        "/metrics",
    ] {
        assert!(doc["paths"][p].is_object(), "{p}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// The store's unavailability (503, Retry-After) is in the contract of every operation
/// that touches the store, and not of `/metrics` and `/v1/tasks` (served from memory).
#[test]
fn openapi_has_503_where_the_store_is_used() {
    let doc = serde_json::to_value(openapi()).unwrap();
    for (p, m) in [
        ("/v1/inputs", "post"),
        ("/v1/runs", "post"),
        ("/v1/runs/{request_id}", "get"),
        ("/healthz", "get"),
    ] {
        let r = &doc["paths"][p][m]["responses"]["503"];
        assert!(r.is_object(), "{m} {p} has no 503");
        assert!(
            r["headers"]["Retry-After"].is_object(),
            "{m} {p}: 503 without Retry-After"
        );
    }
    for p in ["/metrics", "/v1/tasks"] {
        assert!(doc["paths"][p]["get"]["responses"]["503"].is_null(), "{p}");
    }
}

/// Each refusal keeps the HTTP status and problem title it had before the service layer.
#[test]
fn refusals_keep_their_http_status_and_title() {
    use crate::run_state::RunState;
    let s = RunState::Ok;
    let table: Vec<(Refusal, u16, &str)> = vec![
        (Refusal::BadRequestId, 400, "Invalid request"),
        (Refusal::Malformed("x".into()), 400, "Invalid request"),
        (Refusal::UnknownTask, 404, "Unknown task"),
        (Refusal::TaskNotPermitted, 403, "Forbidden by policy"),
        (Refusal::CodeNotAccepted, 403, "Forbidden by policy"),
        (Refusal::NotOperator, 403, "Forbidden by policy"),
        (Refusal::TaskGone, 403, "Forbidden by policy"),
        (Refusal::RetryWithNetwork, 403, "Forbidden by policy"),
        (Refusal::NoSuchInput { index: 0 }, 404, "Not found"),
        (Refusal::NoSuchRun, 404, "Not found"),
        (
            Refusal::InputCount { expected: 1 },
            422,
            "Inputs do not match the task",
        ),
        (Refusal::RequestIdConflict, 409, "request_id already used"),
        (Refusal::Overloaded, 429, "Too many runs"),
        (Refusal::UploadTooLarge { max: 1 }, 413, "Payload too large"),
        (
            Refusal::RequestTooLarge { max: 1 },
            413,
            "Payload too large",
        ),
        (Refusal::OutputsExpired, 410, "Deleted by retention"),
        (
            Refusal::NoArtifact { state: s },
            409,
            "No verified artifact",
        ),
        (Refusal::NoReceipt { state: s }, 409, "No receipt"),
        (Refusal::NotUnknown { state: s }, 409, "Not reconcilable"),
        (
            Refusal::ReconcileLost {
                decision: "abandoned it".into(),
            },
            409,
            "Not reconcilable",
        ),
        (Refusal::InputExpired, 409, "Not reconcilable"),
        (Refusal::CodeNotKept, 409, "Not reconcilable"),
        (Refusal::NoManifestDigest, 409, "Not reconcilable"),
        (
            Refusal::TaskChanged {
                task: "t".into(),
                first: "sha256:a".into(),
                rebuilt: "sha256:b".into(),
            },
            409,
            "Task changed",
        ),
        (Refusal::NotJson, 415, "Unsupported media type"),
    ];
    for (r, status, title) in table {
        let code = r.code();
        let e = ApiError::from(Failure::Refused(r));
        let p = e.problem();
        assert_eq!((p.status, p.title.as_str()), (status, title), "{code}");
        assert_eq!(p.type_, format!("{PROBLEM_BASE}{code}"));
        let resp = e.into_response();
        assert_eq!(
            resp.headers().get(header::RETRY_AFTER).is_some(),
            status == 429
        );
    }
    let p = ApiError::from(Failure::Internal).problem();
    assert_eq!(
        (p.status, p.type_.as_str()),
        (500, "https://agentjail.dev/problems/internal")
    );
}
