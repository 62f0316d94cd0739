"""Where a dataset in a bucket is: ``s3://BUCKET/PREFIX``."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from dlfs.core.errors import DatasetError

SCHEME = "s3://"


def is_s3(location: object) -> bool:
    return isinstance(location, str) and location.startswith(SCHEME)


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Location:
        parsed = urlparse(url)
        bucket, prefix = parsed.netloc, parsed.path.strip("/")
        if parsed.scheme != "s3" or not bucket or parsed.query or parsed.fragment:
            raise DatasetError(f"{url} is not an S3 location; write s3://BUCKET or s3://BUCKET/PREFIX")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"
