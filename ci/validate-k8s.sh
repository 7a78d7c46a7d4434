#!/usr/bin/env bash
# Offline validation of deploy/kubernetes (docs/deploy.md). No cluster is involved:
#  1. every manifest against Kubernetes' own OpenAPI schemas, strictly (an unknown field is an
#     error), with kubernetes-validate (PyPI; it bundles the schemas), for each version below;
#  2. kustomization.yaml lists exactly the manifests of the folder, and each exists;
#  3. the ConfigMap's config.toml against `agentjail config --schema` of the binary given;
#  4. the Secret holds placeholders only;
#  5. seccomp/agentjail.json is what seccomp/generate.py makes from Docker's default profile
#     (Debian's golang-github-docker-docker-dev, fetched with `apt-get download`) and the
#     engine's deny-list (crates/engine/src/seccomp.rs);
#  6. the securityContext claims of docs/deploy.md, in runc containers (needs root and runc);
#  7. the worker Deployment against the API's StatefulSet: the same pod and container
#     securityContext, node selection and cgroup entrypoint (so the claims checked in 6, made
#     with the StatefulSet's, hold for it too), probes on its --listen port, a grace period
#     covering the longest task, and its own PodDisruptionBudget and NetworkPolicy;
#  8. the image reference (ci/release/k8s-image.py): one image, named by digest (here the
#     placeholder the release build fills in; ci/release/check.sh checks the release's copy
#     against the image it built), and every container names it.
# Any error fails (exit 1). Usage: ci/validate-k8s.sh [AGENTJAIL_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
agentjail=${1:-target/x86_64-unknown-linux-gnu/debug/agentjail}
agentjail=$(realpath "$agentjail")   # the runc checks run it from a folder of their own
dir=deploy/kubernetes
versions=(1.33.0 1.35.0)
fail=0
schema=
work=
trap 'rm -rf "$work" "$schema"' EXIT
say() { echo "validate-k8s: $*"; }
bad() { echo "validate-k8s: FAIL: $*" >&2; fail=1; }

python3 -m kubernetes_validate --version >/dev/null 2>&1 \
  || { echo "validate-k8s: FAIL: kubernetes-validate is not installed (python3 -m pip install kubernetes-validate)" >&2; exit 1; }

