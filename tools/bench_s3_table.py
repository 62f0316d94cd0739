"""The table of ``make bench-s3`` in docs/benchmarks.md, from the JSON ``tools/bench_s3.py`` writes:
beside the tool rather than in it, which is long enough with the measuring alone."""

from __future__ import annotations

from benchdoc import DASH, Json, number, ratio, table

TITLE = "A dataset in S3 against one object per file"


def render(slow: Json, fast: Json | None) -> list[str]:
    """The section of docs/benchmarks.md: the slow link, and the fast one where it was run too."""
    return [line for data in (slow, fast) if data for line in link(data)]


def link(data: Json) -> list[str]:
    """One link's part of the section: upload, epochs, the disk tier and where the CPU went."""
    o, r = data["options"], data["results"]
    ceiling = o["rate_mbit"] * 1e6 / 8 / (r["bytes"] / r["files"])
    out = [
        f"### {o['rate_mbit'] / 1000:g} Gbit/s and {o['rtt_ms']:g} ms",
        "",
        f"The link's own ceiling: {ceiling:,.0f} files/s of the mean size (before TCP's overhead); on "
        f"{r['cores']} cores, the S3 server, the proxy, the daemon and the readers share the CPU.",
        "",
    ]
    out += [
        f"{r['files']:,} JPEGs ({r['bytes'] / 1e9:.2f} GB) on a real S3 server (SeaweedFS) in a network "
        f"namespace behind a {o['rate_mbit']:g} Mbit/s `tbf` cap and a proxy adding {o['rtt_ms']:g} ms of "
        "round trip (`tools/netshape.py`), so loopback flatters neither side. *Objects*: one object "
        f"per file, PUT and GET by a pool of threads (the best of {', '.join(map(str, o['threads']))}). "
        f"Epochs: every file in the published order by {o['readers']} reader processes in batches of "
        f"{o['batch']}, through a fresh mount, page cache dropped first. One run.",
        "",
    ]
    up = r["upload"]
    rows = [
        [label, number(run["objects_per_s"]), number(run["mb_per_s"], 1), f"{run['seconds']:.1f}"]
        for label, run in (
            (f"objects ({up['objects']['threads']} threads)", up["objects"]),
            ("`dlfs pack` to the bucket", up["dlfs_pack"]),
        )
    ]
    out += ["Upload:", "", *table(["how", "files/s", "MB/s", "seconds"], rows), ""]
    epoch = r["epoch"]
    objects = epoch["objects"]
    rows = [
        [
            f"objects, GET per file ({objects['threads']} threads)",
            number(objects["objects_per_s"]),
            *[DASH] * 4,
        ]
    ]
    for mode in ("full", "block"):
        if mode not in epoch:
            continue
        run, local = epoch[mode]["dlfs_s3"], epoch[mode]["dlfs_local_cold"]
        rows.append(
            [
                f"dlfs mount of the bucket, `--order {mode}`",
                number(run["items_per_s"]),
                number(run["moved"]["store"]["requests"]),
                f"{run['rss_peak'] / 2**20:,.0f}",
                f"**{ratio(run['items_per_s'], objects['objects_per_s'])}**",
                ratio(run["items_per_s"], local["items_per_s"]),
            ]
        )
        rows.append(
            [f"dlfs mount of local shards, `--order {mode}`, cold", number(local["items_per_s"]), *[DASH] * 4]
        )
    budgets = epoch["full"]["budgets"]
    out += [
        "Epoch read (RSS: the daemon's peak, sampled every 0.1 s; its RAM cache may hold "
        f"{budgets['cache'] >> 20} MiB, `--ram-cache-size` plus the read-ahead's "
        f"{budgets['readahead'] >> 20} MiB):",
        "",
        *table(["reader", "files/s", "GETs", "RSS MiB", "vs objects", "vs local shards"], rows),
        "",
    ]
    tier = r["disk_tier"]
    first, second, local = tier["first_epoch"], tier["second_epoch"], tier["local_cold"]
    rows = [
        [
            "first (fills `--disk-tier`)",
            number(first["items_per_s"]),
            number(first["moved"]["store"]["bytes"] / 1e6),
        ],
        ["later, each after a remount", number(second["items_per_s"]), number(second["store_bytes"] / 1e6)],
        [f"local shards, cold (`--order {tier['order']}`)", number(local["items_per_s"]), DASH],
    ]
    hit, memcached = tier["hit_latency"], tier["memcached_get"]
    out += [
        f"The disk tier, `--order {tier['order']}`, page cache dropped before each epoch; the later "
        f"epochs and the local shards alternate, medians of {tier['repeat']}; later epochs / local "
        f"shards: **{ratio(second['items_per_s'], local['items_per_s'])}**:",
        "",
        *table(["epoch", "files/s", "MB from the store"], rows),
        "",
        f"A disk-tier hit of one file ({hit['mean_bytes'] / 1e3:.0f} KB mean, stored bytes read and "
        f"checksum verified, blocks in the page cache): p50 {hit['p50_us']:.0f} µs, "
        f"p99 {hit['p99_us']:.0f} µs; "
        f"a memcached GET of 110 KB on loopback: p50 {memcached['p50_us']:.0f} µs, "
        f"p99 {memcached['p99_us']:.0f} µs ({hit['samples']:,} of each).",
        "",
    ]
    return out + _s3_cpu(r)


def _s3_cpu(r: Json) -> list[str]:
    """Where the CPU went in each run of ``s3``: the S3 server and the proxy against the side
    measured, on a machine whose cores give at most their count times the wall time."""
    up, epoch, tier, cores = r["upload"], r["epoch"], r["disk_tier"], r["cores"]

    def mount(run: Json) -> str:
        return f"daemon {run['daemon_cpu_s']:.1f} + readers {run['reader_cpu_s']:.1f}"

    runs = [
        ("upload, objects", up["objects"]["cpu"], f"threads {up['objects']['cpu']['threads']:.1f}"),
        ("upload, `dlfs pack`", up["dlfs_pack"]["cpu"], f"pack {up['dlfs_pack']['cpu']['pack']:.1f}"),
        (
            "epoch, objects (GET per file)",
            epoch["objects"]["cpu"],
            f"threads {epoch['objects']['cpu']['threads']:.1f}",
        ),
        *[
            (
                f"epoch, mount of the bucket, `--order {mode}`",
                epoch[mode]["dlfs_s3"]["cpu"],
                mount(epoch[mode]["dlfs_s3"]),
            )
            for mode in ("full", "block")
            if mode in epoch
        ],
        ("first epoch into the disk tier", tier["first_epoch"]["cpu"], mount(tier["first_epoch"])),
    ]
    rows = [
        [
            label,
            f"{cpu['wall']:.1f}",
            f"{cpu['server']:.1f}",
            f"{cpu['proxy']:.1f}",
            side,
            f"{(cpu['server'] + cpu['proxy']) / (cores * cpu['wall']):.0%}",
        ]
        for label, cpu, side in runs
    ]
    header = ["run", "wall s", "S3 server CPU s", "proxy CPU s", "the side measured, CPU s", "server + proxy"]
    return [
        f"CPU seconds while each run lasted (`server + proxy`: their share of the {cores} cores' time):",
        "",
        *table(header, rows),
        "",
    ]
