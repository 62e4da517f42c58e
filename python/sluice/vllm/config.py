"""`--model-loader-extra-config` for `--load-format sluice`: the keys, their
defaults and their checks.

Extra-config keys (`--model-loader-extra-config '{json}'`); any other key is an
error naming it, raised before anything is read:

    weights      where the weights are: a directory, a .safetensors file or
                 s3://bucket/prefix/ (default: the model path). vLLM accepts
                 s3:// models only for its own object-storage loaders, so the
                 model argument stays a local directory with the config.
    index        a local model.safetensors.index.json to open `weights` through
                 (its shards are checked against the listing first)
    staging      the staging budget, e.g. "4GiB" (sluice's size grammar)
    max_read     the largest single read, e.g. "32MiB"
    queue_depth  reads in flight per reader
    offload      none | per-rank | shared-single | shared-cooperative (shared
                 tables, distributed loads)
    direct       true (default) | false: in a one-process load, read each tensor
                 that a dry run of the model's load_weights proves lands whole
                 and unconverted in one parameter straight into it (see
                 sluice.vllm.dry_run); false streams every tensor through load_weights
    map          false (default) | true: in a one-process load, each tensor that
                 fills a whole CPU parameter becomes that parameter's memory
                 as a private mapping of its file (page cache shared by every
                 engine process on the node; no copy, no fresh memory; writes
                 copy the page, never the file). For CPU engines only; never
                 rewrite the checkpoint's files in place while the engine
                 runs (a truncated file kills it with SIGBUS: write updates to
                 a new directory), and under memory pressure weight pages may
                 be dropped and read again from storage
    strict       true (default) | false: a model parameter whose bytes nothing in
                 the checkpoint writes (a tensor the checkpoint lacks, found by
                 the dry run before any byte is read) fails the load naming it;
                 false logs it instead. vLLM's own check exempts every module
                 with a quant method, so a missing linear layer passes it
    timeout      seconds a multi-rank load waits on its peers (the collective
                 open, each exchange) before it fails naming the ranks that did
                 not come (default 60)
    prefault     true (default) | false: in a one-process load, fault the model's
                 fresh CPU parameters in on a thread of sluice's own, from the
                 start of load_weights (during the dry run) and then from the
                 last destination backwards while the reads fill from the first

    cache        s3:// weights: a node-local cache directory (0700, this user's)
                 that loads read through, so that a restart reads verified
                 blocks from local disk instead of S3 (default:
                 SLUICE_CACHE_DIR); cache_max caps its size ("200GiB")

S3 endpoints and credentials come from the usual AWS environment and profile
chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ~/.aws, ...), never from here.
"""
from __future__ import annotations

import sluice

__all__ = ["EXTRA_CONFIG_KEYS", "options"]

EXTRA_CONFIG_KEYS = ("weights", "index", "staging", "max_read", "queue_depth", "offload", "direct", "prefault", "map",
                     "timeout", "strict", "cache", "cache_max")
_OFFLOADS = ("none", "per-rank", "shared-single", "shared-cooperative")


def options(extra) -> dict:
    """The extra config, checked and completed with the defaults (any unknown
    key, or a value of the wrong kind, is a ConfigError naming it)."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise sluice.ConfigError(f"--model-loader-extra-config for sluice must be a JSON object, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
    if unknown:
        raise sluice.ConfigError(f"--model-loader-extra-config: unknown key(s) {', '.join(map(repr, unknown))} for "
                                 f"--load-format sluice (known: {', '.join(EXTRA_CONFIG_KEYS)})")
    o = {"staging": "4GiB", "max_read": "32MiB", "queue_depth": 4, "offload": "none", "weights": None, "index": None,
         "direct": True, "prefault": True, "map": False, "timeout": 60.0, "strict": True, "cache": None,
         "cache_max": None}
    o.update(extra)
    for k in ("staging", "max_read"):
        o[k] = sluice.parse_size(o[k])
    if isinstance(o["queue_depth"], bool) or not isinstance(o["queue_depth"], int) or o["queue_depth"] < 1:
        raise sluice.ConfigError(f"--model-loader-extra-config: queue_depth must be a positive integer, got {o['queue_depth']!r}")
    if o["offload"] not in _OFFLOADS:
        raise sluice.ConfigError(f"--model-loader-extra-config: offload {o['offload']!r} is not one of {', '.join(_OFFLOADS)}")
    for k in ("direct", "prefault", "map", "strict"):
        if not isinstance(o[k], bool):
            raise sluice.ConfigError(f"--model-loader-extra-config: {k} must be true or false, got {o[k]!r}")
    t = o["timeout"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise sluice.ConfigError(f"--model-loader-extra-config: timeout must be a positive number of seconds, got {t!r}")
    o["timeout"] = float(t)
    if o["cache_max"] is not None:
        o["cache_max"] = sluice.parse_size(o["cache_max"])
    for k in ("weights", "index", "cache"):
        if o[k] is not None and not isinstance(o[k], str):
            raise sluice.ConfigError(f"--model-loader-extra-config: {k} must be a string, got {o[k]!r}")
    return o
