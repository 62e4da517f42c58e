"""Checks the S3 test servers (scripts/s3-server.sh: moto with IAM auth on HTTP,
nginx in front of the same moto on HTTPS) against botocore, an independent
signer: requests boto3 signs with the right secret are accepted (HTTP and HTTPS,
path-style, keys with spaces and '+', paginated listings under a prefix that holds
'/', range GETs), with a wrong secret rejected with 403 SignatureDoesNotMatch, and
both endpoints front one store (an object put over HTTP reads back over HTTPS).
Uses SLUICE_S3_ENDPOINT / SLUICE_S3_HTTPS_ENDPOINT and the AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY pair, or starts the servers with scripts/s3-server.sh."""
import os
import subprocess
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
if not os.environ.get("SLUICE_S3_ENDPOINT"):
    out = subprocess.run([os.path.join(root, "scripts", "s3-server.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        os.environ[k] = v


def client(endpoint, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=secret,
                        region_name="us-east-1", verify=os.environ.get("SLUICE_S3_CA_BUNDLE"),
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


failures = 0
for n, endpoint in enumerate((os.environ["SLUICE_S3_ENDPOINT"], os.environ.get("SLUICE_S3_HTTPS_ENDPOINT"))):
    if not endpoint:
        continue
    good = client(endpoint, os.environ["AWS_SECRET_ACCESS_KEY"])
    bucket = f"botocore-check-{os.getpid()}-{n}"
    good.create_bucket(Bucket=bucket)
    body = bytes(range(256)) * 64
    for key in ("plain.bin", "dir/with space+plus (1).bin"):
        good.put_object(Bucket=bucket, Key=key, Body=body)
        got = good.get_object(Bucket=bucket, Key=key, Range="bytes=100-199")["Body"].read()
        assert got == body[100:200], f"range GET through the verifier returned wrong bytes for {key!r}"
        assert good.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(body)
    for i in range(5):
        good.put_object(Bucket=bucket, Key=f"many/{i:03d}", Body=b"x")
    pages = good.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="many/", PaginationConfig={"PageSize": 2})
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert keys == [f"many/{i:03d}" for i in range(5)], keys

    bad = client(endpoint, "not-the-secret")
    for what, call in (("GET", lambda: bad.get_object(Bucket=bucket, Key="plain.bin")),
                       ("ListObjectsV2", lambda: bad.list_objects_v2(Bucket=bucket, Prefix="many/")),
                       ("PUT", lambda: bad.put_object(Bucket=bucket, Key="x", Body=b"abc"))):
        try:
            call()
            print(f"FAIL: {endpoint}: {what} with a wrong secret was accepted")
            failures += 1
        except ClientError as e:
            code = e.response["Error"]["Code"]
            status = e.response["ResponseMetadata"]["HTTPStatusCode"]
            if code != "SignatureDoesNotMatch" or status != 403:
                print(f"FAIL: {endpoint}: {what} with a wrong secret gave {status} {code}, not 403 SignatureDoesNotMatch")
                failures += 1
    print(f"{endpoint}: botocore-signed requests accepted, wrong secret rejected with 403")

# One store behind both endpoints: put over HTTP, read back over HTTPS.
https = os.environ.get("SLUICE_S3_HTTPS_ENDPOINT")
if not https:
    print("FAIL: no HTTPS endpoint")
    failures += 1
else:
    plain, tls = client(os.environ["SLUICE_S3_ENDPOINT"], os.environ["AWS_SECRET_ACCESS_KEY"]), \
        client(https, os.environ["AWS_SECRET_ACCESS_KEY"])
    bucket = f"one-store-{os.getpid()}"
    plain.create_bucket(Bucket=bucket)
    plain.put_object(Bucket=bucket, Key="p/q/over-http", Body=b"one store" * 1000)
    got = tls.get_object(Bucket=bucket, Key="p/q/over-http")["Body"].read()
    if got != b"one store" * 1000:
        print("FAIL: an object put over HTTP did not read back over HTTPS")
        failures += 1
    else:
        print("an object put over HTTP reads back over HTTPS")
print("s3 servers: passed" if not failures else "s3 servers: FAILED")
sys.exit(1 if failures else 0)
