#!/usr/bin/python3
"""Checks the SigV4-verifying s3rver (tests/support/s3rver_verify.js) against
botocore, an independent signer: requests boto3 signs with the right secret are
accepted (HTTP and HTTPS, path-style, keys with spaces and '+', paginated
listings, range GETs), and with a wrong secret rejected with
SignatureDoesNotMatch. Uses SLUICE_S3_ENDPOINT / SLUICE_S3_HTTPS_ENDPOINT, or
starts the servers with scripts/s3-server.sh. Exit 77 = skipped (no boto3)."""
import os
import subprocess
import sys

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError:
    print("SKIPPED: /usr/bin/python3 has no boto3 (install python3-boto3)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
if not os.environ.get("SLUICE_S3_ENDPOINT"):
    out = subprocess.run([os.path.join(root, "scripts", "s3-server.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        k, _, v = line.removeprefix("export ").partition("=")
        os.environ[k] = v


def client(endpoint, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="S3RVER", aws_secret_access_key=secret,
                        region_name="us-east-1", verify=os.environ.get("SLUICE_S3_CA_BUNDLE"),
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


failures = 0
for n, endpoint in enumerate((os.environ["SLUICE_S3_ENDPOINT"], os.environ.get("SLUICE_S3_HTTPS_ENDPOINT"))):
    if not endpoint:
        continue
    good = client(endpoint, "S3RVER")
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
            if code != "SignatureDoesNotMatch":
                print(f"FAIL: {endpoint}: {what} with a wrong secret gave {code}, not SignatureDoesNotMatch")
                failures += 1
    print(f"{endpoint}: botocore-signed requests accepted, wrong secret rejected")
sys.exit(1 if failures else 0)