# 1. The manifests (kustomization.yaml is kustomize's, not a Kubernetes object).
mapfile -t manifests < <(find "$dir" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml | sort)
[ ${#manifests[@]} -gt 0 ] || bad "no manifests in $dir"
for v in "${versions[@]}"; do
  if ! out=$(python3 -m kubernetes_validate --strict -k "$v" "${manifests[@]}" 2>&1); then
    echo "$out" >&2
    bad "a manifest does not validate against Kubernetes $v"
  elif grep -q "Couldn't find schema" <<<"$out"; then
    echo "$out" >&2
    bad "a manifest has a kind without a schema in Kubernetes $v (not validated)"
  else
    say "$(grep -c passed <<<"$out") objects in ${#manifests[@]} files valid against Kubernetes $v (strict)"
  fi
done

# 2. The kustomization.
python3 - "$dir" <<'EOF' || fail=1
import os, sys, yaml
d = sys.argv[1]
k = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
assert k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1" and k.get("kind") == "Kustomization"
listed = set(k.get("resources", []))
present = {f for f in os.listdir(d) if f.endswith(".yaml") and f != "kustomization.yaml"}
ok = True
for f in sorted(listed - present):
    print(f"validate-k8s: FAIL: kustomization.yaml lists {f}, which does not exist", file=sys.stderr); ok = False
for f in sorted(present - listed):
    print(f"validate-k8s: FAIL: {f} is not in kustomization.yaml", file=sys.stderr); ok = False
known = {"apiVersion", "kind", "resources", "images"}
for key in set(k) - known:
    print(f"validate-k8s: FAIL: kustomization.yaml: field {key} not checked here", file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
EOF
[ $fail -ne 0 ] || say "kustomization.yaml lists exactly the manifests"

# 3. The service configuration inside the ConfigMap.
if [ ! -x "$agentjail" ]; then
  bad "$agentjail is not an executable (build it first: cargo build -p agentjail)"
else
  schema=$(mktemp)
  "$agentjail" config --schema > "$schema"
  if python3 - "$dir/configmap.yaml" "$schema" <<'EOF'; then
import json, sys, tomllib, yaml, jsonschema
cm = yaml.safe_load(open(sys.argv[1]))
config = tomllib.loads(cm["data"]["config.toml"])
schema = json.load(open(sys.argv[2]))
v = jsonschema.validators.validator_for(schema)(schema)
errors = list(v.iter_errors(config))
for e in errors:
    print(f"validate-k8s: config.toml: {'/'.join(map(str, e.path)) or '(root)'}: {e.message}", file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
    say "config.toml matches the configuration schema of $agentjail"
  else
    bad "configmap.yaml's config.toml does not match \`$agentjail config --schema\`"
  fi
fi

# 4. No real secret in the repository.
python3 - "$dir/secret.yaml" <<'EOF' || bad "secret.yaml must hold placeholders only"
import sys, yaml
s = yaml.safe_load(open(sys.argv[1]))
assert "data" not in s, "use stringData with REPLACE-ME placeholders"
for k, v in s["stringData"].items():
    assert "REPLACE-ME" in v, f"{k} is not a placeholder"
EOF

# 5. The seccomp profile.
work=$(mktemp -d)
fetch_profile() { (cd "$work" && apt-get download -q golang-github-docker-docker-dev >/dev/null 2>&1); }
# A fresh machine may have no package lists yet.
if fetch_profile || { apt-get update -qq && fetch_profile; }; then
  dpkg -x "$work"/golang-github-docker-docker-dev_*.deb "$work/x"
  docker_default="$work/x/usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json"
  python3 "$dir/seccomp/generate.py" "$docker_default" crates/engine/src/seccomp.rs > "$work/agentjail.json"
  if diff -u "$dir/seccomp/agentjail.json" "$work/agentjail.json" >&2; then
    say "seccomp/agentjail.json = Docker's default ($(basename "$work"/golang-github-docker-docker-dev_*.deb)) + agentjail's calls"
  else
    bad "seccomp/agentjail.json differs from what seccomp/generate.py makes now; regenerate it (see its header)"
  fi
else
  bad "apt-get download golang-github-docker-docker-dev failed (Docker's default seccomp profile is needed to check seccomp/agentjail.json)"
fi

# 6. The securityContext claims of docs/deploy.md, in runc containers built as a pod's would
#    be (deploy/kubernetes/tools/simulate-pod.py): the pod defaults refuse the sandbox, a masked
#    /proc refuses it, and the minimal securityContext passes the whole native self-test.
if [ -n "${docker_default:-}" ] && [ -f "$docker_default" ] && [ -x "$agentjail" ]; then
  if ! command -v runc >/dev/null; then
    bad "runc is missing (apt-get install runc): the securityContext claims were not checked"
  else
    sim() { SIMULATE_CMD=$1 python3 "$dir/tools/simulate-pod.py" "$agentjail" "$docker_default" "$2" 2>&1; }
    out=$(sim check default)
    if grep -q 'exit status 1' <<<"$out" && grep -q 'clone(CLONE_NEWUSER) failed: Function not implemented' <<<"$out"; then
      say "pod defaults: the sandbox is refused (RuntimeDefault seccomp: clone3 ENOSYS), as documented"
    else
      echo "$out" >&2; bad "pod defaults: not refused as docs/deploy.md says"
    fi
    out=$(sim check seccomp-profile+cgroup-rw)
    # The strict run is refused; its reason names the proc mount, except in about one run of
    # three where the init's report of it is lost and the reason reads "init died" (a race in
    # the engine's setup reporting, docs/deploy.md).
    if grep -Eq '^strict run +NO +(sandbox setup failed at .mount proc on /proc.: mount\(proc\): Operation not permitted|the sandbox init died during setup|the sandbox ended before the command did \(init died\))' <<<"$out"; then
      say "masked /proc: the strict run is refused ($(grep -o '^strict run.*' <<<"$out" | sed 's/^strict run *NO *//'))"
    else
      echo "$out" >&2; bad "masked /proc: not refused as docs/deploy.md says"
    fi
    out=$(sim selftest seccomp-profile+unmasked+cgroup-rw+minimal-caps)
    if grep -q 'selftest exit status 0' <<<"$out" && grep -q ' passed, 0 failed' <<<"$out"; then
      say "minimal securityContext: $(sed -n 's/^agentjail selftest: //p' <<<"$out" | head -1)"
    else
      echo "$out" >&2; bad "minimal securityContext: the native self-test did not pass"
    fi
  fi
fi

# 7. The worker Deployment.
python3 - "$dir" <<'EOF' || bad "worker.yaml does not match what docs/deploy.md says of it"
import os, re, sys, tomllib, yaml
d = sys.argv[1]
def docs(f):
    return [x for x in yaml.safe_load_all(open(os.path.join(d, f))) if x]
def one(f, kind, name):
    found = [x for x in docs(f) if x["kind"] == kind and x["metadata"]["name"] == name]
    assert len(found) == 1, f"{f}: no single {kind} {name}"
    return found[0]
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)
api = one("statefulset.yaml", "StatefulSet", "agentjail")
wk = one("worker.yaml", "Deployment", "agentjail-worker")
ap, wp = api["spec"]["template"]["spec"], wk["spec"]["template"]["spec"]
ac, wc = ap["containers"][0], wp["containers"][0]
for key in ("securityContext", "hostUsers", "nodeSelector", "automountServiceAccountToken", "serviceAccountName"):
    check(ap.get(key) == wp.get(key), f"pod {key} differs from the StatefulSet's: {wp.get(key)!r}")
check(ac.get("securityContext") == wc.get("securityContext"),
      f"container securityContext differs from the StatefulSet's: {wc.get('securityContext')!r}")
def script(c):
    return c["args"][0]
def before_exec(c):
    return script(c).split("exec /usr/local/bin/agentjail")[0]
check(before_exec(ac) == before_exec(wc), "the cgroup entrypoint differs from the StatefulSet's")
m = re.search(r"exec /usr/local/bin/agentjail worker ([^\n]*)", script(wc))
check(m is not None, "the worker container does not exec `agentjail worker`")
lm = re.search(r"--listen [^ :]+:(\d+)", m.group(1) if m else "")
check(lm is not None, "the worker has no --listen ADDR:PORT (its probes would have no endpoint)")
port = int(lm.group(1)) if lm else None
ports = {p["name"]: p["containerPort"] for p in wc.get("ports", [])}
for probe, paths in (("startupProbe", {"/healthz"}), ("readinessProbe", {"/readyz"}), ("livenessProbe", {"/metrics", "/healthz"})):
    pr = wc.get(probe)
    check(pr is not None, f"{probe} missing")
    if pr:
        g = pr.get("httpGet", {})
        check(g.get("path") in paths, f"{probe} on {g.get('path')}, expected one of {sorted(paths)}")
        p = g.get("port")
        check(ports.get(p, p) == port, f"{probe} on port {p}, not the --listen port {port}")
check(re.search(r"agentjail serve [^\n]*--slots 0", script(ac)) is not None,
      "the API StatefulSet does not run `serve --slots 0` although workers ship")
cm = one("configmap.yaml", "ConfigMap", "agentjail-config")
config = tomllib.loads(cm["data"]["config.toml"])
longest = max((t.get("limits", {}).get("seconds", 0) for t in config.get("tasks", {}).values()), default=0)
grace = wp.get("terminationGracePeriodSeconds", 30)
check(grace >= longest + 30, f"terminationGracePeriodSeconds {grace} < the longest task ({longest} s) + 30")
for r in ("requests", "limits"):
    check(set(wc.get("resources", {}).get(r, {})) >= {"cpu", "memory"}, f"resources.{r} needs cpu and memory")
sel = {"app.kubernetes.io/name": "agentjail", "app.kubernetes.io/component": "worker"}
check(wk["spec"]["selector"]["matchLabels"] == sel, "the Deployment's selector")
pdb = one("pdb.yaml", "PodDisruptionBudget", "agentjail-worker")
check(pdb["spec"]["selector"]["matchLabels"] == sel, "the workers' PDB does not select the workers")
np = one("networkpolicy.yaml", "NetworkPolicy", "agentjail-worker")
check(np["spec"]["podSelector"]["matchLabels"] == sel, "the workers' NetworkPolicy does not select the workers")
ing = sorted(p["port"] for r in np["spec"].get("ingress", []) for p in r.get("ports", []))
check(ing == [port], f"the workers' ingress ports {ing}, expected only [{port}]")
eg = sorted({p["port"] for r in np["spec"].get("egress", []) for p in r.get("ports", [])})
check(eg == [53, 5432], f"the workers' egress ports {eg}, expected only DNS and PostgreSQL")
check(all(r.get("to") for r in np["spec"].get("egress", [])), "an egress rule of the workers without `to` (anywhere)")
for e in errors:
    print(f"validate-k8s: FAIL: worker.yaml: {e}", file=sys.stderr)
if not errors:
    print(f"validate-k8s: worker.yaml: the StatefulSet's securityContext and entrypoint, probes on :{port}, grace {grace} s >= {longest} s + 30, its PDB and NetworkPolicy (DNS and PostgreSQL only)")
sys.exit(1 if errors else 0)
EOF

# 8. The image reference.
python3 ci/release/k8s-image.py check "$dir" || bad "the image reference of $dir (above)"

if [ $fail -ne 0 ]; then
  echo "validate-k8s: FAILED" >&2
  exit 1
fi
say "all checks passed"
