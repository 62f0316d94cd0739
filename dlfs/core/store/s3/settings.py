"""How to reach a bucket, found the standard AWS way: boto3's session reads the environment,
profiles, ``~/.aws/config`` and ``credentials``, SSO and instance roles, so dlfs reaches whatever
the AWS CLI reaches. ``--endpoint-url`` comes first.

obstore is handed the credentials through ``Credentials`` and asks for them again every
``CREDENTIALS_TTL``; botocore renews temporary ones before they expire, so a job outlives its
first session token. Credentials never reach a log line or an error message.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

from dlfs.core.errors import StoreError
from dlfs.core.store.interface import StoreOptions

#: How long obstore keeps the credentials it was given before asking boto3 again (boto3 renews
#: temporary credentials some minutes before they expire).
CREDENTIALS_TTL = datetime.timedelta(seconds=60)
_AWS_HOST = re.compile(r"(^|\.)amazonaws\.com(\.cn)?$")


class AwsSettings(NamedTuple):
    endpoint: str
    region: str
    session: Any  # a boto3 Session, whose type is made at runtime
    credentials: Any  # botocore's, which renew themselves
    #: A PEM file of CA certificates to trust beside the system's (None: the system's alone).
    ca_bundle: str | None

    def is_aws(self) -> bool:
        """AWS itself, for which obstore builds the regional endpoint from the region."""
        return bool(_AWS_HOST.search(urlparse(self.endpoint).hostname or ""))


def aws_settings(options: StoreOptions, url: str) -> AwsSettings:
    """What the AWS CLI would use to reach ``url``, ``--endpoint-url`` first."""
    import boto3
    import botocore.exceptions
    import botocore.session

    try:
        core = botocore.session.get_session()
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
        session = boto3.Session(botocore_session=core)
        credentials = session.get_credentials()
        region = session.region_name or "us-east-1"
        endpoint = options.endpoint_url or session.client("s3", region_name=region).meta.endpoint_url
        ca_bundle = core.get_config_variable("ca_bundle")  # AWS_CA_BUNDLE, else the profile's
    except botocore.exceptions.BotoCoreError as exc:
        raise StoreError(f"cannot set up access to {url}: {exc}") from None
    if credentials is None:
        raise StoreError(
            f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE with ~/.aws/credentials"
        )
    return AwsSettings(endpoint.rstrip("/"), region, session, credentials, ca_bundle)


def parse_timestamp(text: str) -> datetime.datetime:
    """A timestamp in a response: S3's ISO 8601 by the standard library, anything else by botocore,
    whose own parser (dateutil) takes most of the CPU of a listing (docs/design.md)."""
    import botocore.utils

    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return botocore.utils.parse_timestamp(text)


class Credentials:
    """boto3's credentials, handed to obstore on request (an ``S3CredentialProvider``)."""

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def __call__(self) -> dict[str, Any]:
        frozen = self._credentials.get_frozen_credentials()  # renewed by botocore when near expiry
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.datetime.now(datetime.UTC) + CREDENTIALS_TTL,
        }


def read_ca_bundle(path: str) -> bytes:
    """The CA bundle's certificates, trusted beside the system's roots as botocore trusts them
    for boto3's own calls."""
    try:
        pem = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise StoreError(
            f"cannot read the CA bundle {path} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config): {exc.strerror}"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise StoreError(
            f"the CA bundle {path} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config) holds no PEM certificate"
        )
    return pem
