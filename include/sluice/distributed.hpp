#pragma once
/// \file
/// The distributed load: every rank reads only what the plan gives it, and
/// the window's collective delivers the rest.
///
/// 1. Every rank computes the same plan (policy/plan.hpp) from the
///    checkpoint's metadata and checks, with one small all-gather, that its
///    peers did too.
/// 2. Shared tables (offload shared-single / shared-cooperative): local rank 0
///    of each node creates the node's shared segment (memory/shared_host.hpp),
///    the others attach it; each rank reads its planned slices straight into it.
/// 3. Then, a window at a time (plan order): each rank reads its planned
///    slices through the pipeline (coalesce | fetch | stage | place) — the
///    bytes it keeps straight into its part of the window's buffer, what it
///    reads only for others into scratch; one exchange (point-to-point, over
///    the communicator's transport) carries each slice from its reader to the
///    ranks that keep it and to no other (a TP rank gets its part of a split
///    tensor; an expert travels only to its EP replicas; a stage's tensors
///    stay in the stage); finally every rank calls its sink for every tensor
///    of the window, in plan order. Double-buffered: window w+1 is read while
///    w's exchange runs on a helper thread (never on the io_context doing the
///    I/O), where the machine has the cores for it (distributed_options::overlap).
///
/// Every rank's sink sees the same sequence of calls (same names, same
/// order): owners get the bytes (`view_kind::bytes`; under TP > 1 a rank's
/// part of a split tensor, `tensor_view::part` saying which), non-owners a
/// `view_kind::metadata` placeholder (unless `placeholders` is off), and every
/// local rank a `view_kind::shared` view of a shared table in the segment.
///
/// Where the bytes come from is a parameter: the core driver
/// (`load_distributed_with`) takes a factory of a `slice_reader`, an object
/// that owns an io_context and a `source` and reads a batch of planned slices
/// through coalesce | fetch | stage | place into their destinations. The
/// overloads here read local files (`file_reader`: io_uring); those in
/// <sluice/source/s3_distributed.hpp> (link sluice::s3) read S3 objects at the
/// ETags the catalog pinned, through one connection pool per rank sized so
/// that the ranks of a node share the node's connections
/// (`distributed_options::connections_per_rank`). The reader is made inside
/// the failure protocol: a rank that cannot set up its I/O fails every rank.
///
/// Failure: after each phase the ranks exchange a status word; a rank that
/// failed (bad shard, S3 error, sink exception) makes every rank throw
/// `distributed_error` naming it and its error. A rank that dies makes the
/// others' next collective throw `comm::comm_error` within the communicator's
/// timeout. Collectives run between pipeline runs, never on the io_context.

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

#include <boost/asio/io_context.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/concepts.hpp>
#include <sluice/comm/local.hpp>
#include <sluice/comm/store.hpp>
#include <sluice/error.hpp>
#include <sluice/load_file.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/concepts.hpp>
#if defined(SLUICE_HAS_GLOO)
#include <sluice/comm/gloo.hpp>
#endif

namespace sluice::inline v0 {

/// Another rank (or this one) failed; every rank throws it.
class distributed_error : public error {
 public:
  distributed_error(std::string detail, std::size_t failed_rank)
      : error(std::move(detail)), failed_rank_(failed_rank) {}
  /// The lowest rank that reported a failure.
  [[nodiscard]] std::size_t failed_rank() const noexcept { return failed_rank_; }

 private:
  std::size_t failed_rank_;
};

/// Options of a distributed load.
struct distributed_options {
  load_options load;                 ///< per-rank pipeline knobs (staging budget, max_read, queue depth, io, stop)
  policy::plan_options plan;         ///< window size, local size, split threshold
  policy::classify_options classify = policy::classifier::deepseek().options();  ///< tensor classes
  bool placeholders = true;          ///< call the sink with a metadata view for tensors this rank does not own
  /// Whether window w+1 is read while window w's collective runs. Both use CPU
  /// (page-cache copies; TCP copies on loopback or a NIC without offload), so
  /// overlapping pays only when each local rank has cores to spare:
  /// `automatic` overlaps when the machine has at least two hardware threads
  /// per local rank. Measured on 2 cores (bench-distributed, 0.5 GiB, 128 MiB
  /// windows): 8 ranks load in 0.53 s serial vs 1.01 s overlapped.
  enum class overlap_mode : std::uint8_t { automatic, on, off } overlap = overlap_mode::automatic;
  /// S3 sources only: connections (pool size) of this rank's client. 0: the
  /// S3 config's `max_connections` counts for the node, and each of its
  /// `local_size` ranks gets max(1, max_connections / local_size): ranks on one
  /// node share its NIC (and the server's per-client limits).
  std::size_t connections_per_rank = 0;

