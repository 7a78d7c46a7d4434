//! The flags that describe a run (`agentjail run` and `agentjail manifest --print`) and their
//! translation into a [`Manifest`], the one description of a run; and back: errors of
//! flag-built runs name the flag the user typed (`--ro data.csv`), not the manifest field they
//! never wrote (`inputs[0].source`).

use std::collections::BTreeMap;
use std::path::Path;

use agentjail_manifest::{
    AllowRule, EgressPolicy, Input, Limits, Manifest, ManifestError, Mode, Network,
};
use clap::Args;

/// `--net`: the one mode; with `--allow-host`, the egress gateway is the only way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NetMode {
    Deny,
}

/// `--isolation`: the tier (`agentjail_manifest::Tier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolationArg {
    Native,
    Gvisor,
}

/// Flags that build a manifest (the same type a manifest file holds).
#[derive(Args, Clone, Default)]
pub struct ManifestFlags {
    /// Read-only input, file or directory: HOST_PATH[:SANDBOX_PATH] (default /input/<name>).
    #[arg(long = "ro", value_name = "HOST_PATH[:SANDBOX_PATH]")]
    pub ro: Vec<String>,
    /// Bound on the total bytes under /output, in MiB [default: 5].
    #[arg(long, value_name = "N")]
    pub output_max_mb: Option<u64>,
    /// Wall-clock limit in seconds [default: 30].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Memory limit for the whole tree in MiB [default: 256].
    #[arg(long, value_name = "N")]
    pub memory_mb: Option<u64>,
    /// Process/thread limit for the whole tree [default: 16].
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU limit of the whole tree in CPUs, fractional (0.5 = half of one CPU) [default: 1].
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,
    /// Environment for the command: KEY=VALUE (repeatable). Nothing else of ours leaks in.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Network mode: `deny` (the default: loopback only). With --allow-host, the only way out
    /// is the egress gateway's proxy inside the sandbox.
    #[arg(long, value_name = "MODE", hide_possible_values = true)]
    pub net: Option<NetMode>,
    /// Allow connections through the egress gateway to HOST (exact name, `*.domain`, or an
    /// IP) on PORT (default 443), e.g. api.example.com:443 (repeatable).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,
    /// Isolation tier: `native` (default) or `gvisor` (runs on gVisor's runsc).
    #[arg(long, value_name = "TIER", hide_possible_values = true)]
    pub isolation: Option<IsolationArg>,
    /// Let the gateway reach this private/loopback CIDR, e.g. 127.0.0.1/32 (repeatable).
    #[arg(long = "allow-private", value_name = "CIDR")]
    pub allow_private: Vec<String>,
    /// The one output file the run must produce, e.g. /output/summary.json.
    #[arg(long, value_name = "SANDBOX_PATH")]
    pub output: Option<String>,
    /// JSON Schema (host file) the output must satisfy.
    #[arg(long, value_name = "FILE")]
    pub output_schema: Option<String>,
    /// Identifier recorded in the report and receipt.
    #[arg(long, value_name = "ID")]
    pub request_id: Option<String>,
    /// Refuse to start after this instant (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub expires_at: Option<String>,
    /// The program and its arguments.
    #[arg(last = true, value_name = "PROGRAM [ARGS]...")]
    pub command: Vec<String>,
}

/// Splits `HOST[:PORT]` (IPv6 literals in brackets); the port defaults to 443.
pub(crate) fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("--allow-host {s}: expected HOST[:PORT], e.g. api.example.com:443");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if after.is_empty() => 443,
            None => return Err(bad()),
        };
        (format!("[{h}]"), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad())?),
            None => (s.to_string(), 443),
        }
    };
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

impl ManifestFlags {
    pub fn to_manifest(&self) -> Result<Manifest, String> {
        if self.command.is_empty() {
            return Err(
                "no command given; usage: agentjail run [OPTIONS] -- PROGRAM [ARGS...]".into(),
            );
        }
        let mut m = Manifest::for_command(self.command.clone());
        let d = Limits::default();
        m.limits = Limits {
            seconds: self.timeout.unwrap_or(d.seconds),
            memory_mb: self.memory_mb.unwrap_or(d.memory_mb),
            processes: self.pids.unwrap_or(d.processes),
            cpus: self.cpus.unwrap_or(d.cpus),
            output_mb: self.output_max_mb.unwrap_or(d.output_mb),
            ..d
        };
        // `--net deny` is the only mode (clap refuses any other): destinations come from
        // --allow-host.
        m.isolation = match self.isolation {
            None | Some(IsolationArg::Native) => agentjail_manifest::Tier::Native,
            Some(IsolationArg::Gvisor) => agentjail_manifest::Tier::Gvisor,
        };
        if !self.allow_host.is_empty() {
            let mut allow: Vec<AllowRule> = Vec::new();
            for h in &self.allow_host {
                let (host, port) = split_host_port(h)?;
                match allow.iter_mut().find(|r| r.host == host) {
                    Some(r) if !r.ports.contains(&port) => r.ports.push(port),
                    Some(_) => {}
                    None => allow.push(AllowRule {
                        host,
                        ports: vec![port],
                    }),
                }
            }
            m.network = Network::Allow(EgressPolicy {
                allow,
                allow_private: self.allow_private.clone(),
                ..EgressPolicy::default()
            });
        } else if !self.allow_private.is_empty() {
            return Err("--allow-private needs at least one --allow-host".into());
        }
        for ro in &self.ro {
            let (host, mount) = match ro.rsplit_once(':') {
                Some((h, m)) if m.starts_with('/') => (h.to_string(), m.to_string()),
                _ => {
                    let name = Path::new(ro)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| {
                            format!("--ro {ro}: no file name to mount it under /input")
                        })?;
                    (ro.clone(), format!("/input/{name}"))
                }
            };
            let abs = std::path::absolute(&host).map_err(|e| format!("--ro {ro}: {e}"))?;
            m.inputs.push(Input {
                source: abs.to_string_lossy().into_owned(),
                mount,
                mode: Mode::ReadOnly,
            });
        }
        let mut env = BTreeMap::new();
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--env {kv}: expected KEY=VALUE"))?;
            env.insert(k.to_string(), v.to_string());
        }
        m.env = env;
        m.output = self.output.clone();
        m.output_schema = match &self.output_schema {
            Some(s) => Some(
                std::path::absolute(s)
                    .map_err(|e| format!("--output-schema {s}: {e}"))?
                    .to_string_lossy()
                    .into_owned(),
            ),
            None => None,
        };
        m.request_id = self.request_id.clone();
        m.expires_at = self.expires_at.clone();
        Ok(m)
    }
}

// Manifest fields named by the flags that set them.

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
        // `--ro data.csv` stands for its input; other flags keep the field they set, which
        // docs/manifest.md describes with its bounds: `--timeout (limits.seconds): …`.
        ManifestError::Field { field, reason } => match flag_for_field(field, ro) {
            Some(flag) if field.starts_with("inputs[") => format!("{flag}: {reason}"),
            Some(flag) => format!("{flag} ({field}): {reason}"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod field_name_tests {
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
        let e = ManifestError::Field {
            field: "limits.seconds".into(),
            reason: "0 is outside 1..=86400".into(),
        };
        assert_eq!(
            flag_error(&e, &ro),
            "--timeout (limits.seconds): 0 is outside 1..=86400"
        );
    }
}
