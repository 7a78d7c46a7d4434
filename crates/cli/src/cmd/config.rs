//! `agentjail config --schema`: the JSON Schema of the server configuration.

use crate::out::print_json;

pub fn run() -> Result<u8, String> {
    print_json(&agentjail_server::config_schema());
    Ok(0)
}
