//! The output collector's JSON verifier (`check_json`: strict parse, depth bound, duplicate
//! keys) that every `.json` file under /output passes before delivery, and the schema check
//! after it.
#![no_main]

use agentjail_verify::{MAX_DEPTH, SchemaChecker, check_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = agentjail_verify::json::check_depth(data, MAX_DEPTH);
    let Ok(v) = check_json(data) else {
        return;
    };
    // Accepted output also passes serde_json, and checking it against a schema ends.
    let text = serde_json::to_vec(&v).expect("an accepted value serializes");
    assert!(
        check_json(&text).is_ok(),
        "the verifier accepts its own output"
    );
    if let Ok(c) = SchemaChecker::compile(&v) {
        let _ = c.check(&v);
    }
});
