//! Upper bounds on limits: a manifest asking for more is refused as absurd, not clamped.

/// Wall-clock seconds: at most one day.
pub const MAX_SECONDS: u64 = 86_400;
/// Memory: at least 16 MiB (a dynamic loader and a shell need that), at most 64 GiB.
pub const MIN_MEMORY_MB: u64 = 16;
pub const MAX_MEMORY_MB: u64 = 65_536;
/// Processes and threads of the whole tree.
pub const MAX_PROCESSES: u64 = 4_096;
/// Total bytes under /output.
pub const MAX_OUTPUT_MB: u64 = 4_096;
/// Bytes through the egress gateway, each direction.
pub const MAX_NETWORK_MB: u64 = 65_536;
/// Connections through the egress gateway per run.
pub const MAX_NETWORK_CONNECTIONS: u64 = 10_000;
/// CPUs (fractional): at least 0.01 (the smallest CFS quota, 1 ms per 100 ms period), at
/// most 1024.
pub const MIN_CPUS: f64 = 0.01;
pub const MAX_CPUS: f64 = 1024.0;
/// Environment: entries and bytes per value.
pub const MAX_ENV: usize = 256;
pub const MAX_ENV_VALUE: usize = 32 * 1024;
/// Inputs per run.
pub const MAX_INPUTS: usize = 64;
/// Inline inputs per run, and bytes of each.
pub const MAX_INLINE_INPUTS: usize = 8;
pub const MAX_INLINE_BYTES: usize = 1024 * 1024;
/// Command words and bytes per word.
pub const MAX_ARGS: usize = 4_096;
pub const MAX_ARG_BYTES: usize = 128 * 1024;
/// Longest sandbox path accepted.
pub const MAX_PATH: usize = 1_024;