  /// Whether `overlap` means overlapping with `local_ranks` ranks on this machine.
  [[nodiscard]] bool overlaps(std::size_t local_ranks) const noexcept {
    if (overlap != overlap_mode::automatic) return overlap == overlap_mode::on;
    return std::thread::hardware_concurrency() >= 2 * std::max<std::size_t>(1, local_ranks);
  }
};

/// What one rank did (see to_json()).
struct distributed_stats {
  std::size_t rank = 0, world = 1, local_rank = 0;
  std::string topology, offload;
  std::uint64_t tensors = 0;              ///< sink calls (placeholders included)
  std::uint64_t accepted = 0;             ///< calls the sink accepted
  std::uint64_t owned = 0;                ///< tensors this rank owns
  std::uint64_t placeholders = 0;         ///< metadata placeholders delivered
  std::uint64_t shared_views = 0;         ///< shared-segment views delivered
  std::uint64_t bytes_read = 0;           ///< tensor bytes this rank read from storage
  std::uint64_t storage_bytes = 0;        ///< bytes the source delivered (incl. O_DIRECT alignment)
  std::uint64_t requests = 0;             ///< reads (files) or GETs (S3) issued, retries included
  std::uint64_t planned_read_bytes = 0;   ///< what the plan gave this rank
  std::uint64_t bytes_sent = 0;           ///< bytes this rank contributed to collectives
  std::uint64_t bytes_received = 0;       ///< bytes this rank received by collectives
  std::uint64_t messages = 0;             ///< point-to-point messages it posted (sends + receives, coalesced)
  std::uint64_t shared_bytes = 0;         ///< size of the node's shared segment
  std::uint64_t shared_bytes_written = 0; ///< bytes this rank wrote into it
  std::uint32_t windows = 0;
  std::uint64_t connections = 0;          ///< S3: connections of this rank's client (0: local files)
  bool overlapped = false;                ///< window reads overlapped the collectives (distributed_options::overlap)
  double seconds = 0, setup_seconds = 0, read_seconds = 0, exchange_seconds = 0, deliver_seconds = 0;
  double table_seconds = 0;  ///< reading shared tables into the segment (included in read_seconds), barrier included

