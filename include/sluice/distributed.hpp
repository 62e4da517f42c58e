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
///    of the window, in plan order. With a device lane (stages/broadcast.hpp:
///    comm::nccl_lane), tensors destined for the device are read into pinned
///    host memory, uploaded, exchanged by NCCL between device window buffers,
///    and delivered as `view_kind::device` views; host-destined ones still
///    travel over the host communicator. Double-buffered: window w+1 is read while
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
#include <sluice/stages/broadcast.hpp>
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
  /// Window buffers to reuse (see window_buffers: successive loads, e.g.
  /// weight reloads, skip first touch); null: the load allocates its own.
  std::shared_ptr<window_buffers> buffers;

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
  std::uint64_t bytes_uploaded = 0;       ///< device lane: bytes it copied from host to lane memory (its reads, cut parts)
  std::uint64_t device_views = 0;         ///< device lane: tensors (parts) delivered in device memory
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
            {"bytes_received", bytes_received}, {"messages", messages}, {"bytes_uploaded", bytes_uploaded}, {"device_views", device_views}, {"shared_bytes", shared_bytes},
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
///
/// With a `device_lane`, tensors destined for the device travel in its memory
/// (uploaded from the rank's reads, exchanged by the lane: NCCL) and reach the
/// sink as `view_kind::device` views; tensors for host memory still travel
/// over `c`. Without one, everything travels in host memory over `c`.
template <comm::communicator Comm, sink Sink, class MakeReader, device_lane Lane>
  requires slice_reader<typename std::invoke_result_t<MakeReader&>::element_type>
