#pragma once
/// \file
/// The load plan: computed once from tensor metadata, a topology and an
/// offload strategy; the run-time path (sluice/distributed.hpp) reads only the
/// plan, so no policy template reaches a channel element type.
///
/// For every tensor, in file order, the plan holds its owners, the byte
/// ranges each reader reads (one range, or slices: cooperative tables,
/// TP parts, blocks of rows, tensors above `split_bytes`), each owner's
/// destination and TP part, its place in the node's shared segment, and the
/// window it is exchanged in. Each exchange message carries bytes from their
/// reader to one rank that keeps them, and only to such ranks: a rank
/// receives its TP part of a split tensor, not the whole.
///
/// Pipeline stages (PP > 1): stage k is ranks [k*TP*DP, (k+1)*TP*DP) and owns
/// a contiguous range of layers (the layer index comes from the name, see
/// classify_options::layer_pattern); layer-less tensors go with the first
/// stage (embeddings), the last (final norm, lm_head) or every stage
/// (anything else). A tensor's owners and readers are ranks of its stage(s).
///
/// Validation happens here, before any I/O: experts that do not spread
/// evenly over EP, more stages than layers, layers that PP does not divide
/// (when `even_pp_stages` asks for it) or an explicit stage split that does not
/// add up are config_errors naming the numbers.
#include <algorithm>
#include <map>
#include <memory>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/error.hpp>
#include <sluice/policy/classify.hpp>
#include <sluice/policy/concepts.hpp>
#include <sluice/policy/offload.hpp>
#include <sluice/policy/reader_assignment.hpp>
#include <sluice/policy/topology.hpp>

namespace sluice::inline v0::policy {

/// Where routed experts go among a stage's EP ranks (vLLM's
/// `--expert-placement-strategy`, whose two names parse_expert_placement takes).
enum class expert_placement : std::uint8_t {
  linear,       ///< contiguous blocks: expert e on EP rank e * EP / E
  round_robin,  ///< interleaved: expert e on EP rank e % EP
};

/// "linear" or "round_robin" (also "round-robin"); config_error names anything else.
[[nodiscard]] inline expert_placement parse_expert_placement(std::string_view s) {
  if (s == "linear") return expert_placement::linear;
  if (s == "round_robin" || s == "round-robin") return expert_placement::round_robin;
  throw config_error(fmt::format("expert placement '{}': expected linear or round_robin", s));
}

/// One tensor's owners as the engine's own model says (plan_options::model_owners).
struct model_owner {
  std::vector<rank_t> ranks;  ///< the ranks whose model takes bytes of it (none: no model needs it)
  /// How they share it: each keeps it whole (none), or `parts` equal blocks
  /// of dimension 0 (rows) or 1 (columns), ranks[i] keeping block part[i];
  /// every block is kept by some rank.
  tp_split split = tp_split::none;
  std::uint32_t parts = 1;
  std::vector<std::uint32_t> part;
  /// The split dimension as `groups` equal runs, each cut into `parts`
  /// blocks, ranks[i] keeping block part[i] of every run: a fused tensor
  /// (gate and up, LFM2's in_proj) whose layer narrows each run. 1: one run.
  std::uint32_t groups = 1;
  /// Runs of dimension 0 of unequal sizes instead, in rows (each a multiple
  /// of `parts`, summing to the dimension): a QKV of grouped-query
  /// attention, q's rows then k's then v's. Empty: `groups` equal runs.
  std::vector<std::uint64_t> run_rows;
};

/// The most memfds a node's shared segment is made of (load_plan::segment_pieces).
inline constexpr std::size_t max_segment_pieces = 64;

/// Knobs of plan computation.
struct plan_options {
  std::size_t local_size = 0;                          ///< ranks per node (0: the whole world is one node)
  std::uint64_t window_bytes = std::uint64_t{256} << 20;  ///< bytes of non-shared tensors per exchange window
  std::uint64_t split_bytes = std::uint64_t{64} << 20;    ///< replicated tensors above this are read in slices by several ranks
  std::uint64_t slice_alignment = 4096;                ///< slice boundaries (within a tensor) are multiples of this
  std::uint64_t segment_alignment = 4096;              ///< tables start at multiples of this in the shared segment
  /// The shared segment's pieces per local rank (load_plan::segment_pieces):
  /// a writer of the node fills that many memfds at once, one per thread.
  std::size_t segment_lanes = 4;
  /// PP > 1: layers per stage, in stage order (empty: split evenly, the
  /// remainder going to the stages before the last, as vLLM's get_pp_indices).
  std::vector<std::size_t> pp_stage_layers;
  /// PP > 1: require PP to divide the number of layers.
  bool even_pp_stages = false;
  /// Accept routed experts that do not spread evenly over EP (neither the
  /// experts per layer nor EP a multiple of the other): some EP ranks then
  /// hold one expert more than others.
  bool uneven_experts = false;
  /// Which EP rank holds each routed expert.
  expert_placement experts = expert_placement::linear;
  /// TP > 1: a tensor the classifier would split (row- or column-sliced) whose
  /// dimension TP does not divide. false (the default): make_plan throws
  /// config_error naming every such tensor, before any read. true: each is
  /// kept whole by every owner, and load_plan::kept_whole lists them (the
  /// tools print them in their summary).
  bool uneven_tp_keep_whole = false;
  /// Owners from the engine's own model: tensor name -> the ranks whose
  /// model takes bytes of it, and which (each rank's dry run of its
  /// load_weights, exchanged; python/sluice/vllm). A listed tensor's owners
  /// are these ranks, whatever its name says (no class, expert, layer or TP
  /// rule of the classifier applies to it): it is read by one of them and
  /// sent only to the others, whole or each owner's part. Listed with no
  /// rank: no model needs it, so it is neither read nor sent
  /// (load_plan::unowned_bytes). Unlisted tensors follow the classifier.
  /// Every rank must pass the same map.
  std::shared_ptr<const std::map<std::string, model_owner>> model_owners;
};

/// One read from storage: bytes [offset, offset + size) of a tensor, by `reader`.
struct planned_read {
  std::uint64_t offset = 0;  ///< within the tensor
  std::uint64_t size = 0;
  rank_t reader = 0;
  bool exchanged = false;    ///< some of its bytes travel to other ranks (load_plan::for_each_message)
};

/// One message of a window's exchange: bytes of `read` (for a column-split
/// tensor: TP part `part` of the read's rows, packed) that rank `to` keeps at
/// offset `at` of its part of the tensor.
struct planned_message {
  std::size_t read = 0;  ///< index in plan_entry::reads
  rank_t to = 0;
  std::uint64_t size = 0;
  std::uint64_t at = 0;  ///< in the receiver's kept bytes of the tensor
  std::uint32_t part = 0;
};

/// A tensor's plan.
struct plan_entry {
  std::size_t index = 0;            ///< position in the input tensor list (file order)
  tensor_info info;
  rank_set owners;
  destination owner_destination = destination::device;  ///< where owners keep it
  std::vector<planned_read> reads;  ///< disjoint, in offset order, tiling the tensor (per node for shared tables)
  tp_split split = tp_split::none;  ///< TP > 1: how the owners share it (each keeps its TP part)
  /// A split the engine's model chose (plan_options::model_owners): the
  /// number of parts and each rank's part (empty: TP's, load_plan::tp_rank).
  std::uint32_t parts = 0;
  std::vector<std::uint32_t> part_of;
  /// A model's split of `groups` > 1 runs (model_owner::groups) along
  /// `group_dim`: carried as a column split of the tensor seen as its runs
  /// (load_plan::column_rows), each rank's block of every run packed in
  /// order. 0: not grouped.
  std::uint32_t groups = 0, group_dim = 0;
  /// Unequal runs (model_owner::run_rows): where each run ends, in bytes.
  std::vector<std::uint64_t> run_ends;
  std::uint64_t shared_offset = 0;  ///< shared_host: offset in the node's segment
  std::uint32_t window = 0;
  std::int32_t stage = -1;          ///< the pipeline stage that owns it; -1: every stage
  std::size_t first_message = 0;    ///< its messages: load_plan::messages[first_message, + message_count)
  std::size_t message_count = 0;

