//! A pip lock file (`requirements.txt` with exact pins, as `pip-compile --generate-hashes` or
//! `uv pip compile` write them) read for `agentjail image outdated`, and compared with what an
//! image's SBOM says is installed.
//!
//! A requirement counts as pinned when it names one exact version (`name==1.2.3`, or
//! `===`); extras (`name[x]`) and the `--hash=` options are set aside, an environment marker
//! (`; python_version < "3.12"`) is kept as text (its requirement is compared all the same,
//! and the marker shown). Anything else (a range, a URL, a path, `-r`/`-c` includes, index
//! options) is listed as not pinned: the comparison never guesses a version.

use std::collections::BTreeMap;

use crate::sbom::Package;

/// One pinned requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// PEP 503 normalized name.
    pub name: String,
    pub version: String,
    /// The environment marker, if any.
    pub marker: Option<String>,
}

/// A lock file as read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Lock {
    pub pins: Vec<Pin>,
    /// Requirement lines that are not an exact pin (as written, continuation joined).
    pub not_pinned: Vec<String>,
}

/// What moves between an image and a lock file, by PEP 503 name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    pub name: String,
    /// `changed` (both have it, other versions), `added` (only the lock file) or `same`.
    pub change: &'static str,
    pub image: Option<String>,
    pub lock: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub marker: Option<String>,
}

/// Largest lock file read.
pub const MAX_BYTES: u64 = 16 << 20;

