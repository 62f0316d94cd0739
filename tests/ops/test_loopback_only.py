"""The test suite runs where no packet can leave the machine (``make test`` starts it through
``tools/loopback-only``): a test that reaches past loopback fails there instead of sending traffic.
Checked from the namespace's own tables, which sends nothing."""

from __future__ import annotations

import os
from pathlib import Path


def _interfaces() -> set[str]:
    """The network interfaces of this process's namespace (``/sys/class/net`` shows the namespace
    that mounted sysfs instead)."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines}


def test_the_suite_has_no_network_interface_but_loopback() -> None:
    assert _interfaces() == {"lo"}, (
        "the tests must run where only loopback is up: run them with make test, or "
        f"tools/loopback-only pytest (interfaces here: {sorted(_interfaces())})"
    )
    ipv4_routes = Path("/proc/self/net/route").read_text().splitlines()[1:]
    assert ipv4_routes == []
    ipv6_devices = {line.split()[-1] for line in Path("/proc/self/net/ipv6_route").read_text().splitlines()}
    assert ipv6_devices <= {"lo"}, ipv6_devices


def test_no_process_asks_the_cloud_instance_metadata_service() -> None:
    """botocore, and any cloud SDK dlfs uses, skips the metadata address when this is set."""
    assert os.environ.get("AWS_EC2_METADATA_DISABLED") == "true"