  [[nodiscard]] bool shared() const noexcept { return owner_destination == destination::shared_host; }
};

/// A computed plan (run-time data only): for every tensor, who owns it
/// (`owners`), who reads it (`reader`) and where each rank keeps it
/// (`destination`). The driver reads nothing else.
class load_plan {
 public:
  std::size_t tp = 1, dp = 1, ep = 1, pp = 1, world = 1, local_size = 1;
  offload_kind offload = offload_kind::none;
  std::uint64_t experts = 0;          ///< routed experts per layer (max index + 1)
  expert_placement experts_placed = expert_placement::linear;  ///< plan_options::experts
  std::uint64_t layers = 0;           ///< PP > 1: layer indices (max index + 1), else 0
  /// PP > 1: the first layer of each stage, and one past the last stage's (pp + 1 values).
  std::vector<std::uint64_t> pp_stage_begin;
  std::vector<plan_entry> entries;    ///< in file order
  std::uint32_t windows = 0;
  std::uint64_t shared_bytes = 0;     ///< size of each node's shared segment
  /// Where each memfd of the segment starts (memory::shared_host's pieces):
  /// every local rank's range of it cut in plan_options::segment_lanes, at
  /// multiples of 2 MiB where the pieces are that large (else of 4 KiB).
  /// Under shared-cooperative, local rank k reads the bytes of its range
  /// (the k-th of local_size equal ranges of the segment) on every node, so
  /// that each piece has one writer.
  std::vector<std::uint64_t> segment_pieces;
  std::vector<std::uint64_t> read_bytes;  ///< storage bytes each rank reads
  std::uint64_t unowned_bytes = 0;    ///< bytes of tensors no rank's model takes (plan_options::model_owners): not read
  std::uint64_t unowned_tensors = 0;
  std::vector<std::uint64_t> sent_bytes;      ///< bytes each rank sends in the exchanges (per receiver)
  std::vector<std::uint64_t> received_bytes;  ///< bytes each rank receives in the exchanges
  /// Every exchange message, entry by entry (plan_entry::first_message):
  /// enumerated once, read by the counters above and by the schedule.
  std::vector<planned_message> messages;
  /// TP > 1 with plan_options::uneven_tp_keep_whole: the tensors that would be
  /// split but are kept whole because TP does not divide their dimension.
  std::vector<std::string> kept_whole;

