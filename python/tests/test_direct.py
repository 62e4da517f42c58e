"""sluice.vllm.dry_run: the dry run of a model's load_weights that finds the tensors
sluice may read straight into their parameters. Each loader pattern below is
one that engines' weight_loaders use (vLLM's fused QKV and gate/up narrows,
MoE expert slices, TP slices, dtype casts, transposes); only the whole,
unconverted, contiguous copies may be direct, and a direct load must leave the
parameters bitwise equal to the model's own load of real tensors."""
from collections import namedtuple

import pytest
import torch

import sluice
from sluice.vllm.dry_run import dry_run

Info = namedtuple("Info", "name dtype shape")


class Model(torch.nn.Module):
    """A toy engine model: each checkpoint name has its own loading rule."""

    def __init__(self):
        super().__init__()
        z = lambda *s, dtype=torch.bfloat16: torch.nn.Parameter(torch.zeros(*s, dtype=dtype), requires_grad=False)
        self.whole = z(4, 8)
        self.fused = z(6, 8)            # q (4 rows) and k (2 rows), as QKVParallelLinear
        self.experts = z(2, 4, 8)       # two experts' slices, as FusedMoE's w13
        self.tp_half = z(2, 8)          # rows 2..3 of a 4x8 tensor: this TP rank's part
        self.cast = z(4, 8, dtype=torch.float32)
        self.transposed = z(8, 4)
        self.scaled = z(4, 8)
        self.padded = z(6, 8)
        self.buffered = z(4, 8)
        self.prefilled = z(4, 8)
        self.register_buffer("table", torch.zeros(3, 8, dtype=torch.bfloat16))
        self.pending = None
        self.fail_on = None

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            if name == self.fail_on:
                float(w.sum())  # needs a value: a meta probe cannot give one
            if name == "whole":
                self.whole.data.copy_(w)
            elif name in ("q", "k"):
                off, n = (0, 4) if name == "q" else (4, 2)
                self.fused.data.narrow(0, off, n).copy_(w)
                name = "fused"
            elif name.startswith("expert."):
                self.experts.data[int(name.split(".")[1])].copy_(w)
                name = "experts"
            elif name == "tp":
                self.tp_half.data.copy_(w.narrow(0, 2, 2))
                name = "tp_half"
            elif name == "cast":
                self.cast.data.copy_(w)
            elif name == "transposed":
                self.transposed.data.copy_(w.t())
            elif name == "scaled":
                self.scaled.data.copy_(w)
                self.scaled.data.mul_(2)
            elif name == "padded":  # as a vocabulary embedding padded past the checkpoint's rows
                self.padded.data[:4].copy_(w)
                self.padded.data[4:].fill_(0.5)
            elif name == "renorm":  # normalises the whole fused parameter once its last part arrives
                self.fused.data.narrow(0, 4, 2).zero_()
                self.fused.data.mul_(1)
                name = "fused"
            elif name == "buffered":
                self.pending = w
                continue
            elif name == "prefilled":  # a fill, then the copy over it
                self.prefilled.data.fill_(1)
                self.prefilled.data.copy_(w)
            elif name == "table":
                self.table.copy_(w)
            elif name == "skipped":
                continue
            loaded.add(name)
        if self.pending is not None:
            self.buffered.data.copy_(self.pending)
            self.pending = None
            loaded.add("buffered")
        return loaded


def _checkpoint():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
    return {"whole": r(4, 8), "q": r(4, 8), "k": r(2, 8), "expert.0": r(4, 8), "expert.1": r(4, 8), "tp": r(4, 8),
            "cast": r(4, 8), "transposed": r(4, 8), "scaled": r(4, 8), "padded": r(4, 8), "buffered": r(4, 8), "table": r(3, 8),
            "skipped": r(2, 2), "prefilled": r(4, 8)}


def _infos(ck):
    return [Info(n, "BF16", tuple(t.shape)) for n, t in ck.items()]


