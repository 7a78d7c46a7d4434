#!/bin/bash
# Usage: fetch-kernels.sh CACHE_DIR
# Downloads (with apt-get download, from Debian's archive) the newest Debian 12 kernel of each
# series the matrix boots, and unpacks it to CACHE_DIR/<series>/ (a `dpkg -x` tree with
# boot/vmlinuz-* and lib/modules/<version>/, modules.dep regenerated with depmod).
# A kernel already unpacked there is reused. Prints "<series> <dir>" per kernel.
set -euo pipefail
CACHE=$(realpath -m "$1"); mkdir -p "$CACHE"
# series -> package name pattern (Debian 12: 6.1 is the release kernel; 6.12 comes as
# linux-image-6.12.N+deb12-amd64 from bookworm's security/updates suites).
declare -A PATTERN=(
  [6.1]='^linux-image-6\.1\.0-[0-9]+-amd64$'
  [6.12]='^linux-image-6\.12\.[0-9]+\+deb12-amd64$'
)
for series in 6.1 6.12; do
  dir=$CACHE/$series
  if [ -e "$dir/.complete" ]; then echo "$series $dir"; continue; fi
  pkg=$(apt-cache search --names-only "${PATTERN[$series]}" | awk '{print $1}' | sort -V | tail -1)
  if [ -z "$pkg" ]; then
    apt-get update -qq
    pkg=$(apt-cache search --names-only "${PATTERN[$series]}" | awk '{print $1}' | sort -V | tail -1)
  fi
  [ -n "$pkg" ] || { echo "fetch-kernels: no package matches ${PATTERN[$series]}" >&2; exit 1; }
  rm -rf "$dir" "$CACHE/dl-$series"; mkdir -p "$CACHE/dl-$series"
  (cd "$CACHE/dl-$series" && timeout 600 apt-get download -qq "$pkg") >&2
  dpkg -x "$CACHE/dl-$series"/*.deb "$dir"
  rm -rf "$CACHE/dl-$series"
  kver=$(ls "$dir/lib/modules")
  depmod -b "$dir" "$kver"
  echo "$pkg" > "$dir/.package"
  touch "$dir/.complete"
  echo "$series $dir"
done
