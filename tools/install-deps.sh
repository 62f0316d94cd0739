#!/usr/bin/env bash
# Install the Debian packages dlfs needs (FUSE 3 runtime and headers, a compiler for pyfuse3 and
# the C loops, xxhash's and lz4's headers, python3-venv, squashfs tools for the benchmark peers,
# iproute2 and memcached for the S3 benchmarks, openssl for the tests' private CA, systemd for
# checking dlfs's unit, util-linux and strace for running the tests offline)
# when any is missing. Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail

missing=()
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || missing+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -e /usr/include/xxhash.h ] || missing+=(libxxhash-dev)  # for the C loops' checksums
[ -e /usr/include/lz4.h ] || missing+=(liblz4-dev)  # for dlfs/fuse/_server.c's lz4 files
# Pillow-SIMD (pack --transform's codec) is built from source against these.
[ -e /usr/include/jpeglib.h ] || missing+=(libjpeg-dev)
[ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    2>/dev/null || missing+=(python3-dev)
# The peers dlfs bench --peers measures against (ratarmount comes from PyPI with the bench extra).
command -v mksquashfs >/dev/null 2>&1 || missing+=(squashfs-tools)
command -v squashfuse_ll >/dev/null 2>&1 || missing+=(squashfuse)
# The S3 benchmarks: ip and tc shape the network to the server, memcached is a baseline.
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing+=(iproute2)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
# The tests make a private CA for the S3 server's HTTPS port.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The tests run in a network namespace with only loopback up (tools/loopback-only), and trace a
# command's connections with strace.
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v strace >/dev/null 2>&1 || missing+=(strace)
# The archive tests compare dlfs pack of a zip with what Info-ZIP's unzip extracts, and of tars
# written by bsdtar (libarchive) with what tar x extracts.
command -v zip >/dev/null 2>&1 || missing+=(zip)
command -v unzip >/dev/null 2>&1 || missing+=(unzip)
command -v bsdtar >/dev/null 2>&1 || missing+=(libarchive-tools)
# ... and with the compressors whose tars they read.
command -v zstd >/dev/null 2>&1 || missing+=(zstd)
command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
command -v bzip2 >/dev/null 2>&1 || missing+=(bzip2)
# The tests check the systemd unit dlfs@.service with systemd-analyze verify.
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# Another apt (unattended-upgrades on a fresh machine) may hold the lock: wait for it, within a
# bound; apt says what it waits for.
lock_wait=(-o DPkg::Lock::Timeout=300)
$sudo apt-get "${lock_wait[@]}" update -qq
$sudo apt-get "${lock_wait[@]}" install -y -qq "${missing[@]}" >/dev/null
