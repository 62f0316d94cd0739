# dlfs developer entry points. `make demo` and `make test` work on a fresh Debian machine as root.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install install-system wheels node-bundle test test-stress test-all soak demo lint format bench bench-scale bench-pack bench-read bench-jobs bench-train bench-loader bench-s3 bench-transform bench-bigindex bench-packmem bench-archive bench-node bench-report clean

# C loops loaded with ctypes: the read-ahead's (dlfs/readahead/_push.c), the directory listings'
# (dlfs/fuse/_dirents.c) and the native request server's (dlfs/fuse/_server.c). Without them dlfs
# does the same work in Python and numpy, slower. setup.py says how each is built: pip builds them
# (in place for `pip install -e`, into the wheel otherwise), and the rule below again after an edit.
NATIVE := dlfs/readahead/_push.so dlfs/fuse/_dirents.so dlfs/fuse/_server.so dlfs/pack/archive/_tarscan.so
NATIVE_SOURCES := dlfs/readahead/_push.c dlfs/fuse/_dirents.c dlfs/fuse/_dirents.h dlfs/fuse/_entry.h \
	dlfs/fuse/_server.c dlfs/fuse/_handlers.c dlfs/fuse/_handlers.h dlfs/fuse/_buffer.h dlfs/core/_pagecache.h \
	dlfs/pack/archive/_tarscan.c

# The checkout's venv with every extra: the FUSE daemon's (mount), s3, zstd, gzip, torch, bench, and the
# tests' and benchmarks' tooling (test). It changes nothing outside the checkout.
install: $(STAMP) $(NATIVE)

$(STAMP): pyproject.toml tools/install-deps.sh tools/build_pyfuse3.py
	tools/install-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python tools/build_pyfuse3.py
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[mount,s3,zstd,gzip,torch,bench,test]'
	touch $@

# Only when asked, as root: the system's places for dlfs (README, Operations), /usr/local/bin/dlfs,
# the mount helper /sbin/mount.fuse.dlfs and the systemd unit dlfs@.service, linked to this
# checkout's venv (a link to another install that still exists is left as it is). Every user must
# be able to reach the venv's Python for the links to work for them.
install-system: install
	$(BIN)/dlfs install-system --keep-links

$(NATIVE) &: setup.py $(NATIVE_SOURCES) | $(STAMP)
	$(BIN)/python setup.py --quiet build_ext --inplace --force

# Wheels for nodes that are not a checkout (README, Operations): dlfs's, with its C loops, and the
# pyfuse3 build it pins; a node installs them with pip install --find-links dist 'dlfs-data[mount]',
# no compiler needed, and a trainer's image installs dlfs's alone (dlfs.torch needs no FUSE).
# setuptools builds in build/ and never removes a module that has left the package: cleared first.
wheels: $(STAMP)
	$(BIN)/python tools/build_pyfuse3.py --wheel-dir dist
	rm -rf build/lib.* build/bdist.*
	$(BIN)/pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir dist .

# dist/node/: what a bare Debian node installs dlfs from with no network, for Python 3.11 and 3.12
# (tools/node_bundle.py says what it holds; dist/node/install.sh VENV installs it). The tests
# install from it too: they run without a network, so it is made before them.
node-bundle: $(STAMP)
	$(BIN)/python tools/node_bundle.py --out dist/node
test: node-bundle

# Pillow-SIMD, the codec of dlfs pack --transform (dlfs/pack/images.py): twice Pillow's speed on
# the resize, in a folder of its own because torchvision needs Pillow itself; AVX2 where the CPU
# has it (pip builds it from source: libjpeg-dev and zlib1g-dev come from install-deps.sh).
CODECS := $(VENV)/dlfs-codecs/PIL
install: $(CODECS)
$(CODECS): | $(STAMP)
	CC="cc $$(grep -qw avx2 /proc/cpuinfo && echo -mavx2)" $(BIN)/pip install --quiet \
		--disable-pip-version-check --no-deps --target $(VENV)/dlfs-codecs 'pillow-simd==12.1.1.post0'

# The suite runs where only loopback is up (tools/loopback-only): no test can reach past this machine.
# make test leaves the sweeps and scale runs (the slow marker) to make test-all, and names its 20
# slowest tests.
PYTEST := env AWS_EC2_METADATA_DISABLED=true tools/loopback-only $(BIN)/pytest
test: install
	$(BIN)/ruff check dlfs tests tools
	$(PYTEST) -m "not slow" --durations=20

# make test under load: the same suite with two processes burning CPU beside it for the whole run
# (tools/beside-cpu-burners), so that a test which holds only on an idle machine fails here first.
test-stress: install node-bundle
	$(BIN)/ruff check dlfs tests tools
	tools/beside-cpu-burners 2 $(PYTEST) -m "not slow" --durations=20

test-all: install node-bundle
	$(BIN)/ruff check dlfs tests tools
	$(PYTEST) --durations=20

# The soak test for 10 minutes instead of make test's 60 s (tests/fuse/test_soak.py): 64 readers on one
# mount; prints files and bytes verified, read latency p50/p99/p99.9, peak RSS, descriptors, threads.
SOAK_SECONDS ?= 600
soak: install
	DLFS_SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/pytest tests/fuse/test_soak.py

demo: install
	PATH="$(CURDIR)/$(BIN):$$PATH" tools/demo.sh

lint: install
	$(BIN)/ruff check dlfs tests tools
	$(BIN)/ruff format --check dlfs tests tools