  /// The node of a rank (ranks are grouped by host contiguously).
  [[nodiscard]] std::size_t node_of(rank_t r) const noexcept { return r / local_size; }
  [[nodiscard]] std::size_t nodes() const noexcept { return world / local_size; }
  /// Ranks per pipeline stage.
  [[nodiscard]] std::size_t pp_stage_size() const noexcept { return tp * dp; }
  /// The pipeline stage of a rank.
  [[nodiscard]] std::size_t pp_stage_of(rank_t r) const noexcept { return r / pp_stage_size(); }
  /// The TP rank of a rank (the part of a split tensor it keeps).
  [[nodiscard]] std::size_t tp_rank(rank_t r) const noexcept { return (r % pp_stage_size()) % tp; }
  /// The parts a split tensor is cut into: its model's, else TP.
  [[nodiscard]] std::size_t parts(const plan_entry& e) const noexcept { return e.parts ? e.parts : tp; }
  /// The part of a split tensor rank `r` keeps: its model's, else its TP rank.
  [[nodiscard]] std::size_t part_of(const plan_entry& e, rank_t r) const noexcept {
    return e.part_of.empty() ? tp_rank(r) : e.part_of[r];
  }
  /// Bytes rank `r` keeps of a tensor it owns: its part, or the whole tensor.
  [[nodiscard]] std::uint64_t kept_bytes(const plan_entry& e) const noexcept {
    return e.split == tp_split::none ? e.info.size : e.info.size / parts(e);
  }
  /// Where rank `r`'s part starts in the tensor (rows; 0 otherwise).
  [[nodiscard]] std::uint64_t kept_begin(const plan_entry& e, rank_t r) const noexcept {
    return e.split == tp_split::rows ? part_of(e, r) * kept_bytes(e) : 0;
  }
  /// Rows a column split cuts: dim 0's, or a grouped split's runs (along
  /// dim 0: one "row" a run; along dim 1: each row's runs).
  [[nodiscard]] static std::uint64_t column_rows(const plan_entry& e) noexcept {
    const std::uint64_t rows = e.info.shape.empty() ? 0 : e.info.shape[0];
    return e.groups == 0 ? rows : e.group_dim == 0 ? e.groups : rows * e.groups;
  }
  /// Bytes per row of a column-split tensor (column_rows) whose runs are equal.
  [[nodiscard]] static std::uint64_t row_bytes(const plan_entry& e) noexcept {
    const auto rows = column_rows(e);
    return rows == 0 ? e.info.size : e.info.size / rows;
  }
  /// A column split's runs, each kept as `parts` blocks (whole rows of dim
  /// 0, or a model's runs): how many, and where run `i` begins in bytes
  /// (run_begin(e, run_count(e)) is the tensor's size). Reads of a column
  /// split cover whole runs, so a reader cuts part k of each as block k.
  [[nodiscard]] static std::uint64_t run_count(const plan_entry& e) noexcept {
    return e.run_ends.empty() ? column_rows(e) : e.run_ends.size();
  }
  [[nodiscard]] static std::uint64_t run_begin(const plan_entry& e, std::uint64_t i) noexcept {
    if (e.run_ends.empty()) return i * row_bytes(e);
    return i == 0 ? 0 : e.run_ends[i - 1];
  }
  /// Where the run that begins at byte `at` ends.
  [[nodiscard]] static std::uint64_t run_end_at(const plan_entry& e, std::uint64_t at) noexcept {
    if (e.run_ends.empty()) return at + row_bytes(e);
    return *std::upper_bound(e.run_ends.begin(), e.run_ends.end(), at);
  }
  /// Whether rank `r` keeps the bytes of `read` as they lie in the file (it
  /// owns the tensor and, for a row split, the read is its part), so that its
  /// reader can read them straight into its kept bytes.
  [[nodiscard]] bool keeps_as_read(const plan_entry& e, const planned_read& rd, rank_t r) const noexcept {
    if (!e.owners.contains(r) || e.split == tp_split::columns) return false;
    if (e.split == tp_split::none) return true;
    return rd.offset >= kept_begin(e, r) && rd.offset + rd.size <= kept_begin(e, r) + kept_bytes(e);
  }
  /// The messages that carry `e`'s bytes from their reader to the other
  /// ranks that keep them (and to no other rank), in one order every rank
  /// agrees on (read, then TP part, then receiver). Shared tables: none.
  /// Enumerated once, by make_plan.
  [[nodiscard]] std::span<const planned_message> messages_of(const plan_entry& e) const noexcept {
    return std::span(messages).subspan(e.first_message, e.message_count);
  }
  /// Calls f(planned_message) for each of messages_of(e).
  template <class F>
  void for_each_message(const plan_entry& e, F&& f) const {
    for (const auto& m : messages_of(e)) f(m);
  }
  /// "tp1,dp8,ep8" (",pp2" appended when PP > 1)
  [[nodiscard]] std::string topology_string() const {
    return pp > 1 ? fmt::format("tp{},dp{},ep{},pp{}", tp, dp, ep, pp) : fmt::format("tp{},dp{},ep{}", tp, dp, ep);
  }

  [[nodiscard]] const plan_entry& entry(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) throw config_error(fmt::format("plan: no tensor '{}'", name));
    return entries[it->second];
  }
  [[nodiscard]] rank_set owners(const tensor_info& t) const { return entry(t.name).owners; }
  /// The rank that reads the tensor's first byte (tensors read in slices have several readers).
  [[nodiscard]] rank_t reader(const tensor_info& t) const {
    const auto& e = entry(t.name);
    return e.reads.empty() ? e.owners.members().front() : e.reads.front().reader;
  }
  [[nodiscard]] policy::destination destination(const tensor_info& t, rank_t r) const {
    const auto& e = entry(t.name);
    return e.owners.contains(r) ? e.owner_destination : destination::none;
  }
  /// Busiest reader's bytes over the mean.
  [[nodiscard]] double read_imbalance() const {
    const auto total = std::accumulate(read_bytes.begin(), read_bytes.end(), std::uint64_t{0});
    if (total == 0) return 1.0;
    const double mean = static_cast<double>(total) / static_cast<double>(read_bytes.size());
    return static_cast<double>(*std::max_element(read_bytes.begin(), read_bytes.end())) / mean;
  }
  void index() {
    by_name_.clear();
    for (std::size_t i = 0; i < entries.size(); ++i) by_name_.emplace(entries[i].info.name, i);
  }

 private:
  std::unordered_map<std::string, std::size_t> by_name_;
};

namespace detail {
// [begin, begin + size) cut into `parts` near-equal pieces whose inner cuts
// are multiples of `align` (empty pieces dropped): (offset, size) pairs.
inline std::vector<std::pair<std::uint64_t, std::uint64_t>> split_range(std::uint64_t begin, std::uint64_t size,
                                                                        std::size_t parts, std::uint64_t align) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::uint64_t prev = 0;
  for (std::size_t k = 1; k <= parts; ++k) {
    std::uint64_t cut = k == parts ? size : size / parts * k + size % parts * k / parts;  // no overflow
    if (k != parts && align > 1) cut = cut / align * align;
    cut = std::max(cut, prev);
    if (cut > prev) out.emplace_back(begin + prev, cut - prev);
    prev = cut;
  }
  return out;
}