distributed_stats load_distributed_with(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                        const distributed_options& opt, MakeReader make_reader, Lane& lane) {
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
  // With a device lane, a window has two lanes: tensors for host memory
  // travel over `c`, those for the device over the lane (uploaded first).
  struct lane_window {
    window_lane which = window_lane::all;
    lease kept, scratch;          // host memory: this rank's reads land here (and the host lane travels from/to it)
    lease dev_kept, dev_scratch;  // device lane: its memory (what travels, what the sink sees)
    detail::window_layout layout;
    std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> uploads;  // (lane memory, host bytes)
    std::vector<comm::send_message> sends;
    std::vector<comm::recv_message> recvs;
    std::uint64_t sent = 0, received = 0, uploaded = 0;
    // A layout region as host memory (where reads land), and as the memory that travels and the sink sees.
    [[nodiscard]] std::span<std::byte> host_at(detail::window_layout::region_at at, std::size_t n) const {
      return (at.kept ? kept : scratch).bytes().subspan(at.off, n);
    }
    [[nodiscard]] std::span<std::byte> data_at(detail::window_layout::region_at at, std::size_t n) const {
      if (which != window_lane::device) return host_at(at, n);
      return (at.kept ? dev_kept : dev_scratch).bytes().subspan(at.off, n);
    }
  };
  struct window_state {
    std::size_t begin = 0, end = 0;
    std::vector<lane_window> lanes;
    std::vector<std::span<std::byte>> kept_at;  // by entry (i - begin): this rank's part of the tensor
    std::vector<std::uint8_t> lane_of;          // by entry: its lane (index into lanes)
  };
  constexpr bool with_lane = !std::is_same_v<Lane, no_device_lane>;
  const auto buffers = opt.buffers ? opt.buffers : std::make_shared<window_buffers>();
  std::size_t next_entry = 0;
  // Lays out window w and reads this rank's slices of it (failures are recorded, not thrown).
  auto read_window = [&](std::uint32_t w) {
    window_state ws;
    ws.begin = next_entry;
    ws.end = ws.begin;
    while (ws.end < plan.entries.size() && plan.entries[ws.end].window == w) ++ws.end;
    next_entry = ws.end;
    ws.kept_at.resize(ws.end - ws.begin);
    ws.lane_of.assign(ws.end - ws.begin, 0);
    const auto r0 = clock::now();
    try {
      constexpr auto none = detail::window_layout::none;
      if constexpr (with_lane) ws.lanes.resize(2), ws.lanes[0].which = window_lane::host, ws.lanes[1].which = window_lane::device;
      else ws.lanes.resize(1);
      // The layouts' offsets become spans of this window's buffers (host
      // memory for the reads; for the device lane, also its memory).
      planned_reads reads;
      for (std::uint8_t k = 0; k < ws.lanes.size(); ++k) {
        auto& L = ws.lanes[k];
        const bool dev = L.which == window_lane::device;
        L.layout = detail::layout_window(plan, me, ws.begin, ws.end, L.which);
        const auto& lay = L.layout;
        const unsigned slot = (w % 2) * 2;
        L.kept = dev ? lane.host_buffer(slot, lay.kept_bytes) : buffers->at(w % 2, 0).get(lay.kept_bytes);
        L.scratch = dev ? lane.host_buffer(slot + 1, lay.scratch_bytes) : buffers->at(w % 2, 1).get(lay.scratch_bytes);
        if (dev) L.dev_kept = lane.device_buffer(slot, lay.kept_bytes), L.dev_scratch = lane.device_buffer(slot + 1, lay.scratch_bytes);
        for (std::size_t i = ws.begin; i < ws.end; ++i)
          if (lay.kept_off[i - ws.begin] != none)
            ws.kept_at[i - ws.begin] = L.data_at({true, lay.kept_off[i - ws.begin]}, plan.kept_bytes(plan.entries[i])), ws.lane_of[i - ws.begin] = k;
        for (const auto& m : detail::window_messages(plan, lay, me, ws.begin, ws.end, L.which)) {
          if (m.send) L.sends.push_back({m.peer, m.tag, L.data_at(m.at, m.size)}), L.sent += m.size;
          else L.recvs.push_back({m.peer, m.tag, L.data_at(m.at, m.size)}), L.received += m.size;
        }
        for (const auto& r : lay.reads) {
          const auto& e = plan.entries[r.entry];
          const auto n = e.reads[r.read].size;
          reads.emplace_back(slice_ref(e, e.reads[r.read]), L.host_at(r.at, n));
          // What a device-lane rank read travels or stays as read, except the
          // whole rows of a column split: its cut parts do.
          if (dev && n && e.split != policy::tp_split::columns) L.uploads.emplace_back(L.data_at(r.at, n), L.host_at(r.at, n));
        }
      }
      run_reads(reads);  // one batch for every lane: adjacent slices still coalesce
      for (auto& L : ws.lanes) {
        const bool dev = L.which == window_lane::device;
        const auto& mine = L.layout.reads;
        // Column-split tensors: cut each TP part out of the rows this rank read.
        for (const auto& cut : L.layout.cuts) {
          const auto& e = plan.entries[mine[cut.from].entry];
          const auto& rd = e.reads[mine[cut.from].read];
          const auto row = policy::load_plan::row_bytes(e), part = row / plan.tp, rows = rd.size / row;
          const std::byte* src = L.host_at(mine[cut.from].at, rd.size).data();
          auto dst = L.host_at(cut.at, rows * part);
          for (std::uint64_t j = 0; j < rows; ++j) std::memcpy(dst.data() + j * part, src + j * row + cut.part * part, part);
          if (dev) L.uploads.emplace_back(L.data_at(cut.at, rows * part), dst);
        }
        // Adjacent uploads become one copy.
        std::sort(L.uploads.begin(), L.uploads.end(), [](const auto& a, const auto& b) { return a.first.data() < b.first.data(); });
        std::size_t n = 0;
        for (const auto& u : L.uploads) {
          auto& prev = L.uploads[n ? n - 1 : 0];
          if (n && prev.first.data() + prev.first.size() == u.first.data() && prev.second.data() + prev.second.size() == u.second.data())
            prev = {{prev.first.data(), prev.first.size() + u.first.size()}, {prev.second.data(), prev.second.size() + u.second.size()}};
          else L.uploads[n++] = u;
        }
        L.uploads.resize(n);
        for (const auto& u : L.uploads) L.uploaded += u.first.size();
      }
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    st.read_seconds += since(r0);
    return ws;
  };
  // The window's exchange: each slice goes from its reader to the ranks that
  // keep it; device-lane bytes are uploaded first (ordered before the lane's exchange).
  auto exchange = [&c, &lane](window_state& ws) {
    for (auto& L : ws.lanes) {
      if (L.which != window_lane::device) {
        c.exchange(L.sends, L.recvs);
        continue;
      }
      for (const auto& [dst, src] : L.uploads) lane.upload(dst, src);
      lane.exchange(L.sends, L.recvs);
    }
  };
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
          v.hold = lease(segment.keep(), segment.bytes());  // the whole segment: a sink registers it once
          v.host_destined = true;
          st.shared_views += 1;
        } else if (e.owners.contains(me)) {
          const auto& L = ws.lanes[ws.lane_of[i - ws.begin]];
          const bool dev = L.which == window_lane::device;
          v.kind = dev ? view_kind::device : view_kind::bytes;
          v.bytes = ws.kept_at[i - ws.begin];
          v.hold = dev ? L.dev_kept : L.kept;
          v.host_destined = e.owner_destination == policy::destination::host;
          if (e.split != policy::tp_split::none)
            v.part = {e.split == policy::tp_split::rows ? 0u : 1u, static_cast<std::uint32_t>(plan.tp_rank(me)),
                      static_cast<std::uint32_t>(plan.tp)};
          st.owned += 1;
          st.device_views += dev ? 1 : 0;
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
    for (const auto& L : cur.lanes) {
      st.bytes_sent += L.sent;
      st.bytes_received += L.received;
      st.bytes_uploaded += L.uploaded;
      st.messages += L.sends.size() + L.recvs.size();
    }
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

template <comm::communicator Comm, sink Sink, class MakeReader>
  requires slice_reader<typename std::invoke_result_t<MakeReader&>::element_type>
distributed_stats load_distributed_with(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                        const distributed_options& opt, MakeReader make_reader) {
  no_device_lane none;
  return load_distributed_with(ck, c, plan, s, opt, std::move(make_reader), none);
}

/// Like load_distributed below, with a device lane: tensors destined for the
/// device reach `s` as `view_kind::device` views of the lane's memory (e.g.
/// comm::nccl_lane with cuda::device_sink).
template <comm::communicator Comm, sink Sink, device_lane Lane>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                   const distributed_options& opt, Lane& lane) {
  return load_distributed_with(ck, c, plan, s, opt, [&ck, &opt] { return std::make_unique<file_reader>(ck, opt.load); }, lane);
}

/// Loads this rank's part of `ck` into `s` per `plan` from local files
/// (file_reader), exchanging the rest over `c`. Every rank must call it with
/// the same checkpoint and plan. Throws distributed_error (a rank failed),
/// comm::comm_error (a peer is gone) or config_error (the plan does not fit
/// the world) — on every rank.
template <comm::communicator Comm, sink Sink>
distributed_stats load_distributed(const checkpoint& ck, Comm& c, const policy::load_plan& plan, Sink& s,
                                   const distributed_options& opt = {}) {
  no_device_lane none;
  return load_distributed(ck, c, plan, s, opt, none);
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
/// leaving its peers to time out at the rendezvous. With a device lane (e.g.
/// comm::nccl_lane over `comm::nccl::connect(who, {.device = cuda::device_for_local_rank(local_rank)})`,
/// whose unique id travels through the same store), tensors destined for the
/// device reach `s` as `view_kind::device` views (cuda::device_sink).
template <sink Sink, device_lane Lane>
distributed_stats load_distributed(const std::filesystem::path& location, std::string_view topology,
                                   std::string_view offload, const comm::rank_info& who, Sink& s,
                                   distributed_options opt, const open_options& open, Lane& lane) {
  if (!opt.plan.local_size) opt.plan.local_size = who.local_size;
  return detail::in_world(who, [&](auto& c) {
    auto [ck, plan] = detail::open_and_plan(c, [&] { return checkpoint::open(location, open); }, topology, offload, who, opt);
    return load_distributed(ck, c, plan, s, opt, lane);
  });
}
template <sink Sink>
distributed_stats load_distributed(const std::filesystem::path& location, std::string_view topology,
                                   std::string_view offload, const comm::rank_info& who, Sink& s,
                                   distributed_options opt = {}, const open_options& open = {}) {
  no_device_lane none;
  return load_distributed(location, topology, offload, who, s, std::move(opt), open, none);
}

}  // namespace sluice::inline v0
