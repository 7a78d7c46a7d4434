//! Which Landlock ABI a strict run needs, derived from the threat model (docs/isolation.md,
//! "Guarantees and the layers that enforce them"), not from the newest kernel.
//!
//! Every Landlock ABI adds rights; each right backs a guarantee that, except for the file system
//! itself, another layer already enforces on its own:
//!
//! | ABI | right | guarantee | other layer(s) |
//! | --- | --- | --- | --- |
//! | 1 (5.13) | file system: read, write, execute, make, remove | the code reaches only the plan's mounts, writes only /tmp, /work, /output | mount namespace + read-only binds — assembled by our own code, so a second, independent statement of the same policy is **required** |
//! | 2 (5.19) | refer | no file moved or linked out of the places it may write | without it ABI 1 refuses every cross-directory rename/link (stricter); read-only mounts (EROFS) |
//! | 3 (6.2) | truncate | files outside /tmp, /work, /output are not shortened | read-only mounts (EROFS) |
//! | 4 (6.7) | TCP bind/connect | no network but the gateway's proxy | the network namespace: loopback only, no route |
//! | 5 (6.10) | ioctl on devices | no device ioctls | /dev holds only null, zero, full, random, urandom, tty; nodev elsewhere; no capabilities; seccomp refuses TIOCSTI/TIOCLINUX |
//! | 6 (6.12) | scope: signals, abstract unix sockets | no signal to and no abstract socket of a process outside | pid namespace (nothing outside is nameable); network namespace (abstract sockets are per namespace) |
//!
//! So a strict run needs ABI ≥ 1; without Landlock (not built, or not in `lsm=`) it is refused
//! with the reason, and `--allow-degraded` runs on the mount namespace alone.

/// The highest ABI whose rights agentjail asks for (newer ABIs add no right it uses).
pub const WANTED_ABI: u32 = 6;
/// The lowest ABI a strict run accepts: the file-system rights.
pub const STRICT_MIN_ABI: u32 = 1;

/// One Landlock feature, the ABI that brought it, and what stands in for it on older kernels.
struct Feature {
    abi: u32,
    /// Short name, as the report's `landlock_rights` lists it.
    name: &'static str,
    /// What covers the guarantee when the kernel lacks this feature; `None`: nothing does.
    substitute: Option<&'static str>,
}

const FEATURES: [Feature; 6] = [
    Feature {
        abi: 1,
        name: "fs",
        substitute: None,
    },
    Feature {
        abi: 2,
        name: "refer",
        substitute: Some(
            "without it Landlock refuses every rename or link across directories (stricter); read-only mounts refuse the rest (EROFS)",
        ),
    },
    Feature {
        abi: 3,
        name: "truncate",
        substitute: Some(
            "read-only mounts: nothing outside /tmp, /work and /output can be truncated (EROFS)",
        ),
    },
    Feature {
        abi: 4,
        name: "tcp",
        substitute: Some(
            "network namespace: loopback only, no route; the one way out is the gateway's proxy socket",
        ),
    },
    Feature {
        abi: 5,
        name: "ioctl_dev",
        substitute: Some(
            "/dev holds only null, zero, full, random, urandom and tty, every other mount is nodev, no capabilities, seccomp refuses TIOCSTI/TIOCLINUX",
        ),
    },
    Feature {
        abi: 6,
        name: "scope",
        substitute: Some(
            "pid namespace: no process outside can be named or signalled; network namespace: abstract unix sockets are per namespace",
        ),
    },
];

/// What Landlock at a given ABI gives a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// The ABI applied (capped at [`WANTED_ABI`]).
    pub abi: u32,
    /// Rights applied, e.g. `fs`, `refer`, `truncate`, `tcp`, `ioctl_dev`, `scope`.
    pub rights: Vec<String>,
    /// Each right not applied, with the layer that covers its guarantee instead.
    pub substitutes: Vec<String>,
}

/// Why a strict run must be refused for Landlock's sake (the words of the report's `degraded`
/// list and of the refusal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Shortfall {
    #[error(
        "landlock: not available in this kernel (not built in, or missing from the `lsm=` boot parameter): file access would rest on the mount namespace alone; boot with landlock in `lsm=` (see `cat /sys/kernel/security/lsm`)"
    )]
    NotAvailable,
    /// A feature above the ABI with no other layer covering it.
    #[error("landlock: ABI {abi} lacks {feature} (ABI {feature_abi}), which nothing else covers")]
    Uncovered {
        abi: u32,
        feature: &'static str,
        feature_abi: u32,
    },
}

/// The Landlock part of a strict run's requirements: `Ok` with what applies and what covers the
/// rest, or `Err` with the reason a strict run must be refused.
pub fn requirement(abi: u32) -> Result<Coverage, Shortfall> {
    let abi = abi.min(WANTED_ABI);
    if abi < STRICT_MIN_ABI {
        return Err(Shortfall::NotAvailable);
    }
    let mut c = Coverage {
        abi,
        rights: Vec::new(),
        substitutes: Vec::new(),
    };
    for f in &FEATURES {
        if f.abi <= abi {
            c.rights.push(f.name.into());
        } else if let Some(s) = f.substitute {
            c.substitutes
                .push(format!("{} (Landlock ABI {}): {s}", f.name, f.abi));
        } else {
            // A feature without substitute above the minimum would make the minimum wrong.
            return Err(Shortfall::Uncovered {
                abi,
                feature: f.name,
                feature_abi: f.abi,
            });
        }
    }
    Ok(c)
}

