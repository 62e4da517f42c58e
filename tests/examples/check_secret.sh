#!/usr/bin/env bash
# The load's secret appears in no output: 4 ranks (sluice-launch, sluice-load
# --topology ... --json, --json-out) meet through a Redis store of the test's
# own whose MONITOR records every command, so the test learns the secret rank 0
# set (the SETNX of ".../sluice-secret"); then neither the ranks' stdout and
# stderr, nor the launcher's, nor any JSON summary holds it, raw, in hex (either
# case) or base64. With a password: the store needs AUTH, which the ranks send
# from SLUICE_STORE_PASSWORD_FILE (mode 0600), and the password appears in no
# output either.
# Usage: check_secret.sh SLUICE_LAUNCH SLUICE_LOAD CKPT
set -euo pipefail
launch=$(realpath "$1") load=$(realpath "$2") ck=$(realpath "$3")
if [[ ! -x /usr/bin/redis-server ]]; then echo "SKIPPED: redis-server missing (scripts/setup.sh installs it)"; exit 0; fi
work=$(mktemp -d)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
password="pw-$RANDOM-$RANDOM-$RANDOM"
/usr/bin/redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning --requirepass "$password" \
  > "$work/redis.log" 2>&1 &
redis=$!
trap 'kill $redis $monitor 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
monitor=
for _ in $(seq 100); do redis-cli -p "$port" -a "$password" --no-auth-warning ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$port" -a "$password" --no-auth-warning monitor > "$work/monitor.log" 2>&1 &
monitor=$!
sleep 0.2
printf '%s\n' "$password" > "$work/pw"
chmod 600 "$work/pw"
SLUICE_STORE_PASSWORD_FILE="$work/pw" "$launch" -n 4 --store "redis://127.0.0.1:$port/secret-$$" --json-out "$work/launch.json" -- \
  sh -c '"$0" "$1" --topology tp1,dp4,ep4 --offload shared-cooperative --json --json-out "$2/rank-$RANK.json"' "$load" "$ck" "$work" \
  > "$work/out.txt" 2> "$work/err.txt" || { cat "$work/err.txt"; echo "FAIL: the load failed"; exit 1; }
sleep 0.2
kill $monitor 2>/dev/null || true
/usr/bin/python3 - "$work" "$password" <<'PY'
import base64, glob, os, re, sys
work, password = sys.argv[1], sys.argv[2].encode()
mon = open(os.path.join(work, "monitor.log"), "rb").read()
# redis-cli's MONITOR quotes arguments: "\xNN", "\\", "\"", "\n", "\r", "\t", "\a", "\b".
esc = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b", b"\\": b"\\", b'"': b'"'}
def unquote(s):
    out, i = bytearray(), 0
    while i < len(s):
        if s[i:i+1] == b"\\":
            if s[i+1:i+2] == b"x":
                out.append(int(s[i+2:i+4], 16)); i += 4; continue
            out += esc.get(s[i+1:i+2], s[i+1:i+2]); i += 2; continue
        out.append(s[i]); i += 1
    return bytes(out)
secrets = set()
for line in mon.splitlines():
    args = [unquote(a) for a in re.findall(rb'"((?:[^"\\]|\\.)*)"', line)]
    if len(args) >= 3 and args[0].upper() in (b"SET", b"SETNX") and args[1].endswith(b"sluice-secret"):
        secrets.add(args[2])
if not secrets or any(len(s) != 32 for s in secrets):
    sys.exit(f"FAIL: the store saw no 32-byte secret ({len(secrets)} SETs of sluice-secret): the test proves nothing\n" + mon[:1500].decode(errors="replace"))
files = [os.path.join(work, f) for f in ("out.txt", "err.txt", "launch.json")] + glob.glob(os.path.join(work, "rank-*.json"))
blobs = {f: open(f, "rb").read() for f in files if os.path.isfile(f)}
if len(blobs) < 7:
    sys.exit(f"FAIL: expected the launcher's and 4 ranks' outputs, found {sorted(blobs)}")
for s in secrets:
    forms = [s, s.hex().encode(), s.hex().upper().encode(), base64.b64encode(s), base64.b64encode(s).rstrip(b"=")]
    for f, b in blobs.items():
        for form in forms:
            if form in b:
                sys.exit(f"FAIL: the load's secret appears in {f}")
for f, b in blobs.items():
    if password in b:
        sys.exit(f"FAIL: the store's password appears in {f}")
print(f"secret checks: {len(secrets)} secret(s) from the store, {len(blobs)} outputs, none holds it or the password")
PY
echo "sluice secret checks: passed"
