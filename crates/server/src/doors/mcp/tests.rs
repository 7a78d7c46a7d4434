//! The unit tests of [`super`] (the MCP server): tools, schemas, annotations, output shapes,
//! the stderr tail.

use serde_json::{Value, json};

use crate::app::AppState;
use crate::service::Caller;

use super::catalogue::*;
use super::server::*;

#[test]
fn tools_come_from_the_catalogue_with_truthful_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::Config::example().unwrap();
    let state = AppState::open(cfg, dir.path(), "/bin/false".into(), false).unwrap();
    let server = McpServer::for_http(state);
    let caller = Caller {
        actor: "dev".into(),
        tenant: "dev".into(),
        operator: false,
    };
    let tools = server.tools(&caller);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "csv_line_count",
            "summarize_csv",
            "upload_input",
            "get_run",
            "session_open",
            "session_run",
            "session_get",
            "session_fork",
            "session_close"
        ]
    );
    // Sessions: of the code tasks only; a cell's step id is optional.
    assert_eq!(
        tools[4].input_schema["properties"]["task"]["enum"],
        json!(["summarize_csv"])
    );
    assert_eq!(
        tools[5].input_schema["required"],
        json!(["session_id", "code"])
    );
    assert!(tools[5].input_schema["properties"].get("step_id").is_some());
    let s = &tools[1];
    assert_eq!(s.input_schema["required"], json!(["input_id", "code"]));
    assert_eq!(s.input_schema["additionalProperties"], json!(false));
    let out = s.output_schema.as_ref().unwrap();
    assert_eq!(out["title"], "CSV summary");
    let a = s.annotations.as_ref().unwrap();
    assert_eq!(a.read_only_hint, Some(true));
    assert_eq!(a.destructive_hint, Some(false));
    assert_eq!(a.idempotent_hint, Some(true));
    assert_eq!(a.open_world_hint, Some(false));
    // A fixed program takes no code.
    assert!(tools[0].input_schema["properties"].get("code").is_none());
    // Another tenant's actor sees no task tools.
    let other = Caller {
        actor: "x".into(),
        tenant: "y".into(),
        operator: false,
    };
    assert_eq!(server.tools(&other).len(), 2);
}

#[test]
fn output_shape_of_nested_array_enum_and_ref_schemas() {
    let s = json!({
        "$defs": {
            "point": {"type": "object", "required": ["x", "y"],
                      "properties": {"x": {"type": "number"}, "y": {"type": "number"}}},
            "loop": {"type": "object", "properties": {"next": {"$ref": "#/$defs/loop"}}}
        },
        "type": "object", "additionalProperties": false,
        "required": ["mode", "points", "tags"],
        "properties": {
            "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
            "mode": {"enum": ["fast", "full", 3]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"const": 1}]},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "missing": {"$ref": "#/$defs/nope"},
            "deep": {"$ref": "#/$defs/loop"}
        }
    });
    let shape = output_shape(&s);
    assert!(
        shape.starts_with(
            "{mode: \"fast\"|\"full\"|3, points: [{x: number, y: number}], tags: [string], deep?: {next?: {next?: "
        ),
        "{shape}"
    );
    for part in [
        "either?: string | integer",
        "meta?: {<key>: integer|null}",
        "missing?: any",
        "pair?: [string, 1]",
        "…",
    ] {
        assert!(shape.contains(part), "{part}: {shape}");
    }
    assert!(shape.len() <= MAX_SHAPE, "{}", shape.len());
    // The example task's summary schema.
    let t = crate::Config::example().unwrap().tasks["summarize_csv"].clone();
    let v = t.output.schema.as_ref().unwrap().value().unwrap();
    assert_eq!(
        output_shape(&v),
        "{rows: integer, columns: [string], numeric: {<key>: {count: integer, missing: integer, min: number, max: number, mean: number, sum: number}}}"
    );
    // Degenerate schemas do not panic and stay bounded.
    assert_eq!(output_shape(&json!(true)), "any");
    assert_eq!(output_shape(&json!({})), "any");
    let wide: serde_json::Map<String, Value> = (0..500)
        .map(|i| (format!("field_{i}"), json!({"type": "string"})))
        .collect();
    let big = output_shape(&json!({"type": "object", "properties": wide}));
    assert!(
        big.len() <= MAX_SHAPE && big.ends_with('…'),
        "{}",
        big.len()
    );
}

#[test]
fn arguments_are_checked_against_the_schema() {
    let t = crate::Config::example().unwrap().tasks["summarize_csv"].clone();
    let schema = task_input_schema(&t);
    let ok = json!({"input_id": format!("in_{}", "a".repeat(32)), "code": "print(1)"});
    assert!(check_args(&schema, &ok).is_ok());
    for bad in [
        json!({"code": "x"}),
        json!({"input_id": "/etc/passwd", "code": "x"}),
        json!({"input_id": format!("in_{}", "a".repeat(32)), "code": "x", "limits": {}}),
        json!({"input_id": format!("in_{}", "a".repeat(32)), "code": "x", "request_id": "a/b"}),
    ] {
        let e = check_args(&schema, &bad).unwrap_err();
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{bad}");
    }
}
