//! docs/server.md's field reference of the configuration file is generated from the schema the
//! binary prints (`agentjail config --schema`), so that a field added, removed, made required or
//! given another default cannot leave the page behind. The tables sit between two markers in
//! docs/server.md; this test renders them again and fails when they differ, naming the command
//! that rewrites them: `AGENTJAIL_UPDATE_DOCS=1 cargo test -p agentjail --test config_reference`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde_json::Value;

const BEGIN: &str = "<!-- BEGIN generated config reference: AGENTJAIL_UPDATE_DOCS=1 cargo test -p agentjail --test config_reference -->";
const END: &str = "<!-- END generated config reference -->";

/// One table: its heading (the TOML table a user writes) and its rows.
struct Section {
    heading: String,
    rows: Vec<[String; 5]>,
}

fn def<'a>(defs: &'a Value, r: &str) -> &'a Value {
    let name = r.strip_prefix("#/$defs/").unwrap_or(r);
    defs.get(name)
        .unwrap_or_else(|| panic!("the schema has no $defs/{name}"))
}

/// The schema `s` with a `$ref` followed.
fn resolve<'a>(defs: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => def(defs, r),
        None => s,
    }
}

fn is_table(s: &Value) -> bool {
    s.get("properties").is_some()
}

/// A type as a reader of the TOML file sees it.
fn type_of(defs: &Value, s: &Value) -> String {
    if s == &Value::Bool(true) {
        return "any value".into();
    }
    let s = resolve(defs, s);
    if is_table(s) {
        return "table".into();
    }
    if let Some(alts) = s
        .get("oneOf")
        .or_else(|| s.get("anyOf"))
        .and_then(Value::as_array)
    {
        let mut parts: Vec<String> = Vec::new();
        for a in alts {
            let t = match a.get("const") {
                Some(c) => format!("`{c}`"),
                None => type_of(defs, a),
            };
            if t != "null" && !parts.contains(&t) {
                parts.push(t);
            }
        }
        return parts.join(" or ");
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return e
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" or ");
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    types
        .iter()
        .map(|t| match *t {
            "array" => match s.get("items") {
                Some(i) if is_table(resolve(defs, i)) => "array of tables".into(),
                Some(i) => format!("array of {}", type_of(defs, i)),
                None => "array".into(),
            },
            "object" => match s.get("additionalProperties") {
                Some(v) if is_table(resolve(defs, v)) => "tables by name".into(),
                Some(v @ Value::Object(_)) => format!("table of {}", type_of(defs, v)),
                _ => "table".into(),
            },
            "integer" => match (s.get("minimum"), s.get("maximum")) {
                (Some(lo), Some(hi)) => format!("integer ({lo} ..= {hi})"),
                _ => "integer".into(),
            },
            t => t.into(),
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The table `s` at `heading`, then the tables below it, depth first.
fn walk(defs: &Value, heading: &str, path: &str, s: &Value, out: &mut Vec<Section>) {
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    let mut below: Vec<(String, String, &Value)> = Vec::new();
    for (name, p) in s["properties"].as_object().unwrap() {
        let req = required.contains(&name.as_str());
        let default = match p.get("default") {
            _ if req => String::new(),
            None => "none".into(),
            Some(Value::Null) => "none".into(),
            Some(Value::Object(m)) if !m.is_empty() => "see its table".into(),
            Some(v) => format!("`{v}`"),
        };
        let target = resolve(defs, p);
        let description = p
            .get("description")
            .or_else(|| target.get("description"))
            .and_then(Value::as_str)
            .unwrap_or("");
        rows.push([
            format!("`{name}`"),
            type_of(defs, p),
            if req { "**yes**" } else { "no" }.into(),
            default,
            cell(description),
        ]);
        let child = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        // The tables a user writes below this one.
        let map_of = target
            .get("additionalProperties")
            .map(|a| resolve(defs, a))
            .filter(|a| is_table(a));
        let items = target
            .get("items")
            .map(|a| resolve(defs, a))
            .filter(|a| is_table(a));
        let alternative = target
            .get("anyOf")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|x| resolve(defs, x)).find(|x| is_table(x)));
        if is_table(target) {
            below.push((format!("[{child}]"), child, target));
        } else if let Some(m) = map_of {
            let child = format!("{child}.NAME");
            below.push((format!("[{child}]"), child, m));
        } else if let Some(i) = items {
            below.push((format!("[[{child}]]"), child, i));
        } else if let Some(a) = alternative {
            below.push((format!("[{child}]"), child, a));
        }
    }
    out.push(Section {
        heading: heading.to_string(),
        rows,
    });
    for (h, p, t) in below {
        walk(defs, &h, &p, t, out);
    }
}

/// The generated Markdown between the markers (without them).
fn render(schema: &Value) -> String {
    let mut sections = Vec::new();
    walk(&schema["$defs"], "", "", schema, &mut sections);
    let mut md = String::from(
        "\n*Generated from `agentjail config --schema`; do not edit by hand (the command in the comment above rewrites it).* A field marked **yes** must be given whenever its table is; every other field may be left out and takes its default.\n",
    );
    for s in sections {
        let heading = if s.heading.is_empty() {
            "The file's top level".to_string()
        } else {
            format!("`{}`", s.heading)
        };
        md.push_str(&format!(
            "\n#### {heading}\n\n| field | type | required | default | meaning |\n| --- | --- | --- | --- | --- |\n"
        ));
        for r in s.rows {
            md.push_str(&format!("| {} |\n", r.join(" | ")));
        }
    }
    md.push('\n');
    md
}

#[test]
fn the_config_reference_in_docs_server_md_is_generated_from_the_schema() {
    let o = common::agentjail(&["config", "--schema"]);
    assert_eq!(o.code, 0, "{}", o.dump());
    let schema: Value = serde_json::from_str(&o.stdout).unwrap();
    let want = render(&schema);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/server.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/server.md lacks the markers:\n{BEGIN}\n{END}");
    };
    let got = &doc[b + BEGIN.len()..e];
    if got == want {
        return;
    }
    if std::env::var_os("AGENTJAIL_UPDATE_DOCS").is_some() {
        let new = format!("{}{want}{}", &doc[..b + BEGIN.len()], &doc[e..]);
        std::fs::write(&path, new).unwrap();
        eprintln!("rewrote the config reference in {}", path.display());
        return;
    }
    panic!(
        "docs/server.md's config reference differs from `agentjail config --schema`; rewrite it with\n  AGENTJAIL_UPDATE_DOCS=1 cargo test -p agentjail --test config_reference\nexpected:\n{want}"
    );
}

/// The reference marks the fields a configuration cannot leave out.
#[test]
fn the_reference_marks_required_fields() {
    let o = common::agentjail(&["config", "--schema"]);
    let schema: Value = serde_json::from_str(&o.stdout).unwrap();
    let md = render(&schema);
    for (table, field) in [
        ("[actors.NAME]", "tenant"),
        ("[actors.NAME]", "token_sha256"),
        ("[tasks.NAME]", "command"),
        ("[tasks.NAME.output]", "path"),
        ("[[tasks.NAME.inputs]]", "mount"),
    ] {
        let section = md
            .split(&format!("#### `{table}`"))
            .nth(1)
            .and_then(|s| s.split("####").next())
            .unwrap_or_else(|| panic!("no {table} in:\n{md}"));
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{field}` |")))
            .unwrap_or_else(|| panic!("no {field} in {table}:\n{section}"));
        assert!(row.contains("| **yes** |"), "{row}");
    }
    assert!(
        !md.split("#### `[server]`")
            .nth(1)
            .unwrap()
            .split("####")
            .next()
            .unwrap()
            .contains("**yes**"),
        "every server field is optional"
    );
}
