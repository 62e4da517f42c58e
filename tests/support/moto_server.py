"""The S3 test server: moto's server with SigV4 checked, on loopback.

    python moto_server.py --state FILE [--port N]

Started by scripts/s3-server.sh (through the project's Python environment). It
serves HTTP on 127.0.0.1 (an ephemeral port unless --port), turns on moto's IAM
authentication, creates one IAM user with an allow-all policy and an access key
through the unauthenticated calls moto allows first, and then writes
{"http_port", "pid", "access_key_id", "secret_access_key"} to FILE (atomically).
From then on every request must carry a valid SigV4 signature for that key: a
wrong secret gets 403 SignatureDoesNotMatch. SIGTERM or SIGINT stops it.

One correction to moto, and why it is moto's and not the client's: moto hands
botocore the request's URI with its query already percent-decoded (a listing's
`prefix=models%2F` arrives as `prefix=models/`), and botocore's URL form of the
canonical query keeps the parts as they are. AWS's rule (SigV4, "create a
canonical request": URI-encode each query name and value, '/' as %2F) is what
sluice and botocore sign, so every listing whose prefix holds a '/' would fail
here and nowhere else. The patch re-encodes the query's names and values by
that rule before moto computes its signature; nothing else of the check changes.
"""
import argparse
import json
import logging
import os
import signal
import sys
import threading
from urllib.parse import quote, unquote

NO_AUTH_CALLS = 3  # create_user, put_user_policy, create_access_key
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(NO_AUTH_CALLS)  # read when moto.settings is imported

import boto3  # noqa: E402
import moto.iam.access_control as access_control  # noqa: E402
from moto.moto_server.threaded_moto_server import ThreadedMotoServer  # noqa: E402


def _aws_query(query: str) -> str:
    parts = []
    for p in query.split("&"):
        if not p:
            continue
        k, _, v = p.partition("=")
        parts.append(quote(unquote(k), safe="-_.~") + "=" + quote(unquote(v), safe="-_.~"))
    return "&".join(parts)


_create = access_control.IAMRequestBase._create_aws_request


def _create_aws_request(self):
    path, sep, query = self._path.partition("?")
    if sep:
        self._path = path + "?" + _aws_query(query)
    return _create(self)


access_control.IAMRequestBase._create_aws_request = _create_aws_request


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]  # the bound port when --port is 0
    endpoint = f"http://127.0.0.1:{port}"

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam.create_user(UserName="sluice-tests")
    iam.put_user_policy(UserName="sluice-tests", PolicyName="allow-all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="sluice-tests")["AccessKey"]

    state = {"http_port": port, "pid": os.getpid(),
             "access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
    with open(args.state + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(args.state + ".tmp", args.state)

    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
