"""Uploads every file of a checkpoint directory to an S3 endpoint (single PUTs):

    bench/upload_checkpoint.py DIR BUCKET PREFIX ENDPOINT_URL

Creates the bucket; used by bench/s3.sh and bench/s3_headers.sh against moto (scripts/s3-server.sh)."""
import os
import sys

import boto3
from boto3.s3.transfer import TransferConfig

d, bucket, prefix, url = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
s3.create_bucket(Bucket=bucket)
tc = TransferConfig(multipart_threshold=5 << 30)  # single PUTs: one object, one ETag without a part count
for f in sorted(os.listdir(d)):
    s3.upload_file(os.path.join(d, f), bucket, prefix + f, Config=tc)
