"""Where model folders come from: local folders and object storage (`s3://`, `gs://`, `as://`)."""
