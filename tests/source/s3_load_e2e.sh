#!/usr/bin/env bash
# End to end: a generated checkpoint uploaded to the S3 test server (moto,
# SigV4-verifying; HTTP, and HTTPS through nginx) loads through `sluice-load s3://...` with digests identical to the
# local load; a wrong secret fails with one `sluice: error:` line (HTTP 403: a HEAD
# response carries no S3 error code) naming the
# object. Usage: s3_load_e2e.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tools=$build/examples
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [[ -z "${SLUICE_S3_ENDPOINT:-}" ]]; then eval "$(bash "$src/scripts/s3-server.sh" start)"; fi
# The test server's key pair comes with its env lines (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
export AWS_REGION=us-east-1
py=${SLUICE_PYTHON:-$src/.venv/bin/python}   # boto3: the project's Python environment

"$tools/gen-checkpoint" "$work/ck" --size 24MiB >/dev/null
bucket="sluice-e2e-$$-$RANDOM"
"$py" - "$work/ck" "$bucket" <<'PY'
import os, sys, boto3
d, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=os.environ["SLUICE_S3_ENDPOINT"], region_name="us-east-1")
s3.create_bucket(Bucket=bucket)
for f in sorted(os.listdir(d)):
    s3.upload_file(os.path.join(d, f), bucket, "ck/" + f)
PY
"$tools/sluice-load" "$work/ck" --digest --no-progress > "$work/local.txt" 2>/dev/null
for ep in "$SLUICE_S3_ENDPOINT" "$SLUICE_S3_HTTPS_ENDPOINT"; do
  AWS_ENDPOINT_URL=$ep AWS_CA_BUNDLE=$SLUICE_S3_CA_BUNDLE \
    "$tools/sluice-load" "s3://$bucket/ck/" --digest --no-progress --max-read 4MiB --staging 64MiB > "$work/s3.txt" 2>"$work/s3.err"
  if ! cmp -s "$work/local.txt" "$work/s3.txt"; then
    echo "FAIL: digests over $ep differ from the local load"; diff "$work/local.txt" "$work/s3.txt" | head; exit 1
  fi
  echo "ok: $(wc -l < "$work/s3.txt") tensor digests over $ep equal the local load"
done
AWS_ENDPOINT_URL=$SLUICE_S3_ENDPOINT "$tools/sluice-load" "s3://$bucket/ck/" --digest --no-progress --max-read 1MiB \
  --connections 2 > "$work/s3c.txt" 2>/dev/null
cmp -s "$work/local.txt" "$work/s3c.txt" || { echo "FAIL: digests with --connections 2 differ from the local load"; exit 1; }
echo "ok: --connections 2: digests equal the local load"
if "$tools/sluice-load" "s3://$bucket/ck/" --connections 0 > /dev/null 2> "$work/c0.err" || ! grep -q "at least 1" "$work/c0.err"; then
  echo "FAIL: --connections 0 was not refused:"; cat "$work/c0.err"; exit 1
fi
for ep in "$SLUICE_S3_ENDPOINT" "$SLUICE_S3_HTTPS_ENDPOINT"; do
  if AWS_ENDPOINT_URL=$ep AWS_CA_BUNDLE=$SLUICE_S3_CA_BUNDLE AWS_SECRET_ACCESS_KEY=wrong \
     "$tools/sluice-load" "s3://$bucket/ck/" --no-progress > /dev/null 2> "$work/bad.err"; then
    echo "FAIL: a wrong secret loaded over $ep"; exit 1
  fi
  if [[ $(wc -l < "$work/bad.err") -ne 1 ]] || ! grep -Eq "^sluice: error: .*(403|SignatureDoesNotMatch).*$bucket" "$work/bad.err"; then
    echo "FAIL: unexpected error output over $ep:"; cat "$work/bad.err"; exit 1
  fi
  echo "ok: wrong secret over $ep -> $(cat "$work/bad.err")"
done
echo "s3 end-to-end: passed"
