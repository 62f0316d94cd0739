"""The tests' S3: a real server's environment for this process and the CLIs it starts, TLS as an
operator sets it up, and what a test asks the server about a prefix."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from seaweed import SeaweedServer, Tls

TEST_BUCKET = "dlfs-tests"


def make_tls(directory: Path, ip: str = "127.0.0.1") -> Tls:
    """A private CA and a certificate it signed for ``ip`` (openssl, as an operator would)."""
    names = ("ca.pem", "ca.key", "s3.pem", "s3.key", "s3.csr", "s3.cnf")
    ca, ca_key, cert, key, request, extensions = (directory / name for name in names)
    extensions.write_text(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n")
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *new_key, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=dlfs test CA"],
        ["req", *new_key, "-keyout", key, "-out", request, "-subj", f"/CN={ip}"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-out", cert, "-days", "2",
         "-extfile", extensions],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True, timeout=60)
    return Tls(cert, key, ca)


def use_s3(server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point the AWS environment (this process and the CLIs it starts) at ``server``; a fresh
    prefix's URL in its one bucket (SeaweedFS gives each bucket volumes of its own, and runs out of
    them after a few). Index copies go under ``tmp_path``, not the user's cache."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    if not server.client().list_buckets()["Buckets"]:
        server.create_bucket(TEST_BUCKET)
    return f"s3://{TEST_BUCKET}/{uuid.uuid4().hex[:16]}"


def split(url: str) -> tuple[str, str]:
    """(bucket, prefix) of an ``s3://`` URL."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def objects(server: SeaweedServer, url: str) -> list[str]:
    """Keys under ``url``, relative to it."""
    bucket, prefix = split(url)
    listing = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(item["Key"].removeprefix(prefix + "/") for item in listing.get("Contents", []))


def open_uploads(server: SeaweedServer, url: str) -> list[str]:
    """Keys of the multipart uploads under ``url`` begun and neither completed nor aborted."""
    bucket, prefix = split(url)
    uploads = server.client().list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])
    return [upload["Key"] for upload in uploads]
