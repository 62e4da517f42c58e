"""Rendezvous for distributed loads through a torch.distributed store.

The store is, in order: the `store` argument; the default process group's
store when torch.distributed is initialised; else a TCPStore built from
torchrun's MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE (rank 0 is the
server), made once per process and kept. Every load gets a key prefix of its
own ("sluice/load-N", N counting the loads of this process: the same on every
rank because every rank makes the same calls).
"""
import datetime
import os

_store = None
_loads = 0
_opens = 0


def _env(name, default=None):
    v = os.environ.get(name)
    if v is None or v == "":
        if default is None:
            from . import ConfigError
            raise ConfigError(f"a distributed load needs the environment variable {name} (as torchrun sets it)")
        return default
    return v


def default_store(timeout=60.0):
    """The store a distributed load meets through when none is given."""
    global _store
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    if _store is None:
        rank, world = int(_env("RANK")), int(_env("WORLD_SIZE"))
        _store = dist.TCPStore(_env("MASTER_ADDR"), int(_env("MASTER_PORT")), world, rank == 0,
                               datetime.timedelta(seconds=timeout))
    return _store


def node_address(store=None):
    """The address the other nodes reach this one at, for a world across
    nodes (SLUICE_GLOO_HOST wins; 127.0.0.1 reaches nobody else): the local
    end of a route toward the store's host (MASTER_ADDR under torchrun), as
    torch and vLLM find their own IP. No packet is sent: a UDP socket's
    connect() only picks the route."""
    import socket
    peer = getattr(store, "host", None) if store is not None else None
    peer = peer or os.environ.get("MASTER_ADDR") or ""
    candidates = [peer] if peer else []
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    for target in candidates:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 1))
                ip = s.getsockname()[0]
        except OSError:
            continue
        if not ip.startswith("127.") and ip != "0.0.0.0":
            return ip
    return ""


def _set_host(o, store=None):
    """Multi-node: the address this rank advertises (see node_address)."""
    if o.world_size > o.local_size and not os.environ.get("SLUICE_GLOO_HOST"):
        o.host = node_address(store)


def configure(o, topology, offload, store, timeout, world=None):
    """Fills a StreamOptions' distributed fields from `world` (a sluice.World),
    or else from torchrun's environment."""
    global _loads
    import torch.distributed as dist
    if world is not None:
        o.rank, o.world_size, o.local_rank, o.local_size = world.rank, world.size, world.local_rank, world.local_size
    else:
        o.rank = int(_env("RANK", "0"))
        o.world_size = int(_env("WORLD_SIZE", "1"))
        o.local_rank = int(_env("LOCAL_RANK", str(o.rank)))
        o.local_size = int(_env("LOCAL_WORLD_SIZE", str(o.world_size)))
    o.topology = topology or f"tp1,dp{o.world_size},ep{o.world_size}"  # as sluice-load under sluice-launch
    o.offload = offload
    o.timeout_ms = int(timeout * 1000)
    _set_host(o, store)
    if o.world_size > 1:
        if store is not None and world is not None:
            o.set_store(store)  # the caller agreed on its prefix with its peers
        else:
            _loads += 1
            o.set_store(dist.PrefixStore(f"sluice/load-{_loads}", store or default_store(timeout)))


def collective_open_options(world, store, timeout):
    """The ranks of a collective sluice.open, as a StreamOptions: `world` with
    `store` (under the key prefix "open/"), or torchrun's environment and the
    default store (under "sluice/open-N", N counting this process's collective
    opens, as load-N counts its loads)."""
    global _opens
    import torch.distributed as dist
    from . import ConfigError, _sluice
    if (world is None) != (store is None):
        raise ConfigError("a collective open takes both world= and store=, or neither (torchrun's environment)")
    o = _sluice.StreamOptions()
    o.timeout_ms = int(timeout * 1000)
    if world is not None:
        o.rank, o.world_size, o.local_rank, o.local_size = world.rank, world.size, world.local_rank, world.local_size
        _set_host(o, store)
        if o.world_size > 1:
            o.set_store(dist.PrefixStore("open", store))
        return o
    o.rank = int(_env("RANK", "0"))
    o.world_size = int(_env("WORLD_SIZE", "1"))
    o.local_rank = int(_env("LOCAL_RANK", str(o.rank)))
    o.local_size = int(_env("LOCAL_WORLD_SIZE", str(o.world_size)))
    _set_host(o)
    if o.world_size > 1:
        _opens += 1
        o.set_store(dist.PrefixStore(f"sluice/open-{_opens}", default_store(timeout)))
    return o


def kernel_key(namespace):
    """This process's running kernel (its boot id) and its `namespace`
    ("net", "pid", ...) as the kernel names them: what two processes share
    exactly when they share that kernel and namespace."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    try:
        ns = os.readlink(f"/proc/self/ns/{namespace}")
    except OSError:
        ns = ""
    return f"{boot}/{ns}"


def node_key():
    """What makes two processes one node for sluice, as the kernel says it (a
    host name says nothing: two containers or two machines may share one):
    the same running kernel (its boot id: one page cache for the node's
    files) and the same network namespace (a node's memory is handed over on
    an abstract Unix socket, which lives in one)."""
    return kernel_key("net")


def local_of(keys, mine):
    """(local_rank, local_size) of rank `mine` among ranks whose node keys are
    `keys` (by rank). The plan groups a node's ranks contiguously and every
    node alike: otherwise every rank is its own node (local_size 1), which is
    always correct (nothing is shared through memory then)."""
    blocks = [[r for r in range(len(keys)) if keys[r] == k] for k in dict.fromkeys(keys)]
    contiguous = all(b == list(range(b[0], b[0] + len(b))) and len(b) == len(blocks[0]) for b in blocks)
    if not contiguous:
        return 0, 1
    same = next(b for b in blocks if mine in b)
    return same.index(mine), len(same)


def torch_world(group=None, prefix="sluice/group", rank=None):
    """(sluice.World, store) for one load across a torch.distributed group (the
    default group when None): this rank's place (`rank`, default its rank in
    the group: an engine whose ranks are ordered otherwise than sluice's plan
    passes its sluice rank), the ranks on its node (an all-gather of
    node_key(): the kernel's boot id and network namespace, never the host
    name), and the default store under a key prefix that the group's rank 0
    draws and broadcasts, so that every load gets keys of its own even when
    only some processes load (a per-process counter would diverge there). The
    plan groups a node's ranks contiguously: where a node's ranks are not
    contiguous in that order, every rank is its own node (local_size 1). A
    collective over `group`: every rank calls it."""
    import uuid
    import torch.distributed as dist
    from . import ConfigError, World
    size = dist.get_world_size(group)
    mine = dist.get_rank(group) if rank is None else int(rank)
    places = [None] * size
    dist.all_gather_object(places, (mine, node_key()), group=group)
    if sorted(p[0] for p in places) != list(range(size)):
        raise ConfigError(f"torch_world: the ranks given are {[p[0] for p in places]}, not each of 0..{size - 1} once")
    nodes = [None] * size
    for r, k in places:
        nodes[r] = k
    token = [uuid.uuid4().hex if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(token, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    store = dist.PrefixStore(f"{prefix}/{token[0]}", dist.distributed_c10d._get_default_store())
    local_rank, local_size = local_of(nodes, mine)
    return World(rank=mine, size=size, local_rank=local_rank, local_size=local_size), store
