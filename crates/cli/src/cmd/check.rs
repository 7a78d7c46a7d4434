//! `agentjail check`: which protections this host offers to this user.

use crate::out::print_json;

pub fn run(json: bool) -> Result<u8, String> {
    let r = agentjail_engine::check::check();
    if json {
        print_json(&r);
    } else {
        for i in &r.items {
            outln!(
                "{:<16} {:<4} {}",
                i.name,
                if i.ok { "ok" } else { "NO" },
                i.detail
            );
        }
        outln!("{:<16} {:<4} {}", "host image", "", r.host_image);
        if !r.strict_run_ok {
            outln!("a strict run is refused here:");
            for f in &r.fixes {
                outln!("  {f}");
            }
        }
    }
    Ok(if r.strict_run_ok { 0 } else { 1 })
}