// First layer of each stage (pp + 1 values), validated against `layers`.
inline std::vector<std::uint64_t> pp_stage_bounds(std::uint64_t layers, std::size_t pp, const plan_options& opt,
                                               const std::string& pattern) {
  if (layers == 0)
    throw config_error(fmt::format("plan: PP={} but no tensor name has a layer index (pattern '{}')", pp, pattern));
  if (layers < pp) throw config_error(fmt::format("plan: PP={} stages exceed the {} layers", pp, layers));
  std::vector<std::uint64_t> counts(pp, layers / pp);
  if (!opt.pp_stage_layers.empty()) {
    if (opt.pp_stage_layers.size() != pp)
      throw config_error(fmt::format("plan: {} stage layer counts given for PP={}", opt.pp_stage_layers.size(), pp));
    std::uint64_t sum = 0;
    for (auto n : opt.pp_stage_layers) {
      if (n == 0) throw config_error("plan: a pipeline stage of 0 layers");
      sum += n;
    }
    if (sum != layers)
      throw config_error(fmt::format("plan: stage layer counts add up to {}, the checkpoint has {} layers", sum, layers));
    counts.assign(opt.pp_stage_layers.begin(), opt.pp_stage_layers.end());
  } else if (layers % pp) {
    if (opt.even_pp_stages)
      throw config_error(fmt::format("plan: PP={} does not divide the {} layers (even_pp_stages)", pp, layers));
    for (std::size_t i = 2; i < layers % pp + 2; ++i) ++counts[pp - i];  // vLLM: the last stage has lm_head
  }
  std::vector<std::uint64_t> begin(pp + 1, 0);
  for (std::size_t k = 0; k < pp; ++k) begin[k + 1] = begin[k] + counts[k];
  return begin;
}

// The rank sets a plan draws owners and readers from, by name: a pipeline
// stage's ranks (`stage(-1)`: every rank), a node's ranks, and the ranks of a
// stage that keep TP part `part` (`keepers`).
class rank_sets {
 public:
  explicit rank_sets(const load_plan& p) {
    const auto world = p.world, stage_size = p.pp_stage_size();
    every_ = rank_set::all(world);
    for (std::size_t k = 0; k < p.pp; ++k) {
      rank_set s(world);
      for (std::size_t r = 0; r < stage_size; ++r) s.insert(static_cast<rank_t>(k * stage_size + r));
      stages_.push_back(std::move(s));
    }
    for (std::size_t n = 0; n < p.nodes(); ++n) {
      rank_set node(world);
      for (std::size_t r = 0; r < p.local_size; ++r) node.insert(static_cast<rank_t>(n * p.local_size + r));
      nodes_.push_back(std::move(node));
    }
    every_keepers_ = keepers_of(p, every_);
    for (const auto& s : stages_) stage_keepers_.push_back(keepers_of(p, s));
  }
  /// The ranks of pipeline stage `k` (-1: every stage, i.e. every rank).
  [[nodiscard]] const rank_set& stage(std::int32_t k) const {
    return k < 0 ? every_ : stages_.at(static_cast<std::size_t>(k));
  }
  /// The ranks of node `n`.
  [[nodiscard]] const rank_set& node(std::size_t n) const { return nodes_.at(n); }
  /// The ranks of stage `k` (-1: every stage) whose TP rank is `part`.
  [[nodiscard]] const rank_set& keepers(std::int32_t k, std::size_t part) const {
    return (k < 0 ? every_keepers_ : stage_keepers_.at(static_cast<std::size_t>(k))).at(part);
  }

 private:
  static std::vector<rank_set> keepers_of(const load_plan& p, const rank_set& ranks) {
    std::vector<rank_set> by_part(p.tp, rank_set(p.world));
    for (auto q : ranks.members()) by_part[p.tp_rank(q)].insert(q);
    return by_part;
  }
  rank_set every_;
  std::vector<rank_set> stages_, nodes_;
  std::vector<rank_set> every_keepers_;
  std::vector<std::vector<rank_set>> stage_keepers_;
};

// Pass 1, classify: every tensor's class (and, under PP > 1, its layer); the
// routed experts per layer, the layers and the stages' bounds; the checks
// that need only these (experts over EP, stages over layers).
inline void classify_tensors(load_plan& p, std::vector<tensor_info>& tensors, const classifier& cls,
                             const plan_options& opt) {
  for (auto& t : tensors) {
    if (opt.model_owners && opt.model_owners->contains(t.name)) {
      t.cls = tensor_class::replicated;   // its owners are the model's: no name rule applies
      t.expert = -1;
      continue;
    }
    cls.classify(t);
    if (t.cls == tensor_class::routed_expert) p.experts = std::max<std::uint64_t>(p.experts, static_cast<std::uint64_t>(t.expert) + 1);
    if (p.pp > 1) {
      cls.layer(t);
      if (t.layer >= 0) p.layers = std::max<std::uint64_t>(p.layers, static_cast<std::uint64_t>(t.layer) + 1);
    }
  }
  if (p.experts && p.experts % p.ep && p.ep % p.experts && !opt.uneven_experts)
    throw config_error(fmt::format("plan: {} routed experts per layer do not spread evenly over EP={} "
                                   "(neither is a multiple of the other)", p.experts, p.ep));
  if (p.pp > 1) p.pp_stage_begin = pp_stage_bounds(p.layers, p.pp, opt, cls.options().layer_pattern);
}

// The pipeline stage that owns tensor `t` (-1: every stage): its layer's
// stage, or the stage its name anchors it to.
inline std::int32_t stage_of(const load_plan& p, const tensor_info& t, const classifier& cls) {
  if (p.pp == 1) return -1;
  if (t.layer >= 0) {
    const auto it = std::upper_bound(p.pp_stage_begin.begin(), p.pp_stage_begin.end(), static_cast<std::uint64_t>(t.layer));
    return static_cast<std::int32_t>(it - p.pp_stage_begin.begin() - 1);
  }
  switch (cls.anchor(t)) {
    case pp_anchor::first: return 0;
    case pp_anchor::last: return static_cast<std::int32_t>(p.pp - 1);
    case pp_anchor::every: break;
  }
  return -1;
}

