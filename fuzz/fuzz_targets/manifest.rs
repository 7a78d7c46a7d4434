//! The manifest parser (YAML and JSON: `Manifest::parse`, what `run --manifest`, the service's
//! lifeline and the HTTP API read) and the checks after it. Never a panic, never a hang; a
//! manifest that parses also survives its own JSON form.
#![no_main]

use agentjail_manifest::{Manifest, SourcePolicy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = Manifest::parse(text) else {
        return;
    };
    let json = serde_json::to_string(&m).expect("a parsed manifest serializes");
    let again = Manifest::parse(&json).expect("a parsed manifest's JSON parses");
    assert_eq!(
        serde_json::to_string(&again).expect("serializes"),
        json,
        "the JSON form is stable"
    );
    // Validation resolves sources under an empty folder: every input is refused or missing,
    // the other fields are checked for real.
    let dir = std::env::temp_dir();
    let _ = m.validate(
        &SourcePolicy {
            base_dir: dir.join("agentjail-fuzz-no-such-dir"),
            roots: Some(vec![]),
        },
        jiff::Timestamp::UNIX_EPOCH,
    );
});
