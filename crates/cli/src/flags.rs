//! Errors of flag-built runs in the user's own words: a manifest field that `agentjail run`'s
//! flags filled in is named by the flag the user typed (`--ro data.csv`), not by the field of
//! the manifest they never wrote (`inputs[0].source`).

use agentjail_manifest::ManifestError;

/// The flag (as typed, for `--ro`) that set a manifest `field`, if a flag sets it.
pub fn flag_for_field(field: &str, ro: &[String]) -> Option<String> {
    if let Some(rest) = field.strip_prefix("inputs[") {
        let i: usize = rest.split(']').next()?.parse().ok()?;
        return ro.get(i).map(|r| format!("--ro {r}"));
    }
    if let Some(k) = field.strip_prefix("env.") {
        return Some(format!("--env {k}=…"));
    }
    if field == "command" || field.starts_with("command[") {
        return Some("-- PROGRAM [ARGS]".into());
    }
    if field.starts_with("network") {
        return Some("--allow-host".into());
    }
    let flag = match field {
        "limits.seconds" => "--timeout",
        "limits.memory_mb" => "--memory-mb",
        "limits.processes" => "--pids",
        "limits.cpus" => "--cpus",
        "limits.output_mb" => "--output-max-mb",
        "env" => "--env",
        "output" => "--output",
        "output_schema" => "--output-schema",
        "request_id" => "--request-id",
        "expires_at" => "--expires-at",
        "isolation" => "--isolation",
        _ => return None,
    };
    Some(flag.into())
}

/// A manifest error of a flag-built run, with the flag in place of the field where one set it.
pub fn flag_error(e: &ManifestError, ro: &[String]) -> String {
    match e {
        ManifestError::Field { field, reason } => match flag_for_field(field, ro) {
            Some(flag) => format!("{flag}: {reason}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_named_by_the_flag_typed() {
        let ro = vec!["data.csv".to_string(), "lib/:/work/lib".to_string()];
        let e = ManifestError::Field {
            field: "inputs[1].source".into(),
            reason: "/x/lib: not found".into(),
        };
        assert_eq!(
            flag_error(&e, &ro),
            "--ro lib/:/work/lib: /x/lib: not found"
        );
        assert_eq!(
            flag_for_field("inputs[0].mount", &ro).as_deref(),
            Some("--ro data.csv")
        );
        assert_eq!(
            flag_for_field("limits.memory_mb", &ro).as_deref(),
            Some("--memory-mb")
        );
        assert_eq!(flag_for_field("image_digest", &ro), None);
        let e = ManifestError::Field {
            field: "image_digest".into(),
            reason: "r".into(),
        };
        assert_eq!(flag_error(&e, &ro), "manifest field `image_digest`: r");
    }
}
