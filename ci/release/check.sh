#!/usr/bin/env bash
# ci/release/check.sh OUTDIR: tests the release artifacts that ci/release/build.sh wrote, as a
# user gets them (docs/release.md). Any failure exits non-zero; nothing is skipped.
#
#  1. SHA256SUMS checks; the binary is static and `--version` names the commit it was built from.
#  2. The provenance verifies (verify-provenance.py, the shipped verifier, and securesystemslib,
#     the DSSE library of the in-toto tools), covers the binary, SBOM, .deb and OCI layout, and
#     is refused for a changed binary and for another key.
#  3. The SBOM is CycloneDX JSON describing agentjail at this version with its dependencies.
#  4. The OCI layout imports with `agentjail image import` (every blob checked against its
#     digest): Debian 12 minbase, python3 and the binary, no device node, setuid bit or xattr.
#     The released deploy/kubernetes (agentjail-kubernetes.tar) names it by digest and
#     validates; runc runs its entrypoint, then the StatefulSet's entrypoint with its
#     securityContext runs `agentjail check` and `selftest --tier native` from it.
#  5. The .deb installs with dpkg into a clean Debian 12 root made by mmdebstrap (no Rust in
#     it), which then runs `agentjail check`, `agentjail demo` and `agentjail selftest --tier
#     native` with the installed binary; purging it removes the user and the data directory.
#     Its systemd unit passes `systemd-analyze verify` without a warning.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(git -C "$here" rev-parse --show-toplevel)"
out="$(realpath "$1")"
step() { echo "=== release check: $1 (${SECONDS}s) ===" >&2; }
fail() { echo "FAIL: $*" >&2; exit 1; }
work="$(mktemp -d /var/tmp/agentjail-release-check.XXXXXX)"
root=""
cleanup() {
  # The root's mounts live in their own mount namespace (unshare below) and are gone with it.
  rm -rf "$work"
}
trap cleanup EXIT
cd "$out"
bin="$out/agentjail-x86_64-linux-musl"
deb="$(ls agentjail_*_amd64.deb)"

step "SHA256SUMS, static binary, --version"
sha256sum --quiet -c SHA256SUMS || fail "SHA256SUMS does not check"
for f in agentjail-x86_64-linux-musl "$deb" agentjail.cdx.json agentjail-oci-layout.tar \
  agentjail-kubernetes.tar agentjail.provenance.json release-signing-key.pub verify-provenance.py; do
  grep -q "  $f\$" SHA256SUMS || fail "SHA256SUMS does not list $f"
done
if readelf -lW "$bin" | grep -q 'program interpreter' || readelf -dW "$bin" | grep -q '(NEEDED)'; then
  fail "$bin is not static: $(readelf -dW "$bin" | grep NEEDED)"
fi
"$bin" --version | tee "$work/version" >&2
version="$(awk '{print $2}' "$work/version")"
commit="$(python3 - <<'EOF'
import base64, json
st = json.loads(base64.b64decode(json.load(open("agentjail.provenance.json"))["payload"]))
print(st["predicate"]["buildDefinition"]["externalParameters"]["commit"])
EOF
)"
grep -qE "^agentjail $version \(commit ${commit:0:7}, [0-9]{4}-[0-9]{2}-[0-9]{2}, x86_64-unknown-linux-musl\)\$" \
  "$work/version" || fail "--version does not name commit ${commit:0:7} and the musl target"
git -C "$repo" cat-file -e "$commit^{commit}" || fail "the provenance's commit $commit is not in this repository"

step "provenance"
python3 verify-provenance.py --pubkey release-signing-key.pub agentjail.provenance.json \
  agentjail-x86_64-linux-musl agentjail.cdx.json "$deb" agentjail-oci-layout.tar \
  agentjail-kubernetes.tar || fail "the provenance does not verify"
cp "$bin" "$work/agentjail-x86_64-linux-musl" && printf 'x' >> "$work/agentjail-x86_64-linux-musl"
if python3 verify-provenance.py --pubkey release-signing-key.pub agentjail.provenance.json \
  "$work/agentjail-x86_64-linux-musl" 2>"$work/err"; then
  fail "the provenance verified a changed binary"
