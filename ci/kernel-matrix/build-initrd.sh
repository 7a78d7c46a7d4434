#!/bin/bash
# Usage: build-initrd.sh KDIR OUT.cpio.gz AGENTJAIL_BINARY
# KDIR is a `dpkg -x` of a linux-image-*.deb (fetch-kernels.sh). Packs busybox-static, the
# virtio/9p modules with their dependencies in load order (decompressed: busybox insmod reads
# plain .ko), init, the agentjail binary and the guest suite.
set -euo pipefail
KDIR=$(realpath "$1"); OUT=$2; AJ=$3
SRC=$(dirname "$(realpath "$0")")
KVER=$(ls "$KDIR/lib/modules")
MODDIR=$KDIR/lib/modules/$KVER
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W"/{bin,dev,proc,sys,newroot,mods,aj}
cp /bin/busybox "$W/bin/busybox"
ln -s busybox "$W/bin/sh"
python3 - "$MODDIR" "$W/mods" virtio_pci 9pnet_virtio 9p <<'PY'
import sys, os, lzma, shutil
moddir, out, *want = sys.argv[1:]
def name(p): return os.path.basename(p).split(".ko")[0].replace("-", "_")
dep = {}
for line in open(os.path.join(moddir, "modules.dep")):
    k, v = line.split(":", 1)
    dep[name(k)] = (k, v.split())
order = []
def visit(n):
    if n in order or n not in dep: return   # absent: built into the kernel
    for d in dep[n][1]: visit(name(d))
    order.append(n)
for n in want: visit(n)
with open(os.path.join(out, "order"), "w") as f:
    for n in order:
        src = os.path.join(moddir, dep[n][0]); dst = os.path.join(out, n + ".ko")
        if src.endswith(".xz"): open(dst, "wb").write(lzma.open(src).read())
        else: shutil.copy(src, dst)
        f.write(n + "\n")
PY
cp "$SRC/init" "$W/init"; chmod 755 "$W/init"
cp "$AJ" "$W/aj/agentjail"
cp "$SRC/guest.sh" "$SRC/probes.py" "$W/aj/"
(cd "$W" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$OUT"