def test_only_whole_unconverted_contiguous_copies_into_parameters_are_direct():
    model = Model()
    plan = dry_run(model, _infos(_checkpoint()))
    assert plan.failure is None
    # A copy the loader makes later (it buffered the tensor) is direct too:
    # the bytes are in place before the real pass.
    assert set(plan.direct) == {"whole", "q", "k", "expert.0", "expert.1", "table", "padded", "buffered"}
    assert set(plan.streamed) == {"tp", "cast", "transposed", "scaled", "skipped", "prefilled"}
    assert "only part" in plan.streamed["tp"] or "go through" in plan.streamed["tp"]
    assert "float32" in plan.streamed["cast"]
    assert "writes over it" in plan.streamed["scaled"]
    assert "before the copy" in plan.streamed["prefilled"]
    assert plan.streamed["skipped"] == "not copied anywhere"
    assert plan.loaded == {"whole", "fused", "experts", "tp_half", "cast", "transposed", "scaled", "padded", "table",
                           "buffered", "prefilled"}
    # The dry run copied nothing: only the loader's own fills ran.
    assert all(int(torch.count_nonzero(p)) == 0 for n, p in model.named_parameters() if n not in ("padded", "prefilled"))
    assert torch.equal(model.padded[4:], torch.full((2, 8), 0.5, dtype=torch.bfloat16))
    # The destinations are the parameters' own memory.
    assert plan.direct["q"].data_ptr() == model.fused.data_ptr()
    assert plan.direct["k"].data_ptr() == model.fused.data_ptr() + 4 * 8 * 2
    assert plan.direct["expert.1"].data_ptr() == model.experts.data_ptr() + 4 * 8 * 2


def _planned(tmp_path, ck, cls):
    """`ck` saved and loaded by a `cls` model's own load_weights (the
    reference), and a fresh `cls` model's dry run over the opened file:
    (reference, model, opened checkpoint, plan)."""
    from safetensors.torch import save_file
    path = str(tmp_path / "m.safetensors")
    save_file(ck, path)
    reference = cls()
    reference.load_weights(iter(ck.items()))
    model = cls()
    opened = sluice.open(path)
    return reference, model, opened, dry_run(model, opened.tensors)


def test_a_direct_load_equals_the_models_own_load_bitwise(tmp_path):
    ck = _checkpoint()
    reference, model, opened, plan = _planned(tmp_path, ck, Model)
    stats = sluice.load_into(opened, plan.direct, staging="1MiB", max_read="256KiB")
    assert stats["tensors"] == len(plan.direct)
    rest = {n: ck[n] for n in plan.streamed}
    model.load_weights(iter(rest.items()))
    for (n, a), (_, b) in zip(reference.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), n


def test_a_later_write_over_an_earlier_tensors_copy_makes_that_tensor_streamed():
    infos = [Info("q", "BF16", (4, 8)), Info("k", "BF16", (2, 8)), Info("renorm", "BF16", (1,))]
    plan = dry_run(Model(), infos)
    assert set(plan.direct) == set()
    assert "writes over it" in plan.streamed["q"] and "writes over it" in plan.streamed["k"]


def test_a_loader_that_needs_values_makes_every_tensor_streamed():
    model = Model()
    model.fail_on = "table"
    plan = dry_run(model, _infos(_checkpoint()))
    assert plan.direct == {}
    assert "meta" in plan.failure.lower() or "Tensor" in plan.failure
    assert set(plan.streamed) == set(_checkpoint())
    assert all(int(torch.count_nonzero(p)) == 0 for n, p in model.named_parameters() if n != "padded")


def test_copies_into_memory_that_is_not_a_parameters_are_streamed():
    class Scratch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)

        def load_weights(self, weights):
            for _, w in weights:
                tmp = torch.empty(4, 8, dtype=torch.bfloat16)
                tmp.copy_(w)  # a scratch buffer, gone once the loader returns
            return {"w"}
    plan = dry_run(Scratch(), [Info("w", "BF16", (4, 8))])
    assert plan.direct == {} and "not a parameter" in plan.streamed["w"]


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "I64"])
def test_probes_carry_the_checkpoints_dtype(dtype):
    seen = {}

    class Probe(torch.nn.Module):
        def load_weights(self, weights):
            for n, w in weights:
                seen[n] = (w.dtype, w.device.type, tuple(w.shape))
            return set()
    dry_run(Probe(), [Info("t", dtype, (3, 5))])
    assert seen["t"] == (sluice.as_torch_dtype(dtype), "meta", (3, 5))


def test_the_dry_run_names_the_parameters_a_checkpoint_leaves_unwritten():
    """Every copy and every write of the loader's own counts (the streamed ones
    too, and the padding fill): the full toy checkpoint leaves nothing
    unwritten; without "whole" its parameter is named; without "k", the two
    rows of the fused parameter that "k" fills are."""
    ck = _checkpoint()
    assert dry_run(Model(), _infos(ck)).unwritten == {}
    plan = dry_run(Model(), _infos({n: t for n, t in ck.items() if n != "whole"}))
    assert plan.unwritten == {"whole": (64, 64)}
    plan = dry_run(Model(), _infos({n: t for n, t in ck.items() if n != "k"}))
    assert plan.unwritten == {"fused": (2 * 8 * 2, 6 * 8 * 2)}


