#!/usr/bin/env bash
# The main job on a generated sample: generate -> pack -> mount -> list/read/verify -> unmount.
set -euo pipefail
work="${DEMO_DIR:-demo-data}"
mnt="$work/mnt"

cleanup() {
    if grep -qs " $(realpath "$mnt") " /proc/mounts; then
        dlfs umount "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt"
    fi
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

rm -rf "$work"
mkdir -p "$mnt"
step "generate an ImageNet-shaped sample (40 classes, 4000 files)"
python tools/make_imagenet_like.py "$work/src" --classes 40 --files 4000 --seed 1

step "dlfs pack $work/src $work/dataset"
dlfs pack "$work/src" "$work/dataset" --shard-size 64M --threads 4
ls -l "$work/dataset"

step "dlfs ls (no mount needed)"
dlfs ls "$work/dataset" | head -3

step "dlfs mount $work/dataset $mnt"
dlfs mount "$work/dataset" "$mnt" --log-file "$work/mount.log"
df -h "$mnt"
ls -l "$mnt" | head -4
echo "files on the mount: $(find "$mnt" -type f | wc -l)"

step "byte-for-byte: diff -r source mount"
diff -r "$work/src" "$mnt" && echo "identical"

step "read every file through the mount"
python - "$mnt" <<'PY'
import os, sys, time
root = sys.argv[1]
paths = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
start = time.monotonic()
total = sum(len(open(p, "rb").read()) for p in paths)
took = time.monotonic() - start
print(f"read {len(paths)} files, {total / 1e6:.1f} MB in {took:.2f} s ({len(paths) / took:,.0f} files/s)")
PY

step "dlfs umount $mnt"
dlfs umount "$mnt"

step "dlfs verify $work/dataset"
dlfs verify "$work/dataset"
