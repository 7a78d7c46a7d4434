#!/usr/bin/env bash
# ci/release/build.sh OUTDIR: the release artifacts of the checked-out commit (docs/release.md).
#
#   agentjail-x86_64-linux-musl      the static x86_64 binary (musl, release profile)
#   agentjail_<version>-1_amd64.deb  the Debian package (cargo-deb; packaging/debian/)
#   agentjail.cdx.json               the SBOM, CycloneDX 1.5 JSON (cargo-cyclonedx)
#   agentjail-oci-layout.tar         the OCI image layout of agentjail (deploy/kubernetes' image):
#                                    Debian 12 minbase + python3, and the binary
#   agentjail-kubernetes.tar         deploy/kubernetes, naming that image by digest
#   agentjail.provenance.json        in-toto Statement v1 (SLSA provenance v1) over all of the
#                                    above, in a DSSE envelope signed with Ed25519
#   release-signing-key.pub          the public half of the signing key
#   verify-provenance.py             the verifier (Python standard library + openssl)
#   SHA256SUMS                       sha256sum of every file above
#
# What is built is exactly the commit HEAD names: its `git archive` is synced into
# target/release-src (only changed files are rewritten, so cargo rebuilds only what changed),
# and built there with the repository's target directory, whatever else the work tree holds.
# The signing key: $AGENTJAIL_RELEASE_KEY (a PKCS#8 PEM Ed25519 private key, the format of
# agentjail's receipt key); without it, target/release-key.pem, created on first use (a
# throwaway key that proves nothing about who built the release: see docs/release.md).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
out="$(realpath -m "$1")"
triple=x86_64-unknown-linux-musl
cyclonedx_version=0.5.9
deb_version=3.8.0
step() { echo "=== release: $1 (${SECONDS}s) ===" >&2; }

commit="$(git -C "$repo" rev-parse HEAD)"
commit_date="$(git -C "$repo" log -1 --format=%cs "$commit")"
commit_epoch="$(git -C "$repo" log -1 --format=%ct "$commit")"
export CARGO_TARGET_DIR="$repo/target"
src="$repo/target/release-src"
rel="$CARGO_TARGET_DIR/$triple/release"

step "musl toolchain"
command -v x86_64-linux-musl-gcc >/dev/null \
  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools; }
rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"

step "source of commit ${commit:0:12}"
mkdir -p "$src"
tmp="$(mktemp -d "$repo/target/release-tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$tmp"
# Copy what differs, delete what HEAD no longer has; unchanged files keep their mtime.
python3 - "$tmp" "$src" <<'EOF'
import filecmp, os, shutil, sys
a, b = sys.argv[1], sys.argv[2]
keep = set()
for root, dirs, files in os.walk(a):
    rel = os.path.relpath(root, a)
    os.makedirs(os.path.join(b, rel), exist_ok=True)
    for f in files:
        s, d = os.path.join(root, f), os.path.join(b, rel, f)
        keep.add(os.path.normpath(os.path.join(rel, f)))
        if os.path.islink(s) or os.path.islink(d) or not os.path.exists(d) \
                or not filecmp.cmp(s, d, shallow=False):
            if os.path.lexists(d):
                os.remove(d)
            shutil.copy2(s, d, follow_symlinks=False)
            if not os.path.islink(d):
                os.utime(d)  # now: newer than any previous build's outputs
for root, dirs, files in os.walk(b):
    for f in files:
        p = os.path.join(root, f)
        r = os.path.normpath(os.path.relpath(p, b))
        if r not in keep and not r.startswith("target/"):
            os.remove(p)
EOF

step "cargo build --release --target $triple (the long step)"
# No SOURCE_DATE_EPOCH here: the cc crate reruns every C build script (ring, SQLite) when it
# changes, and with them every crate above. The date --version shows is the commit's anyway.
(cd "$src" && AGENTJAIL_BUILD_COMMIT="$commit" AGENTJAIL_BUILD_DATE="$commit_date" \
  cargo build --release --locked --target "$triple" -p agentjail)
bin="$rel/agentjail"
# Static: no program interpreter, no shared library needed.
! readelf -lW "$bin" | grep -q 'program interpreter' && ! readelf -dW "$bin" | grep -q '(NEEDED)' \
  || { echo "FAIL: $bin is not statically linked" >&2; exit 1; }
"$bin" --version | grep -q "(commit ${commit:0:7}, $commit_date, $triple)" \
  || { echo "FAIL: $bin --version does not name commit ${commit:0:7}: $("$bin" --version)" >&2; exit 1; }
version="$("$bin" --version | awk '{print $2}')"

step "packaging tools (pinned)"
cargo cyclonedx --version 2>/dev/null | grep -q " $cyclonedx_version\$" \
  || cargo install --locked --version "$cyclonedx_version" cargo-cyclonedx
cargo deb --version 2>/dev/null | grep -q "$deb_version" \
  || cargo install --locked --version "$deb_version" cargo-deb