def test_the_dry_run_says_what_the_model_takes_calls_its_loaders_with_or_ignores():
    """The ownership a multi-rank load plans from: bytes that reach parameter
    memory (directly or through ops) are taken; a weight_loader called with a
    tensor that writes nothing (a MoE expert another EP rank holds) only
    calls; a name the model skips is ignored. Loaders are restored after."""
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, 4, dtype=torch.bfloat16), requires_grad=False)
            self.w.weight_loader = self.load_expert   # as vLLM's RoutedExperts: local experts 0 and 1 only
            self.norm = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16), requires_grad=False)

        def load_expert(self, param, w, expert):
            if expert >= 2:
                return False   # another rank's: nothing written
            param.data[expert].copy_(w)
            return True

        def load_weights(self, weights):
            for name, w in weights:
                if name.startswith("experts."):
                    self.w.weight_loader(self.w, w, int(name.split(".")[1]))
                elif name == "norm":
                    getattr(self.norm, "weight_loader")(self.norm, w)   # the default loader
                # "other.layer" is another stage's: skipped
            return set()

    def default_loader(param, w):
        param.data.copy_(w)

    model = Experts()
    own = model.w.weight_loader
    infos = [Info(n, "BF16", (4,)) for n in ("experts.0", "experts.1", "experts.2", "experts.3", "norm", "other.layer")]
    plan = dry_run(model, infos, default_weight_loader=default_loader)
    assert plan.takes == {"experts.0", "experts.1", "norm"}
    assert plan.calls == {"experts.2", "experts.3"}
    assert model.w.weight_loader == own and "weight_loader" not in vars(model.norm)


def test_the_dry_run_gives_back_a_loader_kept_behind_a_property():
    """vLLM's parameter classes keep the loader behind a property whose
    deleter leaves None: the dry run must leave it as it found it."""
    class Param(torch.nn.Parameter):   # the shape of vLLM's BasevLLMParameter
        def __new__(cls, data, weight_loader):
            return super().__new__(cls, data=data, requires_grad=False)

        def __init__(self, data, weight_loader):
            self._weight_loader = weight_loader

        @property
        def weight_loader(self):
            if self._weight_loader is None:
                raise AttributeError("weight_loader attribute has been deleted")
            return self._weight_loader

        @weight_loader.setter
        def weight_loader(self, value):
            self._weight_loader = value

        @weight_loader.deleter
        def weight_loader(self):
            self._weight_loader = None

    def load(param, w):
        param.data.copy_(w)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = Param(torch.zeros(4, dtype=torch.bfloat16), load)

        def load_weights(self, weights):
            for _, w in weights:
                self.w.weight_loader(self.w, w)
            return {"w"}

    model = Model()
    plan = dry_run(model, [Info("w", "BF16", (4,))])
    assert plan.takes == {"w"}
    assert model.w.weight_loader is load
    model.load_weights([("w", torch.ones(4, dtype=torch.bfloat16))])
    assert model.w.eq(1).all()


# ---- sluice.vllm.parts: which block of a tensor each rank's copies read, the
# split the owners' needs allow, and each copy replayed on the block that
# arrives (laid out as sluice's plan cuts it) gives the bytes the copy of the
# whole tensor gives. (Here, not a file of its own: one import of vLLM.)
from sluice.vllm.parts import choose, needs, view_in_part  # noqa: E402


def _copy(view):
    return view.storage_offset(), tuple(view.shape), tuple(view.stride())


def _block(full, dim, index, parts, groups=1):
    """The block the plan delivers: rows (dim 0) or columns (dim 1), contiguous;
    with `groups` runs of the dimension (a count, or each run's rows), block
    `index` of each, packed in order."""
    runs = full.split(list(groups), dim) if isinstance(groups, tuple) else full.chunk(groups, dim)
    return torch.cat([run.chunk(parts, dim)[index] for run in runs], dim).contiguous()


def _replayed(full, split, copy):
    part = full if split is None else _block(full, *split)
    offset, shape, strides = view_in_part(tuple(full.shape), split, copy)
    return part.as_strided(shape, strides, part.storage_offset() + offset)   # as the loader replays


