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

/// The lock file's lines as pip 23 reads them (`req_file.py`: `join_lines`, then
/// `ignore_comments`): a line ending in a backslash continues on the next, except a comment
/// line, which never continues and ends a continuation; `#` at the start or after whitespace
/// starts a comment; blank lines are left out. Lines break where Python's `splitlines` breaks
/// them (a lone `\r`, `\v`, `\f`, `\x1c`–`\x1e`, `\u{85}`, `\u{2028}`, `\u{2029}` too), so
/// that no line pip sees is hidden in one seen here.
fn logical_lines(text: &str) -> Vec<String> {
    let is_comment = |l: &str| l.trim_start().starts_with('#');
    let mut raw: Vec<&str> = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let brk = matches!(
            c,
            '\n' | '\r'
                | '\u{b}'
                | '\u{c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if brk {
            raw.push(&text[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r'
                && let Some((j, '\n')) = chars.peek().copied()
            {
                chars.next();
                end = j + 1;
            }
            start = end;
        }
    }
    if start < text.len() {
        raw.push(&text[start..]);
    }
    let mut joined: Vec<String> = Vec::new();
    let mut pending: Option<String> = None;
    for line in raw {
        if !line.ends_with('\\') || is_comment(line) {
            let line = if is_comment(line) { "" } else { line };
            match pending.take() {
                Some(mut p) => {
                    p.push_str(line);
                    joined.push(p);
                }
                None => joined.push(line.to_owned()),
            }
        } else {
            pending
                .get_or_insert_with(String::new)
                .push_str(line.trim_end_matches('\\'));
        }
    }
    if let Some(p) = pending {
        joined.push(p);
    }
    joined
        .into_iter()
        .map(|l| {
            // `#` after whitespace starts a comment.
            let cut = l
                .char_indices()
                .find(|&(i, c)| c == '#' && l[..i].chars().last().is_some_and(char::is_whitespace))
                .map(|(i, _)| i);
            match cut {
                Some(i) => l[..i].trim().to_owned(),
                None => l.trim().to_owned(),
            }
        })
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
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

/// The lock file `agentjail image build` hands to pip, rebuilt from what was read here:
/// one line per requirement, `name[extras]==version ; marker --hash=sha256:…`, and nothing
/// else, so that pip cannot read an option, a URL or a line this reader did not see. Or why
/// the file cannot be used, one line per problem.
///
/// Every requirement must be an exact pin carrying at least one `--hash=sha256:<64 hex>`;
/// extras are names only; a marker may hold letters, digits, spaces, quotes, comparisons,
/// dots, underscores, commas and brackets (no `-`, `@`, `#`, `\\`, so nothing in it can start
/// an option or a URL); the only options admitted are `--hash` and `--require-hashes`; the
/// text may hold no control character but line ends and tabs.
pub fn hashed_lock(text: &str) -> Result<String, Vec<String>> {
    let mut problems = Vec::new();
    if let Some(c) = text.chars().find(|&c| {
        (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || matches!(c, '\u{2028}' | '\u{2029}')
    }) {
        problems.push(format!(
            "the lock file holds the control character {:?}: refused (pip would read lines this check does not)",
            c
        ));
    }
    if text
        .split('\n')
        .any(|l| l.trim_end_matches('\r').contains('\r'))
    {
        problems.push(
            "the lock file holds a carriage return that is not part of a line end: refused".into(),
        );
    }
    let mut out = String::new();
    for line in logical_lines(text) {
        let line = line.replace('\t', " ");
        let line = line.as_str();
        if line.starts_with('-') {
            if line != "--require-hashes" {
                problems.push(format!(
                    "`{line}`: options other than --hash are not read from the lock file (the index is the build's --index-url)"
                ));
            }
            continue;
        }
        let (head, opts) = match line.find(" -") {
            Some(i) => (&line[..i], &line[i..]),
            None => (line, ""),
        };
        let (req, marker) = match head.split_once(';') {
            Some((r, m)) => (r.trim(), Some(m.trim())),
            None => (head.trim(), None),
        };
        let Some((name, version, extras)) = strict_pin(req) else {
            problems.push(format!(
                "`{req}`: not an exact pin (name==version, extras as names only, no URL)"
            ));
            continue;
        };
        if let Some(m) = marker
            && (m.is_empty()
                || !m
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b" <>=!~.'\"_(),[]".contains(&b)))
        {
            problems.push(format!(
                "`{req}`: the marker `{m}` holds a character a marker does not need"
            ));
            continue;
        }
        let mut hashes = Vec::new();
        for o in opts.split_whitespace() {
            match o.strip_prefix("--hash=") {
                Some(h) => match h.strip_prefix("sha256:") {
                    Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        hashes.push(hex.to_ascii_lowercase())
                    }
                    _ => problems.push(format!(
                        "`{req}`: `{o}` is not a sha256 hash (--hash=sha256:<64 hex digits>)"
                    )),
                },
                None => problems.push(format!("`{req}`: option `{o}` is not admitted")),
            }
        }
        if hashes.is_empty() {
            problems.push(format!(
                "`{req}` has no --hash (every requirement needs one: `pip-compile --generate-hashes` or `uv pip compile --generate-hashes` write them)"
            ));
            continue;
        }
        out.push_str(&format!("{name}{extras}=={version}"));
        if let Some(m) = marker {
            out.push_str(&format!(" ; {m}"));
        }
        for h in hashes {
            out.push_str(&format!(" --hash=sha256:{h}"));
        }
        out.push('\n');
    }
    if out.is_empty() && problems.is_empty() {
        problems.push("no requirement in the lock file".into());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// `name[extras]==version` with every part in a strict character set: (name, version,
/// `[extras]` or empty). `===` is not admitted here (an arbitrary string).
fn strict_pin(req: &str) -> Option<(String, String, String)> {
    let (left, version) = req.split_once("==")?;
    let (left, version) = (left.trim(), version.trim());
    let (name, extras) = match left.split_once('[') {
        Some((n, rest)) => {
            let inner = rest.strip_suffix(']')?;
            let ok = !inner.is_empty()
                && inner
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.,".contains(&b));
            if !ok {
                return None;
            }
            (n.trim(), format!("[{inner}]"))
        }
        None => (left, String::new()),
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    let version_ok = !version.is_empty()
        && version
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+!".contains(&b));
    (name_ok && version_ok).then(|| (name.to_owned(), version.to_owned(), extras))
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
        assert_eq!(
            hashed_lock(&format!(
                "--require-hashes\nsix==1.16.0 \\\n  --hash=sha256:{h}  # via x\nPy_Yaml[a,b]==6.0 ; python_version < \"3.12\" --hash=sha256:{}\n",
                h.to_uppercase()
            )),
            Ok(format!(
                "six==1.16.0 --hash=sha256:{h}\nPy_Yaml[a,b]==6.0 ; python_version < \"3.12\" --hash=sha256:{h}\n"
            ))
        );
        let p = hashed_lock(&format!(
            "six==1.16.0\npytz>=2024 --hash=sha256:{h}\n--extra-index-url http://evil/\ntzdata==1 --hash=md5:00\n"
        ))
        .unwrap_err();
        assert_eq!(p.len(), 5, "{p:?}");
        assert!(p[0].contains("`six==1.16.0` has no --hash"), "{p:?}");
        assert!(p[1].contains("not an exact pin"), "{p:?}");
        assert!(p[2].contains("--extra-index-url"), "{p:?}");
        assert!(p[3].contains("not a sha256 hash"), "{p:?}");
        assert!(p[4].contains("`tzdata==1` has no --hash"), "{p:?}");
        assert_eq!(
            hashed_lock("# nothing\n").unwrap_err(),
            ["no requirement in the lock file"]
        );
    }

    /// Lines pip would read that a looser reader hides (the red team's findings): a comment
    /// ending in a backslash does not continue (pip reads the next line as an option), a lone
    /// carriage return breaks a line for pip, a URL after extras, an option hidden in a marker.
    #[test]
    fn what_pip_would_read_is_what_is_checked() {
        let h = "a".repeat(64);
        let ok = format!("six==1.16.0 --hash=sha256:{h}\n");
        for (attack, want) in [
            (
                format!("# generated \\\n--no-binary=:all:\n{ok}"),
                "--no-binary",
            ),
            (format!("#\r--no-binary=:all:\n{ok}"), "carriage return"),
            (
                format!("#{}--no-binary=:all:\n{ok}", '\u{b}'),
                "control character",
            ),
            (
                format!("#{}--no-binary=:all:\n{ok}", '\u{2028}'),
                "control character",
            ),
            (
                format!(
                    "six[x] @ https://evil.example/six-1.0-py3-none-any.whl#==1.0 --hash=sha256:{h}\n"
                ),
                "not an exact pin",
            ),
            (
                format!("six==1.0 ; -\t--install-option=--x --hash=sha256:{h}\n"),
                "marker",
            ),
            (
                format!("six==1.0 ; os_name == \"a-b\" --hash=sha256:{h}\n"),
                "marker",
            ),
            (
                format!("six===anything --hash=sha256:{h}\n"),
                "not an exact pin",
            ),
        ] {
            let p = hashed_lock(&attack).expect_err(&attack);
            assert!(p.iter().any(|x| x.contains(want)), "{attack:?}: {p:?}");
        }
        // What `parse` (image outdated) reads follows pip the same way.
        let lock = parse("# c \\\nsix==1.0\n");
        assert_eq!(lock.pins.len(), 1, "{lock:?}");
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
