"""obstore's errors as one line that says what to do.

obstore raises a type per kind of failure where ``object_store`` has one: ``FileNotFoundError``
for a 404, ``PermissionDeniedError`` and ``UnauthenticatedError`` for a refusal. A listing's
failures, a connection that fails and a certificate that is not trusted all come as
``GenericError``, and the error's text (the whole HTTP exchange, many lines) is what tells them
apart. The text this module reads is of two kinds:

- the S3 error code of the response's XML body (``<Code>NoSuchBucket</Code>``): the S3 protocol's,
  the same on every S3 implementation and every client;
- obstore's own words, from reqwest and rustls: ``NO_ANSWER`` and ``UNTRUSTED``. A test
  (``tests/core/test_s3_stalls.py``) produces each of them with the installed obstore and fails
  when one changes.

The listing of a prefix's objects goes through boto3 (``S3Store.objects``), whose errors carry the
S3 error code in ``response`` and botocore's own words for a request that got no answer.
"""

from __future__ import annotations

import re

#: The S3 error code in the response body that obstore quotes.
S3_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
#: S3 error codes that mean the credentials were refused.
DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
#: reqwest's and botocore's words for a request that got no answer: no connection, or one that
#: stalled (the request, or a response body that stopped coming).
NO_ANSWER = re.compile(
    r"error sending request|kind: Timeout"
    r"|Could not connect to the endpoint URL|(Read|Connect) timeout on endpoint"
)
#: rustls's reason for refusing a certificate (UnknownIssuer, BadEncoding, ...), in obstore's text:
#: the server's certificate, or one of the CA bundle's.
UNTRUSTED = re.compile(r"InvalidCertificate\(\s*(\w+)")


def explain(what: str, exc: Exception, endpoint: str, bucket: str) -> str:
    """``exc``, raised while doing ``what`` against ``bucket`` at ``endpoint``, as one line."""
    import obstore.exceptions as obe

    text = str(exc)
    match = S3_CODE.search(text)
    code = match.group(1) if match else getattr(exc, "response", {}).get("Error", {}).get("Code")
    if code == "NoSuchBucket":
        return _no_bucket(bucket, endpoint)
    if isinstance(exc, FileNotFoundError):
        return f"{what}: no such object"
    if isinstance(exc, obe.PreconditionError):  # a GET of one version (If-Match) of an object
        return f"{what}: the object has changed since it was indexed; re-run dlfs pack --in-place"
    untrusted = UNTRUSTED.search(text)
    if untrusted:
        return (
            f"{what}: the TLS certificate of {endpoint} is not trusted ({untrusted.group(1)}); "
            "name the certificate of the CA that signed it in AWS_CA_BUNDLE or ca_bundle in ~/.aws/config"
        )
    if code in DENIED or isinstance(exc, obe.PermissionDeniedError | obe.UnauthenticatedError):
        return (
            f"{what}: access denied by {endpoint} ({code or 'HTTP 403'}); check the credentials "
            "(AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws/credentials) and the bucket's permissions"
        )
    if NO_ANSWER.search(text):
        return f"{what}: no answer from {endpoint} (after retries); check --endpoint-url and the network"
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"{what}: {first[:300]}"


def _no_bucket(bucket: str, endpoint: str) -> str:
    return f"bucket {bucket} does not exist at {endpoint}; create it or fix the URL"


def setup_error(exc: Exception, url: str, ca_bundle: str | None) -> str:
    """obstore's refusal of the client's settings as one line: of those, the CA bundle is the one a
    user gives whose content can be wrong (a certificate that does not decode)."""
    unusable = UNTRUSTED.search(str(exc))
    if unusable and ca_bundle:
        return (
            f"the CA bundle {ca_bundle} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config) holds a "
            f"certificate that cannot be used ({unusable.group(1)})"
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"cannot set up access to {url}: {first[:300]}"