/// The lock file's lines as pip reads them: backslash-newline continues a line (the hashes
/// of one requirement), ` #` starts a comment; blank and comment lines left out.
fn logical_lines(text: &str) -> Vec<String> {
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    joined
        .lines()
        .map(|raw| match raw.find(" #") {
            Some(i) => &raw[..i],
            None => raw,
        })
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Reads a lock file's text.
pub fn parse(text: &str) -> Lock {
    let mut lock = Lock::default();
    for line in logical_lines(text) {
        let line = line.as_str();
        if line.starts_with('-') {
            // An option line (`--index-url`, `-r other.txt`, `--require-hashes`): options that
            // pick no version. Includes and constraints are not followed.
            if line.starts_with("-r") || line.starts_with("-c") || line.starts_with("--requirement")
            {
                lock.not_pinned.push(line.to_owned());
            }
            continue;
        }
        // The requirement, its marker, and its options (`--hash=…`) after whitespace.
        let (req, marker) = match line.split_once(';') {
            Some((r, m)) => {
                let m = m.split(" --").next().unwrap_or("").trim();
                (r.trim(), (!m.is_empty()).then(|| m.to_owned()))
            }
            None => (line.split(" --").next().unwrap_or("").trim(), None),
        };
        match pin(req) {
            Some((name, version)) => lock.pins.push(Pin {
                name,
                version,
                marker,
            }),
            None => lock.not_pinned.push(line.to_owned()),
        }
    }
    lock
}

/// `name[extras]==version` (or `===`) → (normalized name, version).
fn pin(req: &str) -> Option<(String, String)> {
    let (name, version) = req
        .split_once("===")
        .or_else(|| req.split_once("=="))
        .map(|(n, v)| (n.trim(), v.trim()))?;
    let name = name.split('[').next()?.trim();
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    let version_ok = !version.is_empty()
        && !version.contains('*')
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+!".contains(&b));
    (name_ok && version_ok).then(|| (crate::sbom::pep503(name), version.to_owned()))
}

/// Compares the image's Python distributions with the lock file's pins, one entry per pin,
/// sorted by name.
pub fn compare(installed: &[Package], lock: &Lock) -> Vec<Change> {
    let have: BTreeMap<String, &str> = installed
        .iter()
        .filter(|p| p.ecosystem == "pypi")
        .map(|p| (crate::sbom::pep503(&p.name), p.version.as_str()))
        .collect();
    let mut out: Vec<Change> = lock
        .pins
        .iter()
        .map(|p| {
            let image = have.get(&p.name).map(|v| (*v).to_owned());
            let change = match &image {
                None => "added",
                Some(v) if same_version(v, &p.version) => "same",
                Some(_) => "changed",
            };
            Change {
                name: p.name.clone(),
                change,
                image,
                lock: p.version.clone(),
                marker: p.marker.clone(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.lock.cmp(&b.lock)));
    out
}

/// Why a lock file cannot feed `agentjail image build`, one line per problem (empty: it can).
/// Every requirement must be an exact pin carrying at least one `--hash=sha256:<64 hex>` (pip's
/// `--require-hashes` mode, which the build also turns on); the only options admitted are
/// `--hash` and `--require-hashes`, so the lock file cannot name another index, include
/// another file or pull from a URL or a path: the index is the build's `--index-url` alone.
pub fn unhashed(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut any = false;
    for line in logical_lines(text) {
        let line = line.as_str();
        if line.starts_with('-') {
            if line != "--require-hashes" {
                problems.push(format!(
                    "`{line}`: options other than --hash are not read from the lock file (the index is the build's --index-url)"
                ));
            }
            continue;
        }
        any = true;
        let (head, opts) = match line.find(" --") {
            Some(i) => (&line[..i], &line[i..]),
            None => (line, ""),
        };
        let req = head.split(';').next().unwrap_or("").trim();
        if pin(req).is_none() {
            problems.push(format!("`{req}`: not an exact pin (name==version)"));
            continue;
        }
        let name = req;
        let mut hashes = 0;
        for o in opts.split_whitespace() {
            match o.strip_prefix("--hash=") {
                Some(h) => match h.strip_prefix("sha256:") {
                    Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        hashes += 1
                    }
                    _ => problems.push(format!(
                        "`{name}`: `{o}` is not a sha256 hash (--hash=sha256:<64 hex digits>)"
                    )),
                },
                None => problems.push(format!("`{name}`: option `{o}` is not admitted")),
            }
        }
        if hashes == 0 {
            problems.push(format!(
                "`{name}` has no --hash (every requirement needs one: `pip-compile --generate-hashes` or `uv pip compile --generate-hashes` write them)"
            ));
        }
    }
    if !any && problems.is_empty() {
        problems.push("no requirement in the lock file".into());
    }
    problems
}

/// Equal versions, as PEP 440 normalizes the common spellings: case, a leading `v`.
fn same_version(a: &str, b: &str) -> bool {
    let norm = |s: &str| s.trim().trim_start_matches(['v', 'V']).to_ascii_lowercase();
    norm(a) == norm(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_hashes_markers_extras_and_what_is_not_pinned() {
        let lock = parse(
            "# generated\n--index-url https://pypi.example/simple\n--require-hashes\n\
             pandas==2.2.3 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n\
             Typing_Extensions==4.12.2 ; python_version < \"3.12\" \\\n    --hash=sha256:cc\n\
             requests[socks]===2.32.3  # via x\n\
             numpy>=2\n\
             -r base.txt\n\
             ./local/pkg\n",
        );
        assert_eq!(
            lock.pins,
            [
                Pin {
                    name: "pandas".into(),
                    version: "2.2.3".into(),
                    marker: None
                },
                Pin {
                    name: "typing-extensions".into(),
                    version: "4.12.2".into(),
                    marker: Some("python_version < \"3.12\"".into())
                },
                Pin {
                    name: "requests".into(),
                    version: "2.32.3".into(),
                    marker: None
                },
            ]
        );
        assert_eq!(lock.not_pinned, ["numpy>=2", "-r base.txt", "./local/pkg"]);
    }

    #[test]
    fn a_build_needs_a_hash_on_every_exact_pin_and_no_other_option() {
        let h = "a".repeat(64);
        assert!(
            unhashed(&format!(
                "--require-hashes\nsix==1.16.0 \\\n  --hash=sha256:{h}\n"
            ))
            .is_empty()
        );
        let p = unhashed(&format!(
            "six==1.16.0\npytz>=2024 --hash=sha256:{h}\n--extra-index-url http://evil/\ntzdata==1 --hash=md5:00\n"
        ));
        assert_eq!(p.len(), 5, "{p:?}");
        assert!(p[0].contains("`six==1.16.0` has no --hash"), "{p:?}");
        assert!(p[1].contains("not an exact pin"), "{p:?}");
        assert!(p[2].contains("--extra-index-url"), "{p:?}");
        assert!(p[3].contains("not a sha256 hash"), "{p:?}");
        assert!(p[4].contains("`tzdata==1` has no --hash"), "{p:?}");
        assert_eq!(unhashed("# nothing\n"), ["no requirement in the lock file"]);
    }

    #[test]
    fn the_comparison_names_each_pin_once() {
        let pkg = |n: &str, v: &str| Package {
            ecosystem: "pypi",
            name: n.into(),
            version: v.into(),
            purl: String::new(),
        };
        let installed = [
            pkg("Pandas", "2.2.3"),
            pkg("numpy", "1.26.4"),
            pkg("six", "1.16.0"),
        ];
        let lock = parse("pandas==2.2.3\nnumpy==2.1.0\nscipy==1.14.1\n");
        let c = compare(&installed, &lock);
        let got: Vec<(&str, &str)> = c.iter().map(|c| (c.name.as_str(), c.change)).collect();
        assert_eq!(
            got,
            [("numpy", "changed"), ("pandas", "same"), ("scipy", "added")]
        );
    }
}
