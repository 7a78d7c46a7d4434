//! `agentjail check`: which protections this host offers to this user.

use crate::print_json;

pub fn run(json: bool) -> Result<u8, String> {
    let r = agentjail_engine::check::check();
    if json {
        print_json(&r);
    } else {
        for i in &r.items {
            println!(
                "{:<16} {:<4} {}",
                i.name,
                if i.ok { "ok" } else { "NO" },
                i.detail
            );
        }
        println!("{:<16} {:<4} {}", "host image", "", r.host_image);
        if !r.strict_run_ok {
            println!(
                "a strict run is refused here; `agentjail run --allow-degraded` runs with what is available and lists the rest in the report"
            );
        }
    }
    Ok(if r.strict_run_ok { 0 } else { 1 })
}