  [[nodiscard]] nlohmann::json to_json() const {
    return {{"rank", rank}, {"world_size", world}, {"local_rank", local_rank}, {"topology", topology},
            {"offload", offload}, {"tensors", tensors}, {"accepted", accepted}, {"owned", owned},
            {"placeholders", placeholders}, {"shared_views", shared_views}, {"bytes_read", bytes_read},
            {"storage_bytes", storage_bytes}, {"requests", requests}, {"planned_read_bytes", planned_read_bytes}, {"bytes_sent", bytes_sent},
            {"bytes_received", bytes_received}, {"messages", messages}, {"shared_bytes", shared_bytes},
            {"shared_bytes_written", shared_bytes_written}, {"windows", windows}, {"connections", connections}, {"overlapped", overlapped},
            {"seconds", {{"total", seconds}, {"setup", setup_seconds}, {"read", read_seconds},
                         {"exchange", exchange_seconds}, {"deliver", deliver_seconds}, {"tables", table_seconds}}}};
  }
};

/// A batch of planned reads: each a byte range of a shard (a tensor_ref of
/// its own: a slice of a tensor is read like a tensor) and where its bytes go.
using planned_reads = std::vector<std::pair<tensor_ref, std::span<std::byte>>>;

/// The data path of a distributed load. `read(reads)` reads every range of
/// the batch straight into its destination and returns once all arrived;
/// on failure it throws the first error (naming the file or object and the
/// range) after every read of the batch has completed, so no destination is
/// written after it returns. `counters().bytes_read` is what storage
/// delivered (distributed_stats::storage_bytes). A reader may also report
/// `connections()` (distributed_stats::connections). One thread uses it.
template <class R>
concept slice_reader = requires(R& r, const R& cr, planned_reads& reads) {
  { r.read(reads) } -> std::same_as<void>;
  { cr.counters() } -> std::same_as<const io_counters&>;
};

namespace detail {

// Copies staged views into their destination (direct reads arrive as `placed`).
struct destination_sink {
  std::unordered_map<const tensor_ref*, std::span<std::byte>> dest;
  bool accept(tensor_view v) {
    if (v.kind != view_kind::bytes || v.bytes.empty()) return true;
    auto d = dest.at(v.tensor);
    std::memcpy(d.data() + v.offset, v.bytes.data(), v.bytes.size());
    return true;
  }
};

template <source Source>
[[nodiscard]] task<int> read_into(std::vector<tensor_job> jobs, Source& src, destination_sink& s, staging_pool& pool,
                                   load_options opt) {
  const std::uint64_t max_read = std::min<std::uint64_t>(opt.max_read, pool.slot_size() - 2 * 4096);
  auto pipeline = coalesce({max_read ? max_read : 4096}) | fetch<Source>(src, pool, {opt.queue_depth}) | stage({false}) |
                  place<destination_sink>(s);
  co_await run_pipeline(pipeline, jobs, [](const placement&) {}, opt.stop);
  co_return 0;  // run_on wants a value
}

// Reads a batch through coalesce | fetch | stage | place on `ioc`, run by the
// calling thread (one thread: the pipeline and the source share it). Ranges
// of `stage_below` bytes or more are read straight into their destination;
// smaller ones into a staging slot, merged with file-adjacent ones into one
// request (up to max_read), and copied out.
template <source Source>
void read_slices(asio::io_context& ioc, Source& src, staging_pool& pool, const load_options& opt, planned_reads& reads,
                 std::uint64_t stage_below = 0) {
  destination_sink sink;
  std::vector<tensor_job> jobs;
  jobs.reserve(reads.size());
  for (auto& [ref, dst] : reads) {
    sink.dest.emplace(&ref, dst);
    jobs.push_back({&ref, ref.size < stage_below ? std::span<std::byte>{} : dst});
  }
  if (jobs.empty()) return;
  ioc.restart();
  (void)run_on(ioc, read_into(std::move(jobs), src, sink, pool, opt), 1);
}

// Every read of a distributed load has a destination (the segment or a
// window buffer): a reader's pool only needs slots for the reads it stages
// (`slots`, at least 2), not the whole budget.
inline staging_options reader_staging(const load_options& opt, std::size_t slots = 2) {
  const auto slot = slot_size_for(opt.max_read);
  return {std::min(opt.staging_budget, std::max<std::size_t>(2, slots) * slot), slot, opt.poison};
}

// A window buffer reused while no sink holds a view into it (a sink that
// keeps views gets a fresh buffer next window): no first-touch per window.
class window_buffer {
 public:
  lease get(std::size_t n) {
    if (n == 0) return {};
    if (!mem_ || mem_.use_count() > 1 || cap_ < n) {
      const std::size_t cap = (std::max(n, cap_) + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(4096, cap);
      if (!p) throw std::bad_alloc();
      ::madvise(p, cap, MADV_HUGEPAGE);  // a hint
      mem_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
      cap_ = cap;
    }
    return lease(mem_, {static_cast<std::byte*>(mem_.get()), n});
  }

 private:
  std::shared_ptr<void> mem_;
  std::size_t cap_ = 0;
};

// Where one rank's bytes of a window go: a pure function of the plan, so that
// a rank can compute its peers' layouts too (to coalesce messages, both ends
// of a pair must agree). Two regions: `kept` (its parts of the tensors it
// owns; its own reads and the messages it receives land there) and `scratch`
// (what it reads only for others, and packed column parts it sends).
struct window_layout {
  static constexpr std::size_t none = ~std::size_t{0};
  struct region_at {
    bool kept = true;
    std::size_t off = 0;
  };
  struct read_at { std::size_t entry, read; region_at at; };
  struct cut_at { std::size_t from; std::uint32_t part; region_at at; };  // TP part `part` of reads[from]
  struct message_at { std::uint32_t tag; std::size_t peer; region_at at; std::size_t size; bool send; };
  std::vector<std::size_t> kept_off;  // by entry - begin; none: not kept
  std::vector<read_at> reads;         // this rank's reads, plan order
  std::vector<cut_at> cuts;           // column parts cut from its reads (its own part, or packed for others)
  std::vector<message_at> messages;   // its ends of the window's messages, in tag order
  std::size_t kept_bytes = 0, scratch_bytes = 0;
};

inline window_layout layout_window(const policy::load_plan& plan, policy::rank_t me, std::size_t begin, std::size_t end) {
  using region_at = window_layout::region_at;
  window_layout L;
  L.kept_off.assign(end - begin, window_layout::none);
  // Kept parts grouped by who sends them (the reader of a tensor read in one
  // piece, and the set of ranks that read goes to), plan order within a
  // group: then what one reader sends one receiver in a window lies back to
  // back at both ends and travels as one message.
  struct keyed { policy::rank_t reader; std::uint64_t receivers; std::size_t entry; };
  std::vector<keyed> order;
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (e.shared() || !e.owners.contains(me)) continue;
    keyed k{static_cast<policy::rank_t>(plan.world), 0, i};
    if (e.reads.size() == 1 && e.split != policy::tp_split::columns) {
      k.reader = e.reads[0].reader;
      plan.for_each_message(e, [&k](const policy::planned_message& m) { k.receivers = k.receivers * 1099511628211ull + m.to + 1; });
    }
    order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(), [](const keyed& x, const keyed& y) {
    return x.reader != y.reader ? x.reader < y.reader : x.receivers < y.receivers;
  });
  for (const auto& k : order) L.kept_off[k.entry - begin] = L.kept_bytes, L.kept_bytes += plan.kept_bytes(plan.entries[k.entry]);
  std::uint32_t tag = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const auto& e = plan.entries[i];
    if (e.shared()) continue;
    const bool owned = e.owners.contains(me);
    const auto kept = L.kept_off[i - begin];
    const auto first = L.reads.size();
    for (std::size_t k = 0; k < e.reads.size(); ++k) {
      const auto& rd = e.reads[k];
      if (rd.reader != me) continue;
      if (plan.keeps_as_read(e, rd, me)) {
        L.reads.push_back({i, k, {true, kept + rd.offset - plan.kept_begin(e, me)}});
      } else {
        L.reads.push_back({i, k, {false, L.scratch_bytes}});
        L.scratch_bytes += rd.size;
      }
      if (e.split == policy::tp_split::columns && owned) {  // its own part of these rows
        const auto row = policy::load_plan::row_bytes(e);
        L.cuts.push_back({L.reads.size() - 1, static_cast<std::uint32_t>(plan.tp_rank(me)),
                          {true, kept + rd.offset / row * (row / plan.tp)}});
      }
    }
    plan.for_each_message(e, [&](const policy::planned_message& m) {
      const auto& rd = e.reads[m.read];
      if (rd.reader == me) {
        std::size_t from = first;  // this read among its reads
        while (L.reads[from].read != m.read) ++from;
        region_at src = L.reads[from].at;  // the bytes as read (no split, or a row split)
        if (e.split == policy::tp_split::columns) {
          if (owned && m.part == plan.tp_rank(me)) {
            src = {true, kept + m.at};  // its own part, cut from the rows
          } else {  // one packed copy of part m.part of these rows, for all its receivers
            auto& c = L.cuts;
            if (c.empty() || c.back().from != from || c.back().part != m.part) {
              c.push_back({from, m.part, {false, L.scratch_bytes}});
              L.scratch_bytes += m.size;
            }
            src = c.back().at;
          }
        }
        L.messages.push_back({tag, m.to, src, m.size, true});
      }
      if (m.to == me) L.messages.push_back({tag, rd.reader, {true, kept + m.at}, m.size, false});
      ++tag;
    });
  }
  return L;
}

// This rank's messages of the window, coalesced: consecutive messages of one
// pair (same direction) become one where they lie back to back at BOTH ends
// (the peer's layout is computed from the plan, so both ends decide alike).
// The merged message keeps the first one's tag.
inline std::vector<window_layout::message_at> window_messages(const policy::load_plan& plan, const window_layout& mine,
                                                              policy::rank_t me, std::size_t begin, std::size_t end) {
  std::unordered_map<std::size_t, window_layout> peers;
  for (const auto& m : mine.messages)
    if (!peers.contains(m.peer)) peers.emplace(m.peer, layout_window(plan, static_cast<policy::rank_t>(m.peer), begin, end));
  // The other end of each message: the peer's entry with the same tag.
  std::unordered_map<std::size_t, std::unordered_map<std::uint32_t, window_layout::region_at>> far;
  for (const auto& [peer, L] : peers)
    for (const auto& m : L.messages)
      if (m.peer == me) far[peer][m.tag] = m.at;
  std::vector<window_layout::message_at> out;
  std::unordered_map<std::size_t, std::size_t> last[2];  // by direction, peer: index in out
  std::unordered_map<std::size_t, window_layout::region_at> last_far[2];
  auto next_to = [](const window_layout::region_at& a, std::size_t n, const window_layout::region_at& b) {
    return a.kept == b.kept && a.off + n == b.off;
  };
  for (const auto& m : mine.messages) {
    const auto there = far.at(m.peer).at(m.tag);
    auto& l = last[m.send];
    auto& lf = last_far[m.send];
    if (auto it = l.find(m.peer); it != l.end()) {
      auto& prev = out[it->second];
      if (next_to(prev.at, prev.size, m.at) && next_to(lf.at(m.peer), prev.size, there)) {
        prev.size += m.size;
        continue;
      }
    }
    l[m.peer] = out.size();
    lf[m.peer] = there;
    out.push_back(m);
  }
  return out;
}

// One status record per rank: ok flag + message (truncated).
inline constexpr std::size_t status_bytes = 1024;

template <comm::communicator Comm>
void check_peers(Comm& c, std::exception_ptr& failure, std::string_view phase) {
  std::vector<std::byte> mine(status_bytes), all(status_bytes * c.size());
  if (failure) {
    std::string msg;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown error";
    }
    mine[0] = std::byte{1};
    std::memcpy(mine.data() + 1, msg.data(), std::min(msg.size(), status_bytes - 2));
  }
  c.all_gather(mine, all);
  for (std::size_t r = 0; r < c.size(); ++r) {
    if (all[r * status_bytes] == std::byte{0}) continue;
    const char* m = reinterpret_cast<const char*>(all.data() + r * status_bytes + 1);
    throw distributed_error(fmt::format("rank {} failed while {}: {}", r, phase, std::string(m, strnlen(m, status_bytes - 1))), r);
  }
}