def test_tp_rows_and_columns_replay_on_their_block():
    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    for k in range(2):
        rows = full.narrow(0, 4 * k, 4)             # a column-parallel weight's part
        cols = full.narrow(1, 3 * k, 3)             # a row-parallel weight's part
        assert needs(full.shape, [_copy(rows)]) == ((4 * k, 4 * k + 3, 0, 5),)
        assert needs(full.shape, [_copy(cols)]) == ((0, 7, 3 * k, 3 * k + 2),)
        assert torch.equal(_replayed(full, (0, k, 2), _copy(rows)), rows)
        assert torch.equal(_replayed(full, (1, k, 2), _copy(cols)), cols)
        assert torch.equal(_replayed(full, None, _copy(cols)), cols)
    # Sub-blocks of a rank's block (a fused QKV's q and k parts) replay too.
    sub = full.narrow(0, 4, 4).narrow(0, 1, 2)
    assert torch.equal(_replayed(full, (0, 1, 2), _copy(sub)), sub)


def test_fused_expert_blocks_replay_on_their_block():
    e, i, h = 8, 4, 3
    full = torch.arange(e * 2 * i * h, dtype=torch.float32).view(e, 2 * i, h)
    mine = [full[x, :i] for x in range(4, 8)] + [full[x, i:] for x in range(4, 8)]   # EP rank 1 of 2: w1 and w3 halves
    got = needs(full.shape, [_copy(v) for v in mine])
    assert got == ((4, 7, 0, 2 * i - 1),)   # the halves and the experts merged into one box
    for v in mine:
        assert torch.equal(_replayed(full, (0, 1, 2), _copy(v)), v)


def test_choose_takes_the_most_parts_every_owner_fits_and_every_part_has_an_owner():
    shape = (8, 6)
    rows = {r: ((4 * (r % 2), 4 * (r % 2) + 3, 0, 5),) for r in range(4)}   # TP2 x DP2
    assert choose(shape, rows) == (0, 2, {0: 0, 1: 1, 2: 0, 3: 1}, 1)
    cols = {0: ((0, 7, 3, 5),), 1: ((0, 7, 0, 2),)}                         # parts in the other order
    assert choose(shape, cols) == (1, 2, {0: 1, 1: 0}, 1)
    assert choose(shape, {0: ((0, 7, 0, 5),), 1: ((0, 3, 0, 5),)}) is None   # one owner needs it whole
    assert choose(shape, {0: ((0, 1, 0, 5),), 1: ((2, 3, 0, 5),)}) == (0, 2, {0: 0, 1: 1}, 2)  # rows 4-7 read by
    # no copy still go somewhere: block k of both runs of four rows (half each, not all to both)
    assert choose(shape, {0: ((0, 1, 0, 5),), 1: ((0, 3, 0, 5),)}) is None   # rank 1's rows span two blocks
    assert choose(shape, {0: ((0, 3, 0, 5),), 1: None}) is None              # one owner's copies unknown
    assert choose((8, 6), {r: ((2 * r, 2 * r, 0, 5),) for r in range(4)}) == (0, 4, {0: 0, 1: 1, 2: 2, 3: 3}, 1)
    # Round-robin experts (0, 2, ... and 1, 3, ...): block k of every run of two rows.
    assert choose((8, 4), {0: tuple((e, e, 0, 3) for e in (0, 2, 4, 6)),
                           1: tuple((e, e, 0, 3) for e in (1, 3, 5, 7))}) == (0, 2, {0: 0, 1: 1}, 4)
    # One rank's copies in two blocks of a run: whole.
    assert choose((8, 4), {0: ((0, 0, 0, 3), (5, 5, 0, 3)), 1: ((1, 1, 0, 3), (4, 4, 0, 3))}) is None


