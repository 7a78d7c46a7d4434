//! The egress gateway of an allowlist run, from the supervisor's side: started on the proxy
//! socket the init made inside the sandbox's network namespace, served from the host's, and
//! its decisions put into the report (refusals as denials, the rest as connections); with
//! `RunOptions::live_denials`, each distinct refusal goes there too as the gateway makes it.

use std::os::fd::OwnedFd;

use agentjail_manifest::ValidatedManifest;
use agentjail_manifest::report::{DenialKind, RunReport};

use crate::outcome::RunOptions;
use crate::step::{SetupError, Step, StepResult, step};

/// Serves the sandbox's proxy socket with the egress gateway, from this (host) namespace.
pub(super) fn start_gateway(
    vm: &ValidatedManifest,
    opts: &RunOptions,
    fd: OwnedFd,
    intercept: Option<agentjail_egress::Interception>,
) -> StepResult<agentjail_egress::GatewayHandle> {
    use std::sync::Arc;
    let agentjail_manifest::Network::Allow(policy) = &vm.manifest.network else {
        return Err(SetupError::new(
            Step::GatewayPolicy,
            "internal: a proxy socket without a network allowlist",
        ));
    };
    let l = vm.manifest.limits;
    let seconds = std::time::Duration::from_secs(l.seconds);
    let limits = agentjail_egress::GatewayLimits {
        max_bytes_up: l.network_up_mb << 20,
        max_bytes_down: l.network_down_mb << 20,
        max_concurrent_connections: l.network_connections.min(32) as usize,
        max_total_connections: l.network_connections,
        max_requests: l.network_connections.saturating_mul(16),
        connect_timeout: seconds.min(std::time::Duration::from_secs(10)),
        max_connection_time: seconds,
        ..agentjail_egress::GatewayLimits::default()
    };
    let resolver: Arc<dyn agentjail_egress::Resolve> = if opts.egress_dns.is_empty() {
        Arc::new(step(
            Step::GatewayResolver,
            agentjail_egress::HickoryResolver::from_system_conf(),
        )?)
    } else {
        Arc::new(step(
            Step::GatewayResolver,
            agentjail_egress::HickoryResolver::with_name_servers(
                &opts.egress_dns,
                std::time::Duration::from_secs(5),
            ),
        )?)
    };
    let listener = std::net::TcpListener::from(fd);
    // The report's detail of each refusal, offered as it is made.
    let on_refusal = opts.live_denials.clone().map(|live| {
        Arc::new(move |d: &agentjail_egress::Decision| {
            live.offer(DenialKind::Network, &network_detail(d))
        }) as agentjail_egress::RefusalObserver
    });
    step(
        Step::StartGateway,
        agentjail_egress::spawn_gateway_with_credentials(
            policy, limits, resolver, listener, intercept, on_refusal,
        ),
    )
}

/// How the report words a refusal of the gateway: `METHOD HOST:PORT: REASON`.
fn network_detail(d: &agentjail_egress::Decision) -> String {
    let dest = if d.host.is_empty() {
        String::from("(unparsed request)")
    } else {
        format!("{}:{}", d.host, d.port)
    };
    let method = if d.method.is_empty() {
        "request"
    } else {
        d.method.as_str()
    };
    format!("{method} {dest}: {}", d.reason)
}

/// Puts the gateway's decisions into the report: refusals as denials, the rest as connections.
pub(super) fn record_network(report: &mut RunReport, decisions: Vec<agentjail_egress::Decision>) {
    use agentjail_manifest::report::MAX_CONNECTIONS_LISTED;
    let mut net = agentjail_manifest::report::NetworkReport {
        proxy: format!("http://127.0.0.1:{}", crate::plan::PROXY_PORT),
        connections: Vec::new(),
        dropped: 0,
    };
    // Bounded: the gateway's log keeps at most MAX_ALLOWED + MAX_REFUSALS + 2 entries.
    for d in decisions {
        if d.reason == agentjail_egress::LOG_FULL && d.host.is_empty() {
            if d.allowed {
                net.dropped = net.dropped.saturating_add(d.count);
            } else {
                report.denials_dropped = report.denials_dropped.saturating_add(d.count);
            }
        } else if d.allowed && net.connections.len() >= MAX_CONNECTIONS_LISTED {
            net.dropped = net.dropped.saturating_add(d.count);
        } else if d.allowed {
            net.connections
                .push(agentjail_manifest::report::Connection {
                    method: d.method,
                    host: d.host,
                    port: d.port,
                    address: d.address.map(|a| a.to_string()),
                    rule: d.reason,
                    bytes_up: d.bytes_up,
                    bytes_down: d.bytes_down,
                    duration_ms: d.duration_ms,
                });
        } else {
            report.deny_n(DenialKind::Network, network_detail(&d), d.count);
        }
    }
    report.network = Some(net);
}