inline std::uint64_t plan_digest(const policy::load_plan& p) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const auto& e : p.entries) {
    for (char ch : e.info.name) mix(static_cast<unsigned char>(ch));
    mix(e.info.size);
    for (const auto& r : e.reads) mix(r.reader), mix(r.offset);
  }
  mix(p.world), mix(p.windows), mix(static_cast<std::uint64_t>(p.offload));
  return h;
}

}  // namespace detail

/// The local-file data path of a distributed load (the default): an io_uring
/// `file_source` over the checkpoint's shards (`opt.io`, `opt.punt_buffered`,
/// `opt.ring_entries`), on an io_context of its own that `read` runs on the
/// calling thread, and a two-slot staging pool (reads go straight to their
/// destinations). Throws io_error if io_uring is unavailable.
class file_reader {
 public:
  file_reader(const checkpoint& ck, const load_options& opt) : opt_(opt) {
    ioc_ = std::make_unique<asio::io_context>(1);
    pool_ = std::make_unique<staging_pool>(detail::reader_staging(opt));
    ring_ = std::make_unique<uring_context>(*ioc_, uring_options{opt.ring_entries, opt.register_buffers});
    if (opt.register_buffers) ring_->register_buffers(pool_->region(), pool_->slot_size());
    std::vector<std::string> paths;
    for (const auto& sh : ck.shards()) paths.push_back(sh.uri);
    src_ = std::make_unique<file_source>(*ring_, std::move(paths), opt.io, opt.punt_buffered);
  }