step "man pages, completions, AppArmor profile (for the .deb)"
assets="$rel/deb-assets"
rm -rf "$assets" && mkdir -p "$assets/man" "$assets/completions" "$assets/apparmor"
"$bin" man "$assets/man" >/dev/null
gzip -9n "$assets"/man/*.1
"$bin" completions bash > "$assets/completions/agentjail"
"$bin" completions zsh > "$assets/completions/_agentjail"
"$bin" completions fish > "$assets/completions/agentjail.fish"
# deploy/apparmor's profile names /usr/local/bin/agentjail; the package installs /usr/bin.
sed 's#^profile agentjail /usr/local/bin/agentjail #profile agentjail /usr/bin/agentjail #' \
  "$src/deploy/apparmor/agentjail" > "$assets/apparmor/agentjail"
grep -q '^profile agentjail /usr/bin/agentjail ' "$assets/apparmor/agentjail" \
  || { echo "FAIL: deploy/apparmor/agentjail has no 'profile agentjail /usr/local/bin/agentjail' line" >&2; exit 1; }

rm -rf "$out" && mkdir -p "$out"
cp "$bin" "$out/agentjail-x86_64-linux-musl"

step "Debian package (cargo-deb $deb_version)"
(cd "$src" && SOURCE_DATE_EPOCH="$commit_epoch" cargo deb -p agentjail --no-build --no-strip \
  --target "$triple" --output "$out/" >/dev/null)
deb="$(cd "$out" && ls agentjail_*.deb)"

step "SBOM (cargo-cyclonedx $cyclonedx_version)"
# The crates the binary is built from, for this target (no build-dependencies: not in it).
find "$src/crates" -maxdepth 2 -name '*.cdx.json' -delete
(cd "$src" && cargo cyclonedx --manifest-path crates/cli/Cargo.toml --format json \
  --spec-version 1.5 --target "$triple" --no-build-deps --override-filename agentjail.cdx)
[ -s "$src/crates/cli/agentjail.cdx.json" ] \
  || { echo "FAIL: cargo cyclonedx wrote no crates/cli/agentjail.cdx.json" >&2; exit 1; }
mv "$src/crates/cli/agentjail.cdx.json" "$out/agentjail.cdx.json"
find "$src/crates" -maxdepth 2 -name '*.cdx.json' -delete

step "OCI image layout (Debian 12 minbase + python3, cached; the binary), deploy/kubernetes by digest"
base="$("$here/debian-root.sh")"
image_digest="$("$here/oci-layout.sh" "$out/agentjail-x86_64-linux-musl" "$version" "$commit" \
  "$commit_epoch" "$out/agentjail-oci-layout.tar" "$base")"
python3 "$here/k8s-image.py" pin "$src/deploy/kubernetes" "$image_digest" "$commit_epoch" \
  "$out/agentjail-kubernetes.tar"

step "provenance (in-toto Statement v1, SLSA provenance v1, DSSE, Ed25519)"
key="${AGENTJAIL_RELEASE_KEY:-$repo/target/release-key.pem}"
if [ ! -e "$key" ]; then
  [ -z "${AGENTJAIL_RELEASE_KEY:-}" ] || { echo "FAIL: AGENTJAIL_RELEASE_KEY=$key does not exist" >&2; exit 1; }
  (umask 077 && openssl genpkey -algorithm ed25519 -out "$key")
  echo "NOTE: made a throwaway signing key, $key (docs/release.md)" >&2
fi
# The key is read the way agentjail reads its receipt key (refused if others can read it, etc.):
# its public half comes from `agentjail receipt pubkey`.
"$bin" receipt pubkey --key "$key" > "$out/release-signing-key.pub"
rustc_v="$(rustc --version)"
cargo_v="$(cargo --version)"
lock_sha="$(sha256sum "$src/Cargo.lock" | cut -d' ' -f1)"
base_sha="$(sha256sum "$base" | cut -d' ' -f1)"
finished="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
python3 - "$tmp/predicate.json" <<EOF
import json, sys
json.dump({
  "buildDefinition": {
    "buildType": "https://agentjail.dev/release/build-sh/v1",
    "externalParameters": {"source": "git+agentjail@${commit}", "commit": "${commit}",
                           "target": "${triple}", "script": "ci/release/build.sh"},
    "internalParameters": {"rustc": "${rustc_v}", "cargo": "${cargo_v}",
                           "cargo-deb": "${deb_version}", "cargo-cyclonedx": "${cyclonedx_version}",
                           "SOURCE_DATE_EPOCH": "${commit_epoch}"},
    "resolvedDependencies": [
      {"uri": "git+agentjail", "digest": {"gitCommit": "${commit}"}},
      {"name": "Cargo.lock", "digest": {"sha256": "${lock_sha}"}},
      {"name": "$(basename "$base")", "digest": {"sha256": "${base_sha}"},
       "annotations": {"madeBy": "ci/release/debian-root.sh (mmdebstrap, Debian 12 minbase + python3)"}}
    ]
  },
  "runDetails": {
    "builder": {"id": "https://agentjail.dev/release/ci-release-build-sh"},
    "metadata": {"finishedOn": "${finished}"}
  }
}, open(sys.argv[1], "w"))
EOF
cp "$here/provenance.py" "$out/verify-provenance.py"
python3 "$here/provenance.py" sign --key "$key" --out "$out/agentjail.provenance.json" \
  --predicate "$tmp/predicate.json" "$out/agentjail-x86_64-linux-musl" "$out/agentjail.cdx.json" \
  "$out/$deb" "$out/agentjail-oci-layout.tar" "$out/agentjail-kubernetes.tar"

(cd "$out" && sha256sum agentjail-x86_64-linux-musl "$deb" agentjail.cdx.json agentjail-oci-layout.tar \
  agentjail-kubernetes.tar agentjail.provenance.json release-signing-key.pub verify-provenance.py > SHA256SUMS)
step "done: $out"
ls -l "$out" >&2