fi
grep -q "does not match" "$work/err" || fail "a changed binary was refused for another reason: $(cat "$work/err")"
(umask 077 && openssl genpkey -algorithm ed25519 -out "$work/other.pem")
openssl pkey -in "$work/other.pem" -pubout -out "$work/other.pub"
if python3 verify-provenance.py --pubkey "$work/other.pub" agentjail.provenance.json 2>"$work/err"; then
  fail "the provenance verified with another key"
fi
# A third-party DSSE implementation (securesystemslib, behind the in-toto tools) agrees.
python3 - release-signing-key.pub agentjail.provenance.json "$work/other.pub" <<'EOF' || fail "securesystemslib disagrees"
import hashlib, json, sys
from cryptography.hazmat.primitives.serialization import load_pem_public_key, Encoding, PublicFormat
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
def key(path):
    pub = load_pem_public_key(open(path, "rb").read())
    raw = pub.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return SSlibKey.from_crypto(pub, keyid=hashlib.sha256(raw).hexdigest())
env = Envelope.from_dict(json.load(open(sys.argv[2])))
env.verify([key(sys.argv[1])], 1)
try:
    env.verify([key(sys.argv[3])], 1)
except Exception:
    pass
else:
    sys.exit("verified with another key")
st = json.loads(env.payload)
assert st["_type"] == "https://in-toto.io/Statement/v1", st["_type"]
assert st["predicateType"] == "https://slsa.dev/provenance/v1", st["predicateType"]
print("securesystemslib: provenance verified; subjects", [s["name"] for s in st["subject"]], file=sys.stderr)
EOF

step "SBOM"
python3 - agentjail.cdx.json "$version" <<'EOF' || fail "the SBOM is not what it should be"
import json, sys
bom = json.load(open(sys.argv[1]))
assert bom["bomFormat"] == "CycloneDX", bom.get("bomFormat")
assert bom["specVersion"] == "1.5", bom.get("specVersion")
comp = bom["metadata"]["component"]
assert comp["name"] == "agentjail" and comp["version"] == sys.argv[2], comp
names = {c["name"] for c in bom.get("components", [])}
for dep in ("agentjail-engine", "agentjail-verify", "ed25519-dalek", "rustls", "rusqlite", "clap"):
    assert dep in names, "%s is not a component" % dep
assert all(c.get("purl", "").startswith("pkg:cargo/") for c in bom["components"]), "a component without a cargo purl"
print("SBOM: CycloneDX %s, %d components" % (bom["specVersion"], len(names)), file=sys.stderr)
EOF

step "OCI image layout"
digest="$("$bin" image import --store "$work/store" agentjail-oci-layout.tar)"
echo "$digest" | grep -qE '^sha256:[0-9a-f]{64}$' || fail "image import printed $digest"
[ "$(python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])' \
  < <(tar -xOf agentjail-oci-layout.tar index.json))" = "$digest" ] \
  || fail "the imported digest is not the layout's manifest digest"
"$bin" image verify --store "$work/store" "$digest" >/dev/null || fail "image verify $digest"
rootfs="$work/store/images/${digest#sha256:}/rootfs"
cmp "$rootfs/usr/local/bin/agentjail" "$bin" || fail "the image's binary is not the release binary"
# What it holds: Debian's minbase with python3 (the pods' /bin/sh, the task types' python3), no
# Rust, no compiler; the layout itself has no device node, setuid/setgid bit or xattr.
for p in bin/sh usr/bin/python3 usr/bin/dpkg etc/os-release; do
  [ -e "$rootfs/$p" ] || fail "the image has no /$p"
done
grep -q '^VERSION_CODENAME=bookworm$' "$rootfs/etc/os-release" || fail "the image is not Debian 12"
for p in usr/bin/cargo usr/bin/rustc usr/bin/gcc usr/bin/cc; do
  [ ! -e "$rootfs/$p" ] || fail "the image holds /$p"
done
python3 - agentjail-oci-layout.tar <<'EOF' || fail "the image's layers hold what they must not"
import gzip, io, json, sys, tarfile
t = tarfile.open(sys.argv[1])
blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":", 1)[1]).read()
manifest = json.loads(blob(json.loads(t.extractfile("index.json").read())["manifests"][0]["digest"]))
bad, n = [], 0
for layer in manifest["layers"]:
    for m in tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))):
        n += 1
        if m.ischr() or m.isblk() or m.isfifo():
            bad.append(f"{m.name}: device node or FIFO")
        if not m.isdir() and m.mode & 0o6000:
            bad.append(f"{m.name}: setuid/setgid")
        if any(k.startswith("SCHILY.xattr.") for k in m.pax_headers):
            bad.append(f"{m.name}: extended attribute")