// The owners of a routed expert: in each of its stages, the ranks whose EP
// rank holds it (p.experts_placed: linear, E/EP contiguous experts per EP
// rank; round_robin, expert e on EP rank e % EP).
inline rank_set expert_owners(const load_plan& p, const tensor_info& t, std::int32_t stage) {
  const auto expert = static_cast<std::uint64_t>(t.expert);
  const auto block = static_cast<std::size_t>(p.experts_placed == expert_placement::round_robin ? expert % p.ep
                                                                                               : expert * p.ep / p.experts);
  rank_set owners(p.world);
  for (std::size_t k = 0; k < p.pp; ++k)
    if (stage < 0 || static_cast<std::size_t>(stage) == k)
      for (std::size_t r = block; r < p.pp_stage_size(); r += p.ep) owners.insert(static_cast<rank_t>(k * p.pp_stage_size() + r));
  return owners;
}

// Where owners keep a tensor of class `c` under offload `off`.
inline destination owner_destination(tensor_class c, offload_kind off) noexcept {
  if (c != tensor_class::shared_table || off == offload_kind::none) return destination::device;
  return off == offload_kind::per_rank_host ? destination::host : destination::shared_host;
}

// A tensor's owners and split as the engine's model says (plan_options::
// model_owners), checked: a rank outside the world, a part outside the
// count, a block no rank keeps or a count that does not divide the split
// dimension is a config_error naming the tensor.
inline void place_by_model(const load_plan& p, plan_entry& e, const model_owner& m) {
  const auto name = printable(e.info.name, 256);
  e.owners = rank_set(p.world);
  e.stage = -1;
  for (const auto r : m.ranks) {
    if (r >= p.world)
      throw config_error(fmt::format("plan: the model's owners of tensor '{}' name rank {}, outside the world of {}", name, r, p.world));
    e.owners.insert(r);
  }
  if (m.split == tp_split::none || m.parts <= 1) return;
  const auto dim = m.split == tp_split::rows ? 0u : 1u;
  const std::uint64_t cut = std::uint64_t{m.parts} * (m.run_rows.empty() ? std::max<std::uint32_t>(m.groups, 1) : 1);
  if (e.info.shape.size() <= dim || e.info.shape[dim] % cut || e.info.size % cut)
    throw config_error(fmt::format("plan: the model splits tensor '{}' into {} parts{} along dimension {}, which does not divide it",
                                   name, m.parts, m.groups > 1 ? fmt::format(" of each of {} runs", m.groups) : "", dim));
  if (m.part.size() != m.ranks.size())
    throw config_error(fmt::format("plan: the model's split of tensor '{}' gives {} parts for {} owners", name, m.part.size(), m.ranks.size()));
  e.split = m.split;
  e.parts = m.parts;
  if (m.groups > 1 || !m.run_rows.empty()) {  // block k of every run: a column split of the tensor seen as its runs
    e.split = tp_split::columns;
    e.groups = m.run_rows.empty() ? m.groups : static_cast<std::uint32_t>(m.run_rows.size());
    e.group_dim = dim;
    if (!m.run_rows.empty()) {
      if (dim != 0) throw config_error(fmt::format("plan: the model's runs of unequal size of tensor '{}' are along dimension 1 (0 only)", name));
      const auto row = e.info.size / e.info.shape[0];
      std::uint64_t rows = 0;
      for (const auto n : m.run_rows) {
        if (n == 0 || n % m.parts || n > e.info.shape[0] - rows)
          throw config_error(fmt::format("plan: the model's runs of tensor '{}' ({} rows) do not cut its {} rows into runs of "
                                         "whole blocks of {} parts", name, n, e.info.shape[0], m.parts));
        rows += n;
        e.run_ends.push_back(rows * row);
      }
      if (rows != e.info.shape[0])
        throw config_error(fmt::format("plan: the model's runs of tensor '{}' cover {} of its {} rows", name, rows, e.info.shape[0]));
    }
  }
  e.part_of.assign(p.world, 0);
  std::vector<bool> kept(m.parts, false);
  for (std::size_t i = 0; i < m.ranks.size(); ++i) {
    if (m.part[i] >= m.parts)
      throw config_error(fmt::format("plan: the model gives rank {} part {} of tensor '{}', which has {}", m.ranks[i], m.part[i], name, m.parts));
    e.part_of[m.ranks[i]] = m.part[i];
    kept[m.part[i]] = true;
  }
  if (const auto gap = std::find(kept.begin(), kept.end(), false); gap != kept.end())
    throw config_error(fmt::format("plan: no rank keeps part {} of {} of tensor '{}'", gap - kept.begin(), m.parts, name));
}

// Pass 2, owners and split: one entry per tensor, in file order, with its
// stage, owners, destination and TP split; a tensor the classifier would
// split but TP does not divide goes to p.kept_whole.
inline void place_tensors(load_plan& p, std::vector<tensor_info>& tensors, const classifier& cls, const rank_sets& sets,
                          const plan_options& opt) {
  p.entries.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    plan_entry e;
    e.index = i;
    e.info = std::move(tensors[i]);
    if (opt.model_owners) {
      if (const auto it = opt.model_owners->find(e.info.name); it != opt.model_owners->end()) {
        place_by_model(p, e, it->second);
        p.entries.push_back(std::move(e));
        continue;
      }
    }
    e.stage = stage_of(p, e.info, cls);
    e.owners = e.info.cls == tensor_class::routed_expert ? expert_owners(p, e.info, e.stage) : sets.stage(e.stage);
    e.owner_destination = owner_destination(e.info.cls, p.offload);
    // TP parts: replicated weights, and routed experts when there is no
    // expert parallelism (EP=1: every TP rank holds a part of every expert).
    if (p.tp > 1 && (e.info.cls == tensor_class::replicated || (e.info.cls == tensor_class::routed_expert && p.ep == 1))) {
      e.split = cls.split(e.info, p.tp);
      if (e.split == tp_split::none && e.info.size && (cls.row_sliced(e.info) || cls.column_sliced(e.info)))
        p.kept_whole.push_back(e.info.name);
    }
    p.entries.push_back(std::move(e));
  }
}

