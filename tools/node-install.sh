#!/bin/sh
# Install dlfs on a node with no network, from the bundle this script lies in (make node-bundle;
# tools/node_bundle.py says what it holds): install.sh VENV, as root.
#
# The Debian packages the node lacks are installed (apt-get install --no-download, or dpkg -i where
# there is no apt); where they cannot be (dependencies the node does not meet, another release), or
# with DLFS_DEBS=extract (all of them, leaving the system as it is), they are unpacked with dpkg -x
# into VENV/dlfs-debs, and the builds find headers and libraries there (pyfuse3 and the C loops
# keep that folder in their library path); root mounts from there, while an ordinary user's mount
# needs the setuid fusermount3 that only the installed fuse3 package gives. Then the patched pyfuse3
# and dlfs are compiled with the node's compiler and installed into VENV, which is created if it
# does not exist: give the venv that already holds PyTorch to use dlfs.torch there. pip sees only
# the bundle's wheels.
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 VENV" >&2
    exit 2
fi
venv=$1
here=$(cd "$(dirname "$0")" && pwd)

missing=""
for deb in "$here"/debs/*.deb; do
    package=$(dpkg-deb --field "$deb" Package)
    if [ "${DLFS_DEBS:-}" = extract ] || ! dpkg-query --show --showformat='${Status}' "$package" 2>/dev/null \
        | grep -q "install ok installed"; then
        missing="$missing $deb"
    fi
done
if [ -n "$missing" ] && [ "${DLFS_DEBS:-}" != extract ]; then
    if command -v apt-get >/dev/null 2>&1; then
        # apt-get checks every dependency before dpkg changes anything, and fetches nothing.
        apt-get install -y -qq --no-download $missing >/dev/null && missing=""
    elif dpkg -i $missing >/dev/null; then
        missing=""
    else
        # dpkg leaves the packages whose dependencies it could not meet unpacked: removed again.
        dpkg --remove $(for deb in $missing; do dpkg-deb --field "$deb" Package; done) >/dev/null 2>&1 || true
    fi
fi
if [ -n "$missing" ]; then
    prefix="$venv/dlfs-debs"
    echo "unpacking Debian packages into $prefix (dpkg -x): the system is left as it is"
    mkdir -p "$prefix"
    for deb in $missing; do dpkg -x "$deb" "$prefix"; done
    lib="$prefix/usr/lib/$(uname -m)-linux-gnu"
    export PKG_CONFIG_PATH="$lib/pkgconfig:$prefix/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_SYSROOT_DIR="$prefix"
    export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LDFLAGS="-Wl,-rpath,$lib ${LDFLAGS:-}"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # the unpacked pkg-config's own
    export PATH="$prefix/usr/bin:$prefix/usr/sbin:$prefix/bin:$PATH"
fi

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS="$here/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
pyfuse3=$(ls "$here"/src/pyfuse3-*.tar.gz)
version=$(basename "$pyfuse3" .tar.gz)
SETUPTOOLS_SCM_PRETEND_VERSION=${version#pyfuse3-} "$venv/bin/python" -m pip install --quiet "$pyfuse3"
"$venv/bin/python" -m pip install --quiet "$(ls "$here"/src/dlfs_data-*.tar.gz)[mount]"
"$venv/bin/dlfs" --version