for b in bad[:20]:
    print("FAIL:", b, file=sys.stderr)
print(f"image: {len(manifest['layers'])} layers, {n} entries, no device node, setuid bit or xattr",
      file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

# deploy/kubernetes as released names this image by digest, and the image holds what its pods
# and task types run (ci/release/k8s-image.py); the manifests validate against Kubernetes.
mkdir "$work/k8s"
tar -xf agentjail-kubernetes.tar -C "$work/k8s"
python3 "$repo/ci/release/k8s-image.py" check "$work/k8s/agentjail-kubernetes" agentjail-oci-layout.tar \
  || fail "agentjail-kubernetes.tar does not name the release's image (above)"
diff -r -x kustomization.yaml -x __pycache__ "$repo/deploy/kubernetes" "$work/k8s/agentjail-kubernetes" >&2 \
  || fail "agentjail-kubernetes.tar differs from deploy/kubernetes beyond the digest"
python3 -m kubernetes_validate --strict -k 1.35.0 \
  $(find "$work/k8s/agentjail-kubernetes" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml | sort) \
  > "$work/k8s.log" 2>&1 || { cat "$work/k8s.log" >&2; fail "the released manifests do not validate"; }

# The image runs: runc (no daemon) starts its config's entrypoint in a bundle whose read-only
# root is the imported tree, with runc's default spec (no network, default capabilities); then
# the StatefulSet's own entrypoint with its securityContext (privileged: the `privileged`
# variant of deploy/kubernetes/tools/simulate-pod.py) runs `agentjail check` and `agentjail
# selftest --tier native` from the image, in place of `serve`.
if command -v runc >/dev/null; then
  mkdir "$work/bundle"
  cp -a "$rootfs" "$work/bundle/rootfs"
  (cd "$work/bundle" && runc spec)
  python3 - "$work/bundle/config.json" agentjail-oci-layout.tar <<'EOF'
import json, sys, tarfile
t = tarfile.open(sys.argv[2])
blob = lambda d: json.load(t.extractfile("blobs/sha256/" + d.split(":", 1)[1]))
index = json.load(t.extractfile("index.json"))
config = blob(blob(index["manifests"][0]["digest"])["config"]["digest"])
c = json.load(open(sys.argv[1]))
c["process"]["args"] = config["config"]["Entrypoint"] + ["--version"]
c["process"]["env"] = config["config"]["Env"]
c["process"]["terminal"] = False
c["root"]["readonly"] = True
json.dump(c, open(sys.argv[1], "w"))
EOF
  timeout 120 runc run --bundle "$work/bundle" "agentjail-release-check-$$" > "$work/runc.out" 2>&1 \
    || { cat "$work/runc.out" >&2; fail "runc could not run the image's entrypoint"; }
  cmp -s "$work/runc.out" "$work/version" || fail "the image says $(cat "$work/runc.out")"
  echo "runc: the image's entrypoint: $(cat "$work/runc.out")" >&2
  SIMULATE_ROOTFS="$work/bundle/rootfs" SIMULATE_CMD=entrypoint \
    python3 "$repo/deploy/kubernetes/tools/simulate-pod.py" - - privileged > "$work/pod.out" 2>&1 || true
  if grep -q '^check exit status 0$' "$work/pod.out" && grep -q '^selftest exit status 0$' "$work/pod.out" \
    && grep -Eq ' passed, 0 failed' "$work/pod.out"; then
    echo "runc: the StatefulSet's entrypoint and securityContext, from the image: check ok, $(grep -Eo '[0-9]+ passed, 0 failed' "$work/pod.out" | head -1)" >&2
  else
    cat "$work/pod.out" >&2
    fail "the StatefulSet's entrypoint could not run check and the native self-test from the image"
  fi
elif [ -n "${CI:-}" ]; then
  fail "runc is missing (apt-get install runc): the OCI image was not run"
else
  echo "SKIP: runc is missing: the OCI image was not run" >&2
fi

step "Debian package: clean Debian 12 root (mmdebstrap, cached)"
dpkg-deb -c "$deb" > "$work/contents"
for p in ./usr/bin/agentjail ./usr/share/man/man1/agentjail.1.gz ./usr/share/man/man1/agentjail-run.1.gz \
  ./usr/share/bash-completion/completions/agentjail ./usr/share/zsh/vendor-completions/_agentjail \
  ./usr/share/fish/vendor_completions.d/agentjail.fish ./etc/apparmor.d/agentjail \
  ./etc/agentjail/config.toml ./usr/lib/systemd/system/agentjail.service; do
  grep -q " $p\$" "$work/contents" || fail "the .deb has no $p"
done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/agentjail/config.toml \
  || fail "/etc/agentjail/config.toml is not a conffile"
# The unit as systemd reads it (unknown keys, bad values), with ExecStart on the release binary.
if command -v systemd-analyze >/dev/null; then
  mkdir "$work/unit"
  dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/agentjail.service \
    | sed "s#^ExecStart=/usr/bin/agentjail #ExecStart=$bin #" > "$work/unit/agentjail.service"
  grep -q "^ExecStart=$bin serve " "$work/unit/agentjail.service" || fail "the unit's ExecStart is not /usr/bin/agentjail serve"
  systemd-analyze verify --man=no "$work/unit/agentjail.service" > "$work/unit/log" 2>&1 \
    || { cat "$work/unit/log" >&2; fail "systemd-analyze verify refused agentjail.service"; }
  [ ! -s "$work/unit/log" ] || { cat "$work/unit/log" >&2; fail "systemd-analyze verify warned about agentjail.service"; }
elif [ -n "${CI:-}" ]; then
  fail "systemd-analyze is missing (apt-get install systemd): agentjail.service was not verified"
else
  echo "SKIP: systemd-analyze is missing: agentjail.service was not verified" >&2
fi
tarball="$("$here/debian-root.sh")"
root="$work/root"
mkdir "$root"
tar -xf "$tarball" -C "$root"
[ ! -e "$root/usr/bin/cargo" ] && [ ! -e "$root/usr/bin/rustc" ] || fail "the Debian root has Rust"
cp "$deb" "$root/tmp/"
cat > "$root/tmp/in-root.sh" <<EOF
#!/bin/sh
# Runs in the clean root, as root. What a user does after downloading the .deb.
set -eu
export PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
dpkg -i /tmp/$deb
command -v agentjail
agentjail --version
id agentjail
[ "\$(stat -c '%U %a' /var/lib/agentjail)" = "agentjail 700" ]
[ -s /usr/share/man/man1/agentjail-serve.1.gz ]
grep -q '^Delegate=yes' /usr/lib/systemd/system/agentjail.service
grep -q '^User=agentjail' /usr/lib/systemd/system/agentjail.service
agentjail check
agentjail demo
agentjail selftest --tier native
dpkg --purge agentjail
if id agentjail 2>/dev/null; then echo "purge left the user" >&2; exit 1; fi
test ! -e /var/lib/agentjail
test ! -e /usr/bin/agentjail
echo "in-root: all passed"
EOF
chmod 755 "$root/tmp/in-root.sh"
# Not a chroot: the kernel refuses to create a user namespace for a chrooted process (EPERM
# from clone(CLONE_NEWUSER) when the caller's root is not its mount namespace's root), so
# agentjail's sandbox cannot be built under chroot(8) at all. The nearest honest equivalent:
# a private mount and PID namespace (gone, with every mount, when it ends) in which the root is
# bound onto itself, given its own /proc and the host's /sys (cgroups) and /dev, and made the
# namespace's root with pivot_root; the host's tree is then detached. Processes see only the
# clean root's files; the kernel, cgroups and network are the host's.
step "Debian package: dpkg -i, check, demo, selftest --tier native, purge (in the root)"
unshare --mount --pid --fork --propagation private sh -euc '
  root=$1
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  cd "$root"
  mkdir -p .host
  pivot_root . .host
  cd /
  umount -l /.host
  rmdir /.host
  exec /usr/bin/env -i /tmp/in-root.sh
' sh "$root" 2>&1 | tee "$work/in-root.log" >&2
grep -q '^in-root: all passed$' "$work/in-root.log" || fail "the .deb's test in the clean root failed (log above)"
cmp "$bin" <(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/bin/agentjail) \
  || fail "the .deb's binary is not the release binary"
step "all passed"
