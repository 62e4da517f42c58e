# bench/gpu/lib.sh — the pieces of run.sh that can go wrong on a machine we
# cannot try beforehand, as functions (sourced by run.sh and by
# tests/cuda/check_gpu_run.sh, which checks them without a GPU).

# The directory of pip's NCCL (nvidia-nccl-cu*): python3 -c with `nvidia.nccl`.
# The wheel ships it as a namespace package (no __init__.py): its __file__ is
# None, its __path__ lists the directory. Prints nothing when there is none.
#   pip_nccl_dir [PYTHON]
pip_nccl_dir() {
  local py=${1:-python3}
  command -v "$py" >/dev/null 2>&1 || return 0
  "$py" - 2>/dev/null <<'PY' || true
import nvidia.nccl as m
paths = list(getattr(m, "__path__", []) or [])
if paths:
    print(paths[0])
elif getattr(m, "__file__", None):
    import os
    print(os.path.dirname(m.__file__))
PY
}

# Whether two digest listings (one "name dtype shape sha256" line per tensor)
# hold the same lines, in any order. Both sides are sorted in byte order
# (LC_ALL=C): sluice-load --digest prints names in byte order, while `sort`
# under a UTF-8 locale orders "a.b" and "a_b" by collation rules instead.
#   digests_match FILE_A FILE_B
digests_match() {
  cmp -s <(LC_ALL=C sort "$1") <(LC_ALL=C sort "$2")
}
