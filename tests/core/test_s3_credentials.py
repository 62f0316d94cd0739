"""Reaching a bucket: credentials from the environment, a profile or a ``credential_process``
(renewed before they expire), never the instance metadata service; a private CA trusted where
``AWS_CA_BUNDLE`` or the profile names it; and a one-line error for each wrong setting."""

from __future__ import annotations

import datetime
import socket
import subprocess
import time
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from trees import SMALL_SHARD
from waits import bound

from dlfs.core import format as fmt
from dlfs.core.store.s3 import settings as s3_settings
from dlfs.core.store.s3.store import S3Store
from dlfs.pack import PackOptions, pack

pytestmark = pytest.mark.timeout(120)


def test_wrong_bucket_credentials_or_endpoint_are_one_line_errors(
    packed: Path, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_one_line_error(
        dlfs("info", "s3://no-such-bucket-here/x", check=False), "bucket no-such-bucket-here"
    )
    assert_one_line_error(dlfs("ls", f"{s3}/nothing", check=False), "not a dlfs dataset", "dlfs pack")
    assert_one_line_error(dlfs("info", "s3:///x", check=False), "s3://BUCKET")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    result = dlfs(
        "info", f"{s3}/x", "--endpoint-url", f"http://127.0.0.1:{port}", "--store-timeout", "2", check=False
    )
    assert_one_line_error(result, "no answer from", f"127.0.0.1:{port}")
    assert time.monotonic() - started < bound(30)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = dlfs("info", f"{s3}/x", check=False)
    assert_one_line_error(result, "access denied", "credentials")
    assert "not-the-secret" not in result.stderr
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert_one_line_error(dlfs("info", f"{s3}/x", check=False), "no AWS credentials")


def test_without_credentials_no_request_goes_to_the_instance_metadata_service(
    s3: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """botocore's chain asks 169.254.169.254 for an instance role when no credentials are set: right
    on EC2, a packet off the machine in a test. Every connect() the command makes is traced."""
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    trace = tmp_path / "connects"
    command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *DLFS, "-q", "info", f"{s3}/x"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(result, "no AWS credentials")
    assert "169.254.169.254" not in trace.read_text()


def _without_key_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)


def test_credentials_come_from_a_profile(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/profiled"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[work]\naws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n"
    )
    _without_key_variables(monkeypatch)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert "dataset_id:" in dlfs("info", url).stdout


def test_temporary_credentials_are_renewed_while_the_store_is_in_use(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``credential_process`` hands out credentials that expire within minutes: botocore runs it
    again before they do, and the store asks for them on its requests."""
    url = f"{s3}/renewed"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    calls = tmp_path / "calls"
    process = tmp_path / "credential-process"
    process.write_text(
        "#!/bin/sh\n"
        f"echo call >> {calls}\n"
        'expires=$(date -u -d "+2 minutes" +%Y-%m-%dT%H:%M:%SZ)\n'
        f'echo "{{\\"Version\\": 1, \\"AccessKeyId\\": \\"{s3_server.access_key}\\", '
        f'\\"SecretAccessKey\\": \\"{s3_server.secret_key}\\", \\"Expiration\\": \\"$expires\\"}}"\n'
    )
    process.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(f"[profile temporary]\ncredential_process = {process}\n")
    _without_key_variables(monkeypatch)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "temporary")
    monkeypatch.setattr(s3_settings, "CREDENTIALS_TTL", datetime.timedelta(0))  # asked on every request
    store = S3Store(url)
    for _ in range(3):
        assert store.read(fmt.INDEX_NAME, 0, 8) == fmt.INDEX_MAGIC
    assert len(calls.read_text().splitlines()) >= 3


# An on-premises store (Ceph RGW, MinIO) often has a certificate from a private CA: dlfs trusts the
# CA that AWS_CA_BUNDLE or the profile's ca_bundle names, as the AWS CLI does.


def test_an_untrusted_certificate_is_a_one_line_error_that_says_what_to_set(
    s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    result = dlfs("ls", f"{s3}/tls", check=False)
    assert_one_line_error(result, "not trusted", "UnknownIssuer", "AWS_CA_BUNDLE", s3_server.https_endpoint)


def test_the_ca_named_by_aws_ca_bundle_is_trusted(
    odd_tree: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/tls"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(s3_server.tls.ca))
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))
    assert "OK: checked" in dlfs("verify", url).stdout  # every byte read back over HTTPS


def test_the_ca_named_by_the_profiles_ca_bundle_is_trusted(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/tls"
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))  # over plain HTTP
    listing = dlfs("ls", "-R", url).stdout
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nca_bundle = {s3_server.tls.ca}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    assert dlfs("ls", "-R", url).stdout == listing


def test_an_unusable_ca_bundle_is_a_one_line_error(
    tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    not_pem, bad_pem = tmp_path / "not.pem", tmp_path / "bad.pem"
    not_pem.write_text("[default]\n")
    bad_pem.write_text("-----BEGIN CERTIFICATE-----\nZm9v\n-----END CERTIFICATE-----\n")
    unusable = (
        (tmp_path / "gone.pem", "cannot read the CA bundle"),
        (not_pem, "no PEM"),
        (bad_pem, "cannot be used (BadEncoding)"),
    )
    for bundle, complaint in unusable:
        monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
        assert_one_line_error(dlfs("ls", f"{s3}/tls", check=False), complaint, str(bundle))