/// The kernel's Landlock ABI as runs see it: in debug builds only, capped at `AGENTJAIL_TEST_LANDLOCK_ABI` (the tests simulate an older kernel with it; a release
/// build ignores the variable).
pub fn effective_abi() -> u32 {
    crate::sys::landlock_abi().min(test_cap())
}

#[cfg(debug_assertions)]
fn test_cap() -> u32 {
    std::env::var("AGENTJAIL_TEST_LANDLOCK_ABI")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX)
}

#[cfg(not(debug_assertions))]
fn test_cap() -> u32 {
    u32::MAX
}

/// One line for `agentjail check`: what Landlock applies here and what covers the rest.
pub fn describe(kernel_abi: u32) -> (bool, String) {
    // The ABI a run applies, as its report's `landlock_abi` says: the kernel's, capped at
    // the newest whose rights are used.
    let newer = if kernel_abi > WANTED_ABI {
        format!(
            " (the kernel offers ABI {kernel_abi}; newer ABIs than {WANTED_ABI} add no right agentjail uses)"
        )
    } else {
        String::new()
    };
    match requirement(kernel_abi) {
        Err(e) => (false, e.to_string()),
        Ok(c) if c.substitutes.is_empty() => (
            true,
            format!(
                "ABI {} applied: rights {}{newer}",
                c.abi,
                c.rights.join(", ")
            ),
        ),
        Ok(c) => (
            true,
            format!(
                "ABI {} applied: rights {}; covered by other layers: {}{newer}",
                c.abi,
                c.rights.join(", "),
                c.substitutes.join("; ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every ABI a kernel may report: whether a strict run is allowed, and which rights apply.
    #[test]
    fn strict_requirement_for_every_abi() {
        let table: [(u32, bool, &[&str]); 9] = [
            (0, false, &[]),
            (1, true, &["fs"]),
            (2, true, &["fs", "refer"]),
            (3, true, &["fs", "refer", "truncate"]),
            (4, true, &["fs", "refer", "truncate", "tcp"]),
            (5, true, &["fs", "refer", "truncate", "tcp", "ioctl_dev"]),
            (
                6,
                true,
                &["fs", "refer", "truncate", "tcp", "ioctl_dev", "scope"],
            ),
            (
                7,
                true,
                &["fs", "refer", "truncate", "tcp", "ioctl_dev", "scope"],
            ),
            (
                10,
                true,
                &["fs", "refer", "truncate", "tcp", "ioctl_dev", "scope"],
            ),
        ];
        for (abi, ok, rights) in table {
            let r = requirement(abi);
            assert_eq!(r.is_ok(), ok, "ABI {abi}: {r:?}");
            let Ok(c) = r else {
                assert!(
                    r.unwrap_err().to_string().contains("lsm="),
                    "ABI {abi}: the fix is named"
                );
                continue;
            };
            assert_eq!(c.rights, rights, "ABI {abi}");
            assert_eq!(c.abi, abi.min(6));
            // Every feature is either applied or named with its substitute, never dropped.
            assert_eq!(
                c.rights.len() + c.substitutes.len(),
                FEATURES.len(),
                "ABI {abi}"
            );
            for f in FEATURES.iter().filter(|f| f.abi > abi) {
                assert!(
                    c.substitutes.iter().any(|s| s.starts_with(f.name)),
                    "ABI {abi}: {} not accounted for in {:?}",
                    f.name,
                    c.substitutes
                );
            }
        }
        // The layers the issue names cover what ABI 4 and 6 add.
        let two = requirement(2).unwrap();
        assert!(
            two.substitutes
                .iter()
                .any(|s| s.starts_with("tcp") && s.contains("network namespace"))
        );
        assert!(
            two.substitutes
                .iter()
                .any(|s| s.starts_with("scope") && s.contains("pid namespace"))
        );
    }

    #[test]
    fn only_the_file_system_rights_lack_a_substitute() {
        for f in &FEATURES {
            assert_eq!(
                f.substitute.is_none(),
                f.abi <= STRICT_MIN_ABI,
                "{}",
                f.name
            );
        }
        assert_eq!(FEATURES.last().unwrap().abi, WANTED_ABI);
    }

    #[test]
    fn check_line_names_rights_and_substitutes() {
        let (ok, d) = describe(2);
        assert!(ok);
        assert!(d.starts_with("ABI 2 applied: rights fs, refer;"), "{d}");
        assert!(d.contains("tcp (Landlock ABI 4)"), "{d}");
        // The ABI applied, as run reports say it, and the kernel's when it is newer.
        let (ok, d) = describe(7);
        assert!(ok);
        assert_eq!(
            d,
            "ABI 6 applied: rights fs, refer, truncate, tcp, ioctl_dev, scope (the kernel offers ABI 7; newer ABIs than 6 add no right agentjail uses)"
        );
        let (_, d) = describe(6);
        assert_eq!(
            d,
            "ABI 6 applied: rights fs, refer, truncate, tcp, ioctl_dev, scope"
        );
        let (ok, _) = describe(0);
        assert!(!ok);
    }
}
