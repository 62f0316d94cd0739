"""A dataset in an S3-compatible bucket (AWS, Ceph RGW, SeaweedFS, MinIO): ``s3://bucket/prefix``.

The client is obstore (Rust's ``object_store``): its blocking calls release the GIL, so the mount's
storage threads and the read-ahead's batches each keep a ranged GET in flight at once, and it
retries transient failures (5xx, resets, timeouts) with jittered exponential backoff.

One module per concern: ``location`` parses the URL, ``settings`` finds endpoint, region,
credentials and CA bundle the AWS way, ``obstore_errors`` turns obstore's errors into one line,
``hints`` keeps the GETs started ahead of their reads, ``uploads`` streams shards up as multipart
uploads, and ``store`` assembles them into ``S3Store``. Import each from its module: this package
loads nothing, so that telling an ``s3://`` location apart (``location``) costs no S3 client.
"""