  /// Reads the batch (see slice_reader).
  void read(planned_reads& reads) { detail::read_slices(*ioc_, *src_, *pool_, opt_, reads); }
  [[nodiscard]] const io_counters& counters() const noexcept { return src_->counters(); }

 private:
  load_options opt_;
  // Destroyed in reverse: the source before its ring, the ring before the io_context.
  std::unique_ptr<asio::io_context> ioc_;
  std::unique_ptr<staging_pool> pool_;
  std::unique_ptr<uring_context> ring_;
  std::unique_ptr<file_source> src_;
};

static_assert(slice_reader<file_reader>);

/// The driver, with the data path as a parameter: loads this rank's part of
/// `ck` into `s` per `plan`, exchanging the rest over `c`, reading through
/// the reader that `make_reader()` returns (a std::unique_ptr to a
/// slice_reader). It is called once, after the ranks agreed on the plan and
/// inside the failure protocol: if it throws on any rank, every rank throws
/// distributed_error naming that rank ("... while setting up I/O: ...").
/// Every rank must call it with the same checkpoint and plan. Throws
/// distributed_error (a rank failed), comm::comm_error (a peer is gone) or
/// config_error (the plan does not fit the world) — on every rank.
template <comm::communicator Comm, sink Sink, class MakeReader>
  requires slice_reader<typename std::invoke_result_t<MakeReader&>::element_type>