def test_a_fused_tensors_runs_replay_on_each_ranks_blocks():
    """A merged column-parallel layer (LFM2's in_proj: B, C and x in one
    tensor; gate_up): each TP rank copies its block of every run of rows, so
    the split is 3 runs of dim 0, each cut in 2; a row-parallel one over two
    runs of columns likewise. Each copy replays on the packed blocks."""
    full = torch.arange(12 * 5, dtype=torch.float32).view(12, 5)
    mine = {k: [full.narrow(0, 4 * g, 4).narrow(0, 2 * k, 2) for g in range(3)] for k in range(2)}
    need = {k: needs(full.shape, [_copy(v) for v in views]) for k, views in mine.items()}
    assert need[1] == ((2, 3, 0, 4), (6, 7, 0, 4), (10, 11, 0, 4))
    assert choose(full.shape, need) == (0, 2, {0: 0, 1: 1}, 3)
    for k, views in mine.items():
        assert _block(full, 0, k, 2, 3).shape == (6, 5)
        for v in views:
            assert torch.equal(_replayed(full, (0, k, 2, 3), _copy(v)), v)
    wide = torch.arange(3 * 8 * 2, dtype=torch.float32).view(3, 8, 2)
    cols = {k: [wide.narrow(1, 4 * g, 4).narrow(1, 2 * k, 2) for g in range(2)] for k in range(2)}
    need = {k: needs(wide.shape, [_copy(v) for v in views]) for k, views in cols.items()}
    assert choose(wide.shape, need) == (1, 2, {0: 0, 1: 1}, 2)
    for k, views in cols.items():
        for v in views:
            assert torch.equal(_replayed(wide, (1, k, 2, 2), _copy(v)), v)


def test_a_gqa_qkv_is_runs_of_unequal_sizes_each_rank_its_block_of_each():
    """Grouped-query attention's fused QKV (Phi-3-medium, Phi-4-mini): q has
    more rows than k and v, so no equal runs hold each TP rank's three blocks;
    the runs q, k, v (8, 4, 4 rows) do."""
    full = torch.arange(16 * 3, dtype=torch.float32).view(16, 3)
    mine = {k: [full.narrow(0, 4 * k, 4), full.narrow(0, 8 + 2 * k, 2), full.narrow(0, 12 + 2 * k, 2)] for k in range(2)}
    need = {k: needs(full.shape, [_copy(v) for v in views]) for k, views in mine.items()}
    assert choose(full.shape, need) == (0, 2, {0: 0, 1: 1}, (8, 4, 4))
    for k, views in mine.items():
        assert _block(full, 0, k, 2, (8, 4, 4)).shape == (8, 3)
        for v in views:
            assert torch.equal(_replayed(full, (0, k, 2, (8, 4, 4)), _copy(v)), v)
    # DP replicas share their blocks; a rank whose rows cross two blocks, or rows no copy reads: whole.
    assert choose(full.shape, {**need, 2: need[0]}) == (0, 2, {0: 0, 1: 1, 2: 0}, (8, 4, 4))
    assert choose(full.shape, {0: need[0], 1: ((4, 8, 0, 2), (10, 11, 0, 2), (14, 15, 0, 2))}) is None
    assert choose(full.shape, {0: need[0], 1: need[1][1:]}) is None


def test_a_view_that_crosses_rows_unevenly_is_not_a_block():
    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    flat = full.view(-1).narrow(0, 3, 12)   # from the middle of one row into another
    assert needs(full.shape, [_copy(flat)]) is None


class Finalizing(torch.nn.Module):
    """A loader that sorts its stream and finalizes at its end (V4.1's VL
    wrapper and language model): `mixed` is computed from a loaded
    parameter, and a flag says it was."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)
        self.v = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.bfloat16), requires_grad=False)
        self.mixed = None
        self.calls = []

    def load_weights(self, weights):
        loaded = set()
        for name, t in sorted(weights, key=lambda x: x[0]):
            self.calls.append(name)
            getattr(self, name).data.copy_(t if name == "w" else t * 2)
            loaded.add(name)
        self.mixed = self.w.float().sum(0) + self.v.float().sum(0)
        return loaded


def test_a_real_pass_over_stand_ins_redoes_what_follows_the_copies_after_the_bytes_arrived(tmp_path):
    """The dry run finalized first, on empty parameters; the real pass
    (stand-ins of the direct tensors under dry_run.placed, then the
    streamed ones) calls every loader again, copies nothing twice, and
    finalizes on the loaded bytes."""
    from sluice.vllm.dry_run import placed, stand_in
    g = torch.Generator().manual_seed(1)
    ck = {n: torch.randn(4, 8, generator=g).to(torch.bfloat16) for n in ("w", "v")}
    reference, model, opened, plan = _planned(tmp_path, ck, Finalizing)
    assert set(plan.direct) == {"w"} and set(plan.streamed) == {"v"}   # v goes through arithmetic
    assert model.mixed is not None and float(model.mixed.abs().sum()) == 0   # finalized first, on zeros
    sluice.load_into(opened, plan.direct, staging="1MiB", max_read="256KiB")
    model.calls.clear()
    with placed():
        model.load_weights(iter([*((t.name, stand_in(t)) for t in opened.tensors if t.name in plan.direct),
                                 ("v", ck["v"])]))
    assert model.calls == ["v", "w"]
    assert torch.equal(model.w, reference.w) and torch.equal(model.v, reference.v)
    assert torch.equal(model.mixed, reference.mixed)


class Viewing(torch.nn.Module):
    """A loader that copies a reinterpreting view of each tensor: E8M0 scales
    as uint8 (vLLM keeps their raw bytes so), and BF16 as bytes (a view of
    another element size)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.uint8), requires_grad=False)
        self.raw = torch.nn.Parameter(torch.zeros(4, 16, dtype=torch.uint8), requires_grad=False)

    def load_weights(self, weights):
        for name, t in weights:
            getattr(self, name).data.copy_(t.view(torch.uint8))
        return {"scale", "raw"}


