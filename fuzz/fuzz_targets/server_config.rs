//! The service's configuration parser (TOML or YAML: `Config::parse`, `serve --config`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = agentjail_config::Config::parse(text);
    }
});
