//! `agentjail report --schema`: the JSON Schema of the run report.

use agentjail_manifest::report::RunReport;

use crate::out::print_json;

pub fn run() -> Result<u8, String> {
    print_json(&RunReport::json_schema());
    Ok(0)
}