def test_a_copy_of_a_view_as_another_dtype_of_the_same_size_is_direct_and_replays_as_that_dtype():
    plan = dry_run(Viewing(), [Info("scale", "F8_E8M0", (4, 8)), Info("raw", "BF16", (4, 8))])
    assert set(plan.direct) == {"scale"}
    assert plan.copies["scale"][0][4] == torch.uint8
    assert "copied as torch.uint8" in plan.streamed["raw"]


def test_the_dry_run_says_which_copies_the_loader_reads_afterwards():
    """Finalizing reads w (and v) after their copies, to compute `mixed`: a rank may not
    read w in the background while load_weights runs (Ownership.local)."""
    plan = dry_run(Finalizing(), [Info("w", "BF16", (4, 8)), Info("v", "BF16", (4, 8))])
    assert plan.read_after == {"w"}   # v is not direct (arithmetic), so no copy of it is recorded
    plan = dry_run(Model(), _infos(_checkpoint()))
    assert plan.read_after == set()   # Model's loader only copies (a renorm would read)


# ---- never silent (loader._say_what_goes_whole): what a rank's model takes
# whole through load_weights is named with the dry run's reason; expert
# parallelism under which no rank's dry run found an expert another holds is
# a warning, not a silent n-fold delivery.
def test_what_goes_whole_is_named_and_ep_without_experts_found_is_a_warning():
    from types import SimpleNamespace
    from sluice.vllm.loader import _say_what_goes_whole
    from sluice.vllm.world import Ownership

    class Log:
        def __init__(self):
            self.lines = []

        def info(self, fmt, *a):
            self.lines.append(("info", fmt % a))

        def warning(self, fmt, *a):
            self.lines.append(("warning", fmt % a))

    ck = SimpleNamespace(location="/ck", tensor_bytes=3 << 20,
                         tensors=[SimpleNamespace(name=n, nbytes=1 << 20) for n in ("e.0.w1", "e.1.w1", "norm")])
    plan = SimpleNamespace(streamed={"e.0.w1": "converted to another dtype", "e.1.w1": "converted to another dtype"})
    everyone = {"e.0.w1": [0, 1], "e.1.w1": [0, 1], "norm": [0, 1]}
    ep_on = SimpleNamespace(enable_expert_parallel=True)
    own = Ownership(everyone, set(), {}, direct={"norm"}, plan=plan, rank=0)
    log = Log()
    said = _say_what_goes_whole(own, ck, 0, 2, ep_on, log)
    assert said and "expert parallelism is on" in said and "/ck" in said
    assert log.lines[0][0] == "info" and "2 tensor(s)" in log.lines[0][1] and "e.0.w1 (converted to another dtype)" in log.lines[0][1]
    assert log.lines[1] == ("warning", said)
    # An expert on one rank only, or a tensor cut in parts: experts were found.
    found = Ownership({**everyone, "e.1.w1": [1]}, set(), {}, direct={"norm", "e.0.w1"}, plan=plan, rank=0)
    assert _say_what_goes_whole(found, ck, 0, 2, ep_on, Log()) is None
    cut = Ownership(everyone, set(), {}, splits={"e.0.w1": (0, 2, {0: 0, 1: 1}, 1)}, direct=set(everyone), plan=plan, rank=0)
    log = Log()
    assert _say_what_goes_whole(cut, ck, 0, 2, ep_on, log) is None and log.lines == []   # nothing whole, nothing said
    assert _say_what_goes_whole(own, ck, 0, 2, SimpleNamespace(enable_expert_parallel=False), Log()) is None
