"""The page cache, as the Python benches set it before a timed load: hot (every
file read once right before) or cold (dropped; root only)."""
import subprocess


def warm(files):
    """Reads every file once, so that its pages are in the page cache."""
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def drop_caches():
    """Writes back dirty pages, then drops the page cache (needs root)."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