// A read whose reader the balancer picks from `eligible`.
struct pending_read {
  std::size_t entry = 0, read = 0;
  const rank_set* eligible = nullptr;
};

// What pass 3 leaves to pass 4: routed experts read whole (by one of their
// owners, placed first), and every other read that has no forced reader.
struct pending_reads {
  std::vector<std::size_t> experts;  // entries, file order
  std::vector<pending_read> balanced;
  std::vector<std::unique_ptr<rank_set>> keepers;  // the eligible sets of a model's parts (stable addresses)
};

// The shared segment's layout: each table's offset (multiples of
// segment_alignment, in file order), its size, and its pieces: local_size
// writer ranges, each cut in segment_lanes pieces. A cut falls on a multiple
// of 2 MiB where the pieces are at least that large (huge pages can map
// them), else of 4 KiB; empty pieces are dropped. Returns the non-empty
// writer ranges, in order: the k-th is local rank k's (a segment smaller than
// local_size alignments has fewer, and the last local ranks write none).
inline std::vector<std::pair<std::uint64_t, std::uint64_t>> plan_segment(load_plan& p, const plan_options& opt) {
  std::uint64_t seg = 0;
  for (auto& e : p.entries)
    if (e.shared() && e.info.size > 0 && !e.owners.empty()) {
      e.shared_offset = seg;
      seg = (seg + e.info.size + opt.segment_alignment - 1) / opt.segment_alignment * opt.segment_alignment;
    }
  p.shared_bytes = seg;
  p.segment_pieces.clear();
  if (seg == 0) return {};
  // At most max_segment_pieces in all (one handoff message's descriptors):
  // past that many local ranks, writers share pieces.
  const std::size_t lanes = std::clamp<std::size_t>(opt.segment_lanes, 1, std::max<std::size_t>(1, max_segment_pieces / p.local_size));
  const std::size_t pieces = std::min(p.local_size * lanes, max_segment_pieces);
  const std::uint64_t align = seg / pieces >= (std::uint64_t{2} << 20) ? std::uint64_t{2} << 20 : 4096;
  const auto writers = split_range(0, seg, p.local_size, align);
  if (p.local_size * lanes <= max_segment_pieces) {
    for (auto [at, n] : writers)
      for (auto [b, m] : split_range(at, n, lanes, align)) p.segment_pieces.push_back(b);
  } else {
    for (auto [b, m] : split_range(0, seg, pieces, align)) p.segment_pieces.push_back(b);
  }
  return writers;
}

// Pass 3, reads: the byte ranges of each tensor and the ranks each may be
// read by; the shared tables' places in the node's segment. Cooperative
// slices get their (forced) reader here.
inline pending_reads plan_reads(load_plan& p, const rank_sets& sets, const plan_options& opt) {
  pending_reads out;
  // Local rank k of each node writes the k-th range of the segment: the
  // bytes of the tables that lie in it (shared-cooperative).
  const auto writers = plan_segment(p, opt);
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    auto& e = p.entries[i];
    const auto size = e.info.size;
    if (size == 0) continue;
    if (e.owners.empty()) {   // no rank's model takes it: not read (plan_options::model_owners)
      p.unowned_bytes += size;
      ++p.unowned_tensors;
      continue;
    }
    auto add_read = [&e](std::uint64_t at, std::uint64_t n) { e.reads.push_back({at, n, 0, false}); };
    auto balance = [&](const rank_set& eligible) { out.balanced.push_back({i, e.reads.size() - 1, &eligible}); };
    if (e.info.cls == tensor_class::routed_expert && e.split == tp_split::none) {
      add_read(0, size);  // read by an owner (pass 4)
      out.experts.push_back(i);
    } else if (e.shared()) {
      for (std::size_t n = 0; n < p.nodes(); ++n) {
        if (p.offload == offload_kind::shared_cooperative) {
          for (std::size_t k = 0; k < writers.size(); ++k) {
            const auto [at, len] = writers[k];
            const auto b = std::max(at, e.shared_offset), end = std::min(at + len, e.shared_offset + size);
            if (b >= end) continue;
            add_read(b - e.shared_offset, end - b);
            e.reads.back().reader = static_cast<rank_t>(n * p.local_size + k);
          }
        } else {
          add_read(0, size);
          balance(sets.node(n));
        }
      }
    } else if (e.split == tp_split::rows) {
      // One read per part, by a rank that keeps it (with DP > 1, the
      // other replicas of that part receive it).
      const auto n = p.parts(e), part = size / n;
      for (std::size_t k = 0; k < n; ++k) {
        add_read(k * part, part);
        if (e.part_of.empty()) {
          balance(sets.keepers(e.stage, k));
        } else {
          auto& keep = *out.keepers.emplace_back(std::make_unique<rank_set>(p.world));
          for (auto q : e.owners.members())
            if (e.part_of[q] == k) keep.insert(q);
          balance(keep);
        }
      }
    } else if (e.split == tp_split::columns) {
      // Whole rows (every part's columns), in blocks of rows across the
      // owners when large; the reader slices them (load_plan::for_each_message).
      const std::size_t parts = size > opt.split_bytes ? e.owners.size() : 1;
      for (auto [r0, n] : split_range(0, load_plan::run_count(e), parts, 1)) {
        const auto at = load_plan::run_begin(e, r0);
        add_read(at, load_plan::run_begin(e, r0 + n) - at);
        balance(e.owners);
      }
    } else {
      const std::size_t parts = size > opt.split_bytes ? e.owners.size() : 1;
      for (auto [so, len] : split_range(0, size, parts, opt.slice_alignment)) {
        add_read(so, len);
        balance(e.owners);
      }
    }
  }
  return out;
}