format: install
	$(BIN)/ruff format dlfs tests tools
	$(BIN)/ruff check --fix dlfs tests tools

# Every benchmark writes its raw JSON (and plots) into docs/; bench-report turns them into docs/benchmarks.md.
# Data is generated under bench-data/ on first use.
# The metadata benchmark at ImageNet's 1.28 M files (takes a few minutes, needs ~6 GB of disk).
bench-scale: install
	$(BIN)/python tools/bench_scale.py --files 1281167 --readdirplus always --json > docs/bench-scale-always.json
	$(BIN)/python tools/bench_scale.py --files 1281167 --readdirplus auto --reuse-dataset --json \
		> docs/bench-scale-auto.json

# Pack speed against tar cf on the same tree, in one run.
bench-pack: install
	$(BIN)/python tools/bench_pack.py --json > docs/bench-pack.json

# Reading in the published order: native vs dlfs with and without read-ahead, warm and cold.
bench-read: install
	$(BIN)/python tools/bench_read.py --json > docs/bench-read.json

# dlfs bench --peers on the 20k-JPEG tree of bench-read: native, dlfs, squashfuse_ll, ratarmount.
JOBS_TREE := bench-data/read
BENCH_JOBS := $(BIN)/dlfs bench $(JOBS_TREE)/src --peers --work bench-data/peers \
	--job scan,readdir,stat,seqread,randread,orderread --readers 8 --repeat 3 --json
$(JOBS_TREE)/generated-20000-100-jpeg: | install
	rm -rf $(JOBS_TREE)
	$(BIN)/python tools/make_imagenet_like.py $(JOBS_TREE)/src --files 20000 --classes 100 --payload jpeg
	touch $@

bench-jobs: install $(JOBS_TREE)/generated-20000-100-jpeg
	$(BENCH_JOBS) --plot docs/bench-jobs-warm.png > docs/bench-jobs-warm.json
	$(BENCH_JOBS) --cold --plot docs/bench-jobs-cold.png > docs/bench-jobs-cold.json

# One ImageFolder epoch from a throttled disk: native tree vs dlfs (block and full order).
bench-train: install
	$(BIN)/python tools/bench_train.py --window 4096 64 --json > docs/bench-train.json

# An unmodified training job (default loader, shuffle=True or the published order), fresh mounts:
# native, squashfuse_ll, dlfs, dlfs with Python answering every request; warm and cold.
bench-loader: install
	$(BIN)/python tools/bench_loader.py --json > docs/bench-loader.json
	$(BIN)/python tools/bench_loader.py --job shuffleload --temperatures warm --readers 1 4 16 --repeat 1 \
		--json > docs/bench-loader-scaling.json

# dlfs over a real S3 server behind a shaped network against one object per file: a 1 Gbit/s link
# with 10 ms of round trip, then a faster link with S3's own first-byte latency.
bench-s3: install
	$(BIN)/python tools/bench_s3.py --json > docs/bench-s3.json
	$(BIN)/python tools/bench_s3.py --rate-mbit 5000 --rtt-ms 30 --json > docs/bench-s3-fast.json

# Pack-time resize: bytes and pack time, then ImageFolder epochs over native, plain and resized.
bench-transform: install
	$(BIN)/python tools/bench_transform.py --spec resize:256 resize:256,quality=75 --repeat 5 --json \
		> docs/bench-transform.json

# An index of 14.2 M files (ImageNet-21k's shape, synthesised): mount time, daemon RSS, stat latency.
bench-bigindex: install
	$(BIN)/python tools/bench_bigindex.py --json > docs/bench-bigindex.json

# pack's peak RSS at 1.28 M and 14.2 M files (a mount of bench-bigindex's datasets, packed again).
bench-packmem: install
	$(BIN)/python tools/bench_packmem.py --json > docs/bench-packmem.json

# Archives as sources, ImageNet's train tar (a tar of class tars, 20k real JPEGs) first: packed, against cat and
# tar x + pack; indexed in place, against cat and ratarmount --recursive; read in place, against packed and
# ratarmount; a .tar.gz and a .zip packed, against tar xzf and unzip (tools/bench_archive.py; about 15 min).
# Then, at bench-s3's network shape: an S3 prefix of one object per file packed, against the best pool of
# plain GETs; WebDataset shards in S3 served in place, against the same files packed. Last, a tar of
# ImageNet's member count (1.28 M small members) indexed in place, against ratarmount.
bench-archive: install
	$(BIN)/python tools/bench_archive.py --json > docs/bench-archive.json
	$(BIN)/python tools/bench_s3_source.py --json > docs/bench-archive-s3-source.json
	$(BIN)/python tools/bench_s3_in_place.py --json > docs/bench-archive-s3-in-place.json
	$(BIN)/python tools/bench_index_scale.py --json > docs/bench-archive-scale.json

# A GPU node's data path in one command, data generated included (tools/bench_node.py): run on the node
# itself, so not part of `make bench`; `tools/bench_node.py --small` runs every part on a small machine.
bench-node: install
	$(BIN)/python tools/bench_node.py --out docs/bench-node.json

# docs/benchmarks.md, generated from the JSON above (never edited by hand); `make bench` runs it last.
bench-report: install
	$(BIN)/python tools/bench_report.py

bench: bench-scale bench-pack bench-read bench-jobs bench-train bench-loader bench-s3 bench-transform bench-bigindex \
		bench-packmem bench-archive
	$(MAKE) bench-report

clean:
	rm -rf $(VENV) $(NATIVE) dist demo-data bench-data .pytest_cache .ruff_cache .hypothesis