distributed_stats load_distributed_with(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                        const distributed_options& opt, MakeReader make_reader) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  const auto me = static_cast<policy::rank_t>(c.rank());
  distributed_stats st;
  st.rank = me, st.world = c.size(), st.local_rank = me % plan.local_size;
  st.topology = plan.topology_string();
  st.offload = std::string(policy::offload_name(plan.offload));
  st.planned_read_bytes = plan.read_bytes.at(me);
  st.windows = plan.windows;
  if (plan.world != c.size())
    throw config_error(fmt::format("the plan is for {} ranks, the communicator has {}", plan.world, c.size()));
  if (plan.entries.size() != ck.tensors().size())
    throw config_error(fmt::format("the plan has {} tensors, the checkpoint {}", plan.entries.size(), ck.tensors().size()));

  std::exception_ptr failure;
  // Every rank must have computed the same plan.
  {
    const std::uint64_t d = detail::plan_digest(plan);
    std::vector<std::byte> all(8 * c.size());
    c.all_gather(std::as_bytes(std::span(&d, 1)), all);
    for (std::size_t r = 0; r < c.size(); ++r)
      if (std::memcmp(all.data() + 8 * r, &d, 8) != 0 && !failure)
        failure = std::make_exception_ptr(config_error(fmt::format("rank {} computed a different load plan (checkpoint or options differ)", r)));
    detail::check_peers(c, failure, "comparing load plans");
  }

  // I/O set-up: one reader (io_context, staging pool, source) for every window.
  using reader_type = typename std::invoke_result_t<MakeReader&>::element_type;
  std::unique_ptr<reader_type> reader;
  try {
    reader = make_reader();
    if (!reader) throw config_error("load_distributed_with: the reader factory returned no reader");
    if constexpr (requires { reader->connections(); }) st.connections = reader->connections();
  } catch (...) {
    failure = std::current_exception();
  }
  detail::check_peers(c, failure, "setting up I/O");

  // Reads planned for this rank, as tensor_refs of their byte ranges (the
  // pipeline reads tensors; a slice is a tensor of its own here).
  std::uint64_t fetched = 0;
  auto run_reads = [&](planned_reads& reads) {
    for (const auto& r : reads) fetched += r.first.size;
    reader->read(reads);
  };
  auto slice_ref = [&ck](const policy::plan_entry& e, const policy::planned_read& r) {
    tensor_ref t = ck.tensors()[e.index];
    t.offset += r.offset;
    t.size = r.size;
    t.shape = {r.size};
    t.type = format::dtype::U8;
    return t;
  };

  // Shared segment: created by local rank 0 of each node, attached by the others.
  memory::shared_host segment;
  const bool shared = policy::is_shared(plan.offload) && plan.shared_bytes > 0;
  st.shared_bytes = shared ? plan.shared_bytes : 0;
  if (shared) {
    const auto setup0 = clock::now();
    constexpr std::size_t handle_bytes = 256;
    std::vector<std::byte> mine(handle_bytes), all(handle_bytes * c.size());
    if (st.local_rank == 0) {
      try {
        segment = memory::shared_host::create(plan.shared_bytes, fmt::format("sluice-shared-rank{}", me));
        const auto h = segment.handle();
        std::memcpy(mine.data(), h.data(), std::min(h.size(), handle_bytes - 1));
      } catch (...) {
        failure = std::current_exception();
      }
    }
    detail::check_peers(c, failure, "creating the shared segment");
    c.all_gather(mine, all);
    if (st.local_rank != 0) {
      try {
        const auto leader = me - st.local_rank;
        const char* h = reinterpret_cast<const char*>(all.data() + leader * handle_bytes);
        segment = memory::shared_host::attach(std::string(h, strnlen(h, handle_bytes)), plan.shared_bytes);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    detail::check_peers(c, failure, "attaching the shared segment");  // also: everyone attached
    segment.close_handle();  // only mappings hold it now: nothing to clean up after a crash
    st.setup_seconds += since(setup0);
    // This rank's slices of the shared tables, straight into the segment.
    const auto r0 = clock::now();
    try {
      planned_reads reads;
      for (const auto& e : plan.entries) {
        if (!e.shared()) continue;
        for (const auto& r : e.reads)
          if (r.reader == me) {
            reads.emplace_back(slice_ref(e, r), segment.bytes().subspan(e.shared_offset + r.offset, r.size));
            st.shared_bytes_written += r.size;
          }
      }
      run_reads(reads);
    } catch (...) {
      failure = std::current_exception();
    }
    detail::check_peers(c, failure, "reading shared tables");
    st.table_seconds = since(r0);
    st.read_seconds += st.table_seconds;
  }
  st.setup_seconds += since(t0) - st.read_seconds;

  // Windows, double-buffered: while window w's slices travel (a collective
  // on a helper thread), this thread reads window w+1 into the other buffers;
  // then it delivers w. Only one thread uses the communicator at a time.
  struct window_state {
    std::size_t begin = 0, end = 0;
    lease kept, scratch;                       // what this rank keeps; what it reads or packs for others
    std::vector<std::span<std::byte>> kept_at;  // by entry (i - begin): this rank's part of the tensor
    std::vector<comm::send_message> sends;
    std::vector<comm::recv_message> recvs;
    std::uint64_t sent = 0, received = 0;
  };
  detail::window_buffer buffers[2][2];
  std::size_t next_entry = 0;
  // Lays out window w and reads this rank's slices of it (failures are recorded, not thrown).
  auto read_window = [&](std::uint32_t w) {
    window_state ws;
    ws.begin = next_entry;
    ws.end = ws.begin;
    while (ws.end < plan.entries.size() && plan.entries[ws.end].window == w) ++ws.end;
    next_entry = ws.end;
    ws.kept_at.resize(ws.end - ws.begin);
    const auto r0 = clock::now();
    try {
      const auto lay = detail::layout_window(plan, me, ws.begin, ws.end);
      using region_at = detail::window_layout::region_at;
      constexpr auto none = detail::window_layout::none;
      const auto& kept_off = lay.kept_off;
      const auto& mine = lay.reads;
      const auto& cuts = lay.cuts;
      const auto msgs = detail::window_messages(plan, lay, me, ws.begin, ws.end);
      // The layout's offsets become spans of this window's two buffers; then
      // the reads, then the column cuts (what the exchange sends must be in place).
      ws.kept = buffers[w % 2][0].get(lay.kept_bytes);
      ws.scratch = buffers[w % 2][1].get(lay.scratch_bytes);
      auto span_of = [&ws](region_at at, std::size_t n) {
        return (at.kept ? ws.kept : ws.scratch).bytes().subspan(at.off, n);
      };
      for (std::size_t i = ws.begin; i < ws.end; ++i)
        if (kept_off[i - ws.begin] != none) ws.kept_at[i - ws.begin] = span_of({true, kept_off[i - ws.begin]}, plan.kept_bytes(plan.entries[i]));
      for (const auto& m : msgs) {
        if (m.send) ws.sends.push_back({m.peer, m.tag, span_of(m.at, m.size)}), ws.sent += m.size;
        else ws.recvs.push_back({m.peer, m.tag, span_of(m.at, m.size)}), ws.received += m.size;
      }
      planned_reads reads;
      for (const auto& r : mine) {
        const auto& e = plan.entries[r.entry];
        reads.emplace_back(slice_ref(e, e.reads[r.read]), span_of(r.at, e.reads[r.read].size));
      }
      run_reads(reads);
      // Column-split tensors: cut each TP part out of the rows this rank read.
      for (const auto& cut : cuts) {
        const auto& e = plan.entries[mine[cut.from].entry];
        const auto& rd = e.reads[mine[cut.from].read];
        const auto row = policy::load_plan::row_bytes(e), part = row / plan.tp, rows = rd.size / row;
        const std::byte* src = span_of(mine[cut.from].at, rd.size).data();
        auto dst = span_of(cut.at, rows * part);
        for (std::uint64_t j = 0; j < rows; ++j) std::memcpy(dst.data() + j * part, src + j * row + cut.part * part, part);
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    st.read_seconds += since(r0);
    return ws;
  };
  // The window's exchange: each slice goes from its reader to the ranks that keep it.
  auto exchange = [&c](window_state& ws) { c.exchange(ws.sends, ws.recvs); };
  auto deliver = [&](window_state& ws) {
    const auto d0 = clock::now();
    try {
      for (std::size_t i = ws.begin; i < ws.end; ++i) {
        const auto& e = plan.entries[i];
        const tensor_ref* t = &ck.tensors()[e.index];
        tensor_view v;
        v.tensor = t;
        if (e.shared()) {
          v.kind = view_kind::shared;
          v.bytes = segment.bytes().subspan(e.shared_offset, e.info.size);
          v.hold = lease(segment.keep(), segment.bytes().subspan(e.shared_offset, e.info.size));
          st.shared_views += 1;
        } else if (e.owners.contains(me)) {
          v.kind = view_kind::bytes;
          v.bytes = ws.kept_at[i - ws.begin];
          v.hold = ws.kept;
          if (e.split != policy::tp_split::none)
            v.part = {e.split == policy::tp_split::rows ? 0u : 1u, static_cast<std::uint32_t>(plan.tp_rank(me)),
                      static_cast<std::uint32_t>(plan.tp)};
          st.owned += 1;
        } else if (opt.placeholders) {
          v.kind = view_kind::metadata;
          st.placeholders += 1;
        } else {
          continue;
        }
        st.tensors += 1;
        st.accepted += s.accept(std::move(v)) ? 1 : 0;
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    st.deliver_seconds += since(d0);
  };

  const bool overlap = opt.overlaps(plan.local_size);
  st.overlapped = overlap;
  auto cur = read_window(0);
  detail::check_peers(c, failure, fmt::format("reading window 1 of {}", plan.windows));
  for (std::uint32_t w = 0; w < plan.windows; ++w) {
    std::exception_ptr exchange_failure;
    double exchange_seconds = 0;
    auto run_exchange = [&] {
      const auto x0 = clock::now();
      try {
        exchange(cur);
      } catch (...) {
        exchange_failure = std::current_exception();
      }
      exchange_seconds = since(x0);
    };
    std::thread helper;
    if (overlap) helper = std::thread(run_exchange);
    else run_exchange();
    window_state nxt;
    if (overlap || !exchange_failure) {  // (overlapped: the helper owns exchange_failure until joined)
      try {
        if (w + 1 < plan.windows) nxt = read_window(w + 1);  // overlaps the exchange when `overlap`
      } catch (...) {
        if (!failure) failure = std::current_exception();  // reported at the next status exchange
      }
    }
    if (helper.joinable()) helper.join();
    if (exchange_failure) std::rethrow_exception(exchange_failure);  // a peer is gone: every rank sees it
    st.exchange_seconds += exchange_seconds;
    st.bytes_sent += cur.sent;
    st.bytes_received += cur.received;
    st.messages += cur.sends.size() + cur.recvs.size();
    deliver(cur);
    cur = window_state{};  // release window w's buffers before w+2 reuses them
    if (w + 1 < plan.windows) {
      detail::check_peers(c, failure, fmt::format("reading window {} of {}", w + 2, plan.windows));
      cur = std::move(nxt);
    }
  }
  detail::check_peers(c, failure, "delivering tensors to the sink");
  try {
    if constexpr (requires { s.finish(); }) s.finish();
  } catch (...) {
    failure = std::current_exception();
  }
  detail::check_peers(c, failure, "finishing the sink");
  st.bytes_read = fetched;
  st.storage_bytes = reader->counters().bytes_read.load();
  st.requests = reader->counters().requests.load();
  st.seconds = since(t0);
  return st;
}

/// Loads this rank's part of `ck` into `s` per `plan` from local files
/// (file_reader), exchanging the rest over `c`. Every rank must call it with
/// the same checkpoint and plan. Throws distributed_error (a rank failed),
/// comm::comm_error (a peer is gone) or config_error (the plan does not fit
/// the world) — on every rank.
template <comm::communicator Comm, sink Sink>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                   const distributed_options& opt = {}) {
  return load_distributed_with(ck, c, plan, s, opt, [&ck, &opt] { return std::make_unique<file_reader>(ck, opt.load); });
}

/// The plan for `ck` under a topology string ("tp1,dp8,ep8", "tp4,pp2") and an offload
/// name ("none|per-rank|shared-single|shared-cooperative").
[[nodiscard]] inline policy::load_plan plan_for(const checkpoint& ck, std::string_view topology, std::string_view offload,
                                                const distributed_options& opt = {}) {
  const auto topo = policy::parse_topology(topology);
  return policy::make_plan(policy::tensor_infos(ck), policy::classifier(opt.classify), topo, policy::parse_offload(offload),
                           opt.plan);
}

namespace detail {

// Joins the world `who` describes (one rank: comm::local; more: comm::gloo
// through its store, when built with sluice::gloo) and returns f(communicator).
template <class F>
distributed_stats in_world(const comm::rank_info& who, F&& f) {
  if (who.world_size == 1) {
    comm::local c;
    return f(c);
  }
#if defined(SLUICE_HAS_GLOO)
  comm::gloo c(who);
  return f(c);
#else
  throw config_error("a multi-rank load needs the sluice::gloo component (built without Gloo)");
#endif
}

// The tool-level plan: `topology` must have WORLD_SIZE ranks.
inline policy::load_plan tool_plan(const checkpoint& ck, std::string_view topology, std::string_view offload,
                                   const comm::rank_info& who, const distributed_options& opt) {
  auto plan = plan_for(ck, topology, offload, opt);
  if (plan.world != who.world_size)
    throw config_error(fmt::format("topology {} has {} ranks but WORLD_SIZE is {}", topology, plan.world, who.world_size));
  return plan;
}

// After joining the world: opens the checkpoint (`open()`) and plans it inside
// the failure protocol, so that a rank that cannot open it fails every rank at
// once rather than leaving its peers to time out.
template <comm::communicator Comm, class Open>
std::pair<checkpoint, policy::load_plan> open_and_plan(Comm& c, Open&& open, std::string_view topology,
                                                       std::string_view offload, const comm::rank_info& who,
                                                       const distributed_options& opt) {
  std::exception_ptr failure;
  std::optional<checkpoint> ck;
  std::optional<policy::load_plan> plan;
  try {
    ck.emplace(open());
    plan.emplace(tool_plan(*ck, topology, offload, who, opt));
  } catch (...) {
    failure = std::current_exception();
  }
  check_peers(c, failure, "opening the checkpoint");
  return {std::move(*ck), std::move(*plan)};
}

}  // namespace detail

/// The one call for tools (sluice-load): plans `ck` for `topology` and
/// `offload`, joins the world described by `who` (one rank: comm::local;
/// more: comm::gloo through `who.store_dir`, when built with sluice::gloo)
/// and loads this rank's part into `s` from local files.
template <sink Sink>
distributed_stats load_distributed(const checkpoint& ck, std::string_view topology, std::string_view offload,
                                   const comm::rank_info& who, Sink& s, distributed_options opt = {}) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  const auto plan = detail::tool_plan(ck, topology, offload, who, opt);
  return detail::in_world(who, [&](auto& c) { return load_distributed(ck, c, plan, s, opt); });
}

/// Like the call above, but opens the checkpoint at `location` after joining
/// the world, so that a rank that cannot open it (a missing or corrupt shard)
/// makes every rank throw distributed_error naming it, at once — rather than
/// leaving its peers to time out at the rendezvous.
template <sink Sink>
distributed_stats load_distributed(const std::filesystem::path& location, std::string_view topology,
                                   std::string_view offload, const comm::rank_info& who, Sink& s,
                                   distributed_options opt = {}, const open_options& open = {}) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  return detail::in_world(who, [&](auto& c) {
    auto [ck, plan] = detail::open_and_plan(c, [&] { return checkpoint::open(location, open); }, topology, offload, who, opt);
    return load_distributed(ck, c, plan, s, opt);
  });
}

}  // namespace sluice::inline v0