// Pass 4, readers: forced readers are charged first (cooperative slices),
// then each routed expert goes to the least-loaded of its owners (largest
// first), then every other read, largest first, to the least-loaded rank
// it may be read by (reader_balancer: LPT).
inline void assign_readers(load_plan& p, pending_reads pending) {
  reader_balancer bal(p.world);
  if (p.offload == offload_kind::shared_cooperative)
    for (const auto& e : p.entries)
      if (e.shared())
        for (const auto& r : e.reads) bal.charge(r.reader, r.size);
  std::stable_sort(pending.experts.begin(), pending.experts.end(),
                   [&](auto a, auto b) { return p.entries[a].info.size > p.entries[b].info.size; });
  for (auto i : pending.experts) p.entries[i].reads[0].reader = bal.assign(p.entries[i].owners, p.entries[i].info.size);
  std::stable_sort(pending.balanced.begin(), pending.balanced.end(), [&](const pending_read& a, const pending_read& b) {
    return p.entries[a.entry].reads[a.read].size > p.entries[b.entry].reads[b.read].size;
  });
  for (const auto& g : pending.balanced) {
    auto& r = p.entries[g.entry].reads[g.read];
    r.reader = bal.assign(*g.eligible, r.size);
  }
  p.read_bytes.assign(p.world, 0);
  for (const auto& e : p.entries)
    for (const auto& r : e.reads) p.read_bytes[r.reader] += r.size;
}

// Pass 5, windows: the non-shared tensors cut into windows of about
// `window_bytes`, in file order (a larger tensor is a window of its own);
// a shared table takes the number of the window it falls in.
inline void cut_windows(load_plan& p, const plan_options& opt) {
  std::uint64_t acc = 0;
  p.windows = 0;
  for (auto& e : p.entries) {
    if (!e.shared()) {
      if (acc > 0 && acc + e.info.size > opt.window_bytes) {
        ++p.windows;
        acc = 0;
      }
      acc += e.info.size;
    }
    e.window = p.windows;
  }
  p.windows += 1;
}

// The messages that carry `e`'s bytes from their reader to the other ranks
// that keep them, in the order every rank agrees on (read, then TP part, then
// receiver). Shared tables: none.
inline void enumerate_messages(const load_plan& p, const plan_entry& e, std::vector<planned_message>& out) {
  if (e.shared()) return;
  const auto owners = e.owners.members();
  for (std::size_t k = 0; k < e.reads.size(); ++k) {
    const auto& rd = e.reads[k];
    if (e.split == tp_split::columns) {
      // Whole runs, each cut in n blocks: part k of them is rd.size / n
      // bytes, at rd.offset / n of the keeper's part.
      const auto n = p.parts(e);
      for (std::uint32_t part = 0; part < n; ++part)
        for (auto q : owners)
          if (q != rd.reader && p.part_of(e, q) == part) out.push_back(planned_message{k, q, rd.size / n, rd.offset / n, part});
    } else {
      for (auto q : owners)
        if (q != rd.reader && p.keeps_as_read(e, rd, q))
          out.push_back(planned_message{k, q, rd.size, rd.offset - p.kept_begin(e, q), static_cast<std::uint32_t>(p.part_of(e, q))});
    }
  }
}

// Pass 6, messages: every exchange message of the plan, enumerated once and
// stored (load_plan::messages; the schedule and the counters read them),
// with each read's `exchanged` flag and the bytes each rank sends and receives.
inline void plan_messages(load_plan& p) {
  p.messages.clear();
  p.sent_bytes.assign(p.world, 0);
  p.received_bytes.assign(p.world, 0);
  for (auto& e : p.entries) {
    e.first_message = p.messages.size();
    enumerate_messages(p, e, p.messages);
    e.message_count = p.messages.size() - e.first_message;
    for (const auto& m : p.messages_of(e)) {
      auto& rd = e.reads[m.read];
      rd.exchanged = true;
      p.sent_bytes[rd.reader] += m.size;
      p.received_bytes[m.to] += m.size;
    }
  }
}

// TP does not divide the split dimension of p.kept_whole's tensors: an error
// naming them, unless the options keep them whole.
inline void check_kept_whole(const load_plan& p, const plan_options& opt) {
  if (p.kept_whole.empty() || opt.uneven_tp_keep_whole) return;
  std::string names;
  for (std::size_t i = 0; i < p.kept_whole.size() && i < 8; ++i) names += fmt::format("{}'{}'", i ? ", " : "", p.kept_whole[i]);
  if (p.kept_whole.size() > 8) names += fmt::format(" and {} more", p.kept_whole.size() - 8);
  throw config_error(fmt::format("plan: TP={} does not divide the split dimension of {} {} ({}); choose a TP that "
                                 "divides them, or keep them whole on every owner (plan_options::uneven_tp_keep_whole, "
                                 "sluice-load --uneven keep-whole)",
                                 p.tp, p.kept_whole.size(), p.kept_whole.size() == 1 ? "tensor" : "tensors", names));
}
}  // namespace detail

namespace detail {
// The passes of make_plan over a plan whose sizes are set (not a template:
// compiled once whatever the topology's type).
inline void plan_passes(load_plan& p, std::vector<tensor_info>& tensors, const classifier& cls, const plan_options& opt) {
  p.experts_placed = opt.experts;
  p.local_size = opt.local_size ? opt.local_size : p.world;
  if (p.world % p.local_size)
    throw config_error(fmt::format("plan: {} ranks per node do not divide the world of {}", p.local_size, p.world));
  classify_tensors(p, tensors, cls, opt);
  const rank_sets sets(p);
  place_tensors(p, tensors, cls, sets, opt);
  assign_readers(p, plan_reads(p, sets, opt));
  cut_windows(p, opt);
  plan_messages(p);
  check_kept_whole(p, opt);
  p.index();
}
}  // namespace detail

/// Computes the plan for `tensors` (metadata, file order; classes, and under
/// PP > 1 layers, are assigned here by `cls`) on `topo`. Throws config_error
/// for an inconsistent request. Six passes, each a function of the plan so
/// far (detail::classify_tensors, place_tensors, plan_reads, assign_readers,
/// cut_windows, plan_messages): classify → owners and split → reads →
/// readers → windows → messages. The windows' layouts and coalesced messages
/// for every rank are the schedule's (policy/schedule.hpp), computed from
/// this plan.
///
/// The topology's static sizes arrive as template arguments (a static
/// topology was checked when its type was formed, so nothing about it is
/// checked or parsed here); its dynamic ones were checked by its
/// constructor. Only the sizes are set per topology type: the passes are
/// compiled once.
template <std::size_t TP, std::size_t DP, std::size_t EP, std::size_t PP>
[[nodiscard]] load_plan make_plan(std::vector<tensor_info> tensors, const classifier& cls, const topology<TP, DP, EP, PP>& topo,
                                  offload_kind off, const plan_options& opt = {}) {
  load_plan p;
  p.tp = topo.tp(), p.dp = topo.dp(), p.ep = topo.ep(), p.pp = topo.pp(), p.world = topo.world_size(), p.offload = off;
  detail::plan_passes(p, tensors, cls, opt);
  return p;
}

/// The same for TP x DP with EP (one pipeline stage).
[[nodiscard]] inline load_plan make_plan(std::vector<tensor_info> tensors, const classifier& cls, std::size_t tp,
                                         std::size_t dp, std::size_t ep, offload_kind off, const plan_options& opt = {}) {
  return make_plan(std::move(tensors), cls, dynamic_topology(tp, dp, ep), off, opt);
}

/// Classified metadata of a checkpoint's tensors, in file order.
[[nodiscard]] inline std::vector<tensor_info> tensor_infos(const checkpoint& ck) {
  std::vector<tensor_info> v;
  v.reserve(ck.tensors().size());
  for (const auto& t : ck.tensors()) v.push_back(tensor_info::from(t));
  return v;
}

/// A model's shape where it is known at compile time: layer indices (the
/// draft/MTP layer included) and routed experts per layer, `dynamic` where
/// unknown; `EvenStages` asks PP to divide the layers.
template <std::size_t Layers = dynamic, std::size_t Experts = dynamic, bool EvenStages = false>
struct model_shape {
  static constexpr std::size_t layers = Layers, experts = Experts;
  static constexpr bool even_pp_stages = EvenStages;
};

/// A plan whose topology and offload strategy are types: a load_plan (the
/// run-time data the driver reads) that carries, in its type, the sizes and
/// strategy it was computed for, so that they reach the driver's front end
/// (load_distributed over a policy::plan checks its static world against the
/// communicator: at compile time where the communicator's type fixes its
/// size, comm::local; else before any collective). Made by `compute` or by
/// `plan_for(ck, Topology{}, Offload{})`; nothing in it is parsed.
///
///     const auto p = policy::plan<tp1_dp8_ep8, offload::shared_host<offload::cooperative>>::compute(tp1_dp8_ep8{}, ck);
///     static_assert(decltype(p)::static_world == 8);
///
/// `Shape` (model_shape<62, 256>) checks the sizes against the model at
/// compile time, and the tensors against the shape when computed.
template <class Topology, offload_strategy Offload, class Shape = model_shape<>>
class plan : public load_plan {
  static constexpr std::size_t ep_ = Topology::static_ep, pp_ = Topology::static_pp;
  static_assert(Shape::experts == dynamic || ep_ == dynamic || Shape::experts == 0 || Shape::experts % ep_ == 0 ||
                    ep_ % Shape::experts == 0,
                "sluice: EP must divide the routed experts per layer (or the experts EP)");
  static_assert(Shape::layers == dynamic || pp_ == dynamic || Shape::layers >= pp_,
                "sluice: PP must not exceed the number of layers");
  static_assert(!Shape::even_pp_stages || Shape::layers == dynamic || pp_ == dynamic || Shape::layers % pp_ == 0,
                "sluice: PP must divide the number of layers");

 public:
  using topology_type = Topology;
  using offload_type = Offload;
  using shape_type = Shape;
  /// The world size where every size of the topology is static, else `dynamic`.
  static constexpr std::size_t static_world = Topology::is_static ? Topology::static_tp * Topology::static_dp * Topology::static_pp
                                                                  : dynamic;
  /// The offload strategy, as a constant.
  static constexpr offload_kind static_offload = Offload::kind;

  /// Computes the plan of `tensors` for `topo` (sizes static or dynamic).
  /// Throws config_error when the tensors disagree with a static Shape.
  [[nodiscard]] static plan compute(const Topology& topo, std::vector<tensor_info> tensors,
                                    const classifier& cls = classifier::deepseek(), plan_options opt = {}) {
    if (Shape::even_pp_stages) opt.even_pp_stages = true;
    plan p(make_plan(std::move(tensors), cls, topo, Offload::kind, opt));
    if (Shape::experts != dynamic && p.experts != Shape::experts)
      throw config_error(fmt::format("plan: the model shape says {} routed experts per layer, the tensors have {}",
                                     Shape::experts, p.experts));
    if (Shape::layers != dynamic && p.pp > 1 && p.layers != Shape::layers)
      throw config_error(fmt::format("plan: the model shape says {} layers, the tensors have {}", Shape::layers, p.layers));
    return p;
  }
  [[nodiscard]] static plan compute(const Topology& topo, const checkpoint& ck,
                                    const classifier& cls = classifier::deepseek(), const plan_options& opt = {}) {
    return compute(topo, tensor_infos(ck), cls, opt);
  }

 private:
  explicit plan(load_plan p) : load_plan(std::move(p)) {}
};

}  // namespace sluice::inline v0::policy
