// The distributed driver (include/sluice/distributed/driver.hpp), compiled
// once: every typed front end (load_distributed, load_distributed_with, the
// tool-level calls of distributed/world.hpp) refers to its communicator and
// lane through comm::any_communicator and any_device_lane and calls
// detail::drive, so no program instantiates the driver or its window
// pipeline for its own communicator and lane types.

#include <sluice/distributed/driver.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <fmt/format.h>

#include <sluice/core/channel.hpp>
#include <sluice/core/cores.hpp>
#include <sluice/core/run.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/deliver_window.hpp>
#include <sluice/distributed/exchange_window.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/distributed/read_window.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/table_writes.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/memory/node_handoff.hpp>
#include <sluice/memory/node_window.hpp>
#include <sluice/memory/page_reporting.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/stages/pipeline.hpp>

#include "thread_name.hpp"

namespace sluice::inline v0::detail {

namespace {

// The ranks of `me`'s node (me / local_size) that read shared-table bytes.
std::set<policy::rank_t> node_table_readers(const policy::load_plan& plan, policy::rank_t me) {
  std::set<policy::rank_t> readers;
  const auto local = std::max<std::size_t>(1, plan.local_size);
  for (const auto& e : plan.entries) {
    if (!e.shared()) continue;
    for (const auto& r : e.reads)
      if (r.size && r.reader / local == me / local) readers.insert(r.reader);
  }
  return readers;
}

// The piece of a file whose presence in the page cache decides, for a shared
// table's share, between writing it from there and reading it: one
// cachestat per piece (microseconds; 1632 for a rank's 408 MiB share), and
// adjacent pieces of one kind merged again into one write or one read.
// Asked once per share instead, 2 MiB evicted from 8 GiB of shards (DAMON
// on this VM, reclaim anywhere) sent whole shares, a third of the tables, to
// the slower reads (bench/README.md).
constexpr std::uint64_t table_probe = std::uint64_t{256} << 10;

// Writes `writes` into `segment` from views of the files (`src`), through
// the pieces' descriptors (memory::shared_host::write), instead of reading
// them into its mapping: a page written so is allocated without zeroing and
// without a fault, about half the CPU time of one faulted in and copied
// (bench/shmem_writers.c; memory/shared_host.hpp), and each piece has one
// writer (policy::plan_segment), so the node's ranks write at once. One
// thread per piece of this rank's, as many as it has hardware threads
// (table_lanes, threads_per_rank). A failure names the file,
// the tensor and its bytes. Returns the bytes written and the threads that
// wrote them.
struct tables_written {
  std::uint64_t bytes = 0;
  std::size_t threads = 0;
};
tables_written write_tables(const checkpoint& ck, any_source& src, const memory::shared_host& segment,
                            const std::vector<table_write>& writes, std::size_t local_size) {
  if (writes.empty()) return {};
  std::uint64_t total = 0;
  for (const auto& w : writes) total += w.size;
  const auto lanes = table_lanes(writes, segment.pieces(), threads_per_rank(local_size));
  auto write = [&](const std::vector<table_write>& lane) {
    for (const auto& w : lane) {
      const auto& t = *w.t;
      const lease v = src.transient_view(t.shard, t.offset + w.offset, w.size);
      try {
        segment.write(w.at, v.bytes());
      } catch (const io_error& e) {
        throw io_error(fmt::format("writing a shared table's slice into the node's segment: {}", e.detail()),
                       {ck.shards()[t.shard].uri, t.name, byte_range{t.offset + w.offset, t.offset + w.offset + w.size}}, e.code());
      }
    }
  };
  std::vector<std::exception_ptr> failed(lanes.size());
  auto run = [&](std::size_t i) {
    try {
      write(lanes[i]);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  std::vector<std::size_t> here{0};  // lanes this thread writes: the first, and any whose thread did not start
  for (std::size_t i = 1; i < lanes.size(); ++i) {
    try {
      threads.push_back(named_thread("sluice-tables", [&run, i] { run(i); }));
    } catch (const std::system_error&) {
      here.push_back(i);
    }
  }
  for (auto i : here) run(i);
  for (auto& t : threads) t.join();
  for (auto& f : failed)
    if (f) std::rethrow_exception(f);
  return {total, lanes.size()};
}

// Memory every rank of `me`'s node maps (memory::shared_host): created by
// its local rank 0, which hands the descriptor itself to the node's other
// `local_size - 1` ranks (memory/node_handoff.hpp: a Unix socket, this user's
// processes proving a token that travels in this communicator's all-gather,
// never a path a peer chose); every rank fails if one cannot. Every rank
// holds its descriptors until its close_handle() (the segment's writers
// write through them); after that only mappings hold it: nothing to clean up
// after a crash. `pieces`: shared_host::create's. `what` names it in the
// phases ("shared segment", "node window").
memory::shared_host share_node_memory(comm::any_communicator& c, policy::rank_t me, std::size_t local_rank,
                                      std::size_t local_size, std::size_t size, std::span<const std::uint64_t> pieces,
                                      const std::string& name, const std::string& what) {
  memory::shared_host mem;
  std::optional<memory::handoff_server> server;
  constexpr std::size_t ticket_bytes = 128;
  std::vector<std::byte> mine(ticket_bytes), all(ticket_bytes * c.size());
  const auto leader = me - local_rank;
  const auto receivers = std::min<std::size_t>(local_size, c.size() - leader) - 1;
  constexpr auto handoff_timeout = std::chrono::seconds(60);
  // Made, and its ticket shared, in one meeting of the ranks: the status
  // exchange carries every rank's ticket (only local ranks 0 have one).
  run_phase(
      c, "creating the " + what,
      [&] {
        if (local_rank != 0) return;
        mem = memory::shared_host::create(size, name, pieces);
        if (receivers > 0) {
          server.emplace(mem);
          const auto t = server->ticket();
          std::memcpy(mine.data(), t.data(), std::min(t.size(), ticket_bytes));
        }
      },
      mine, all);
  run_phase(c, "handing over the " + what, [&] {  // also: every local rank has it
    if (local_rank == 0) {
      if (server) server->serve(receivers, handoff_timeout, c.liveness());
      return;
    }
    mem = memory::receive_handoff(std::span(all).subspan(leader * ticket_bytes, ticket_bytes), size, pieces, handoff_timeout);
  });
  server.reset();
  for (auto* v : {&mine, &all}) std::fill(v->begin(), v->end(), std::byte{0});  // the tickets' tokens
  return mem;
}

// The largest piece a tensor read at delivery comes in (deliver_window):
// buffers of small pieces, reused batch after batch, stay in the caches. 8
// ranks of the 8 GiB sample, hot, each keeping 3.1 GiB of tables it reads at
// delivery (2 cores, bench/README.md), with --max-read setting the pieces
// (and the windows' requests): 32 MiB 5.4-6.6 s, 8 MiB 3.9 s, 2 MiB 3.6-3.9 s.
// 8 MiB keeps requests large enough for a cold disk and S3's range GETs.
constexpr std::uint64_t delivery_piece = std::uint64_t{8} << 20;

// Runs the window pipeline (window_ticket → window_ticket) over `windows`
// windows with `credits` of them in flight at most: the first `credits`
// tickets go in at once, and each window that comes out delivered lets the
// next one in, carrying the delivery failures so far (this rank's status,
// which the next window's status exchange reports). Returns the windows'
// stats added up, with the first delivery failure. An error of a stage (a
// peer's failure, a lost peer) aborts the pipeline's channels, this loop's
// included, and is rethrown once every stage has stopped.
template <class Pipeline>
task<window_ticket> run_windows(Pipeline& pipeline, std::uint32_t windows, unsigned credits) {
  auto ex = co_await this_executor;
  channel<window_ticket> in{credits}, out{credits};
  std::exception_ptr stage_failure;
  joined_spawn runner(ex, pipeline.run(in, out), stage_exit<window_ticket, window_ticket>{&in, &out, &stage_failure});
  window_ticket total;
  std::exception_ptr failure;
  try {
    std::uint32_t next = 0;
    // Tickets are named before they are sent: GCC 12 destroys a braced
    // temporary passed to a coroutine's by-value parameter twice, which
    // released the carried exception_ptr twice (a heap corruption seen once
    // a delivery had failed).
    for (; next < std::min<std::uint32_t>(windows, credits); ++next) {
      window_ticket first{next, {}, {}};
      co_await in.send(std::move(first));
    }
    if (next == windows) in.close();
    for (;;) {
      auto done = co_await out.receive();
      if (!done) break;
      total.stats += done->stats;
      if (done->failure && !total.failure) total.failure = done->failure;
      if (next < windows) {
        window_ticket ticket{next++, total.failure, {}};
        co_await in.send(std::move(ticket));
        if (next == windows) in.close();
      }
    }
  } catch (...) {
    failure = std::current_exception();
    in.abort(failure);
    out.abort(failure);
  }
  co_await runner.join();
  if (stage_failure) std::rethrow_exception(stage_failure);
  if (failure) std::rethrow_exception(failure);
  co_return total;
}

}  // namespace

// Compiled once, over erased parts (the communicator, the lane, the sink, the
// source): one indirect call per collective, window buffer, tensor and batch.
distributed_stats drive(const checkpoint& ck, comm::any_communicator& c, const policy::load_plan& plan, any_sink s,
                        const distributed_options& opt, const source_factory& open_source, bool catalog_source,
                        any_device_lane* lane) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  const auto me = static_cast<policy::rank_t>(c.rank());
  distributed_stats st;
  st.rank = me, st.world = c.size(), st.local_rank = me % plan.local_size;
  st.topology = plan.topology_string();
  st.header_bytes_read = ck.header_bytes_read();
  st.offload = std::string(policy::offload_name(plan.offload));
  st.planned_read_bytes = plan.read_bytes.at(me);
  st.kept_whole = plan.kept_whole;
  st.windows = plan.windows;
  if (plan.world != c.size())
    throw config_error(fmt::format("the plan is for {} ranks, the communicator has {}", plan.world, c.size()));
  if (plan.entries.size() != ck.tensors().size())
    throw config_error(fmt::format("the plan has {} tensors, the checkpoint {}", plan.entries.size(), ck.tensors().size()));

  // Every window's layout and messages, for every rank, planned once; every
  // rank must have computed the same schedule (its digest covers the plan).
  // Ranks of one node read the bytes they keep from its page cache (local
  // files read through the page cache) instead of receiving them: nothing
  // of a local file crosses a socket within a node. io_mode::direct keeps
  // the exchange (each rank's O_DIRECT reads would read from disk again).
  // Otherwise (S3, O_DIRECT, a caller's source), through the node window: a
  // memory region every local rank maps, which readers read into and keepers
  // copy from.
  const bool with_lane = lane != nullptr;
  const bool local_files = catalog_source && ck.storage().shares_page_cache();
  const bool page_cache = opt.takes_from_page_cache(local_files, plan.local_size);
  const auto node = page_cache                                    ? policy::node_copy::page_cache
                    : opt.node_window && plan.local_size > 1 ? policy::node_copy::window
                                                                  : policy::node_copy::none;
  // Between nodes, each byte goes once to each node that keeps it, to one of
  // its keepers there (the relay), which the node's other keepers copy from
  // through the node window.
  const bool relay = opt.node_window && plan.local_size > 1 && plan.nodes() > 1;
  const auto schedule =
      policy::make_schedule(plan, with_lane ? policy::lane_split::host_and_device : policy::lane_split::one, node, relay,
                            opt.status_every);
  fault_point("plan", me);
  {
    // One collective: every rank gets every digest and reaches the same
    // verdict (rank 0's plan is the reference; the first rank whose digest
    // differs is named), so no status exchange needs to follow.
    const std::uint64_t d = schedule.digest;
    std::vector<std::byte> all(8 * c.size());
    in_phase("comparing load plans", [&] { c.all_gather(std::as_bytes(std::span(&d, 1)), all); });
    for (std::size_t r = 1; r < c.size(); ++r)
      if (std::memcmp(all.data() + 8 * r, all.data(), 8) != 0)
        throw distributed_error(fmt::format("rank 0 failed while comparing load plans: rank {} computed a different load "
                                            "plan (checkpoint or options differ)",
                                            r),
                                0);
  }

  // A load with a device lane delivers view_kind::device views: a sink that
  // does not take them fails every rank here, before any read (a typed host
  // sink does not compile; an erased one carries its traits as a value).
  if (with_lane)
    run_phase(c, "checking the sink", [&] {
      if (!s.traits().device_views)
        throw config_error(fmt::format("the load has a device lane, which delivers view_kind::device views, and the sink "
                                       "({}) takes none (it does not declare `static constexpr bool device_views = true`): "
                                       "use cuda::device_sink, or load without the lane",
                                       s.name()));
    });


  // I/O set-up: one reader (source, staging pool) for every window, its
  // reads tasks on this io_context, which this thread runs for each phase
  // that reads (never from inside a coroutine: core/run.hpp). A rank that is one of fewer table readers than its node has ranks
  // (shared-single) reads the tables while the others wait: it gets a reader
  // of its own with their share of the node's I/O (S3 connections, queue
  // depth), gone once the tables are read.
  const bool shared = policy::is_shared(plan.offload) && plan.shared_bytes > 0;
  const auto table_readers = shared ? detail::node_table_readers(plan, me) : std::set<policy::rank_t>{};
  const bool reads_tables = table_readers.contains(me);
  st.table_readers = table_readers.size();
  asio::io_context ioc{1};  // before the readers, whose sources are bound to it: destroyed after them
  std::unique_ptr<slice_reader> reader, table_reader;
  // A sink that sizes its memory from the plan does so once, before any read
  // (cuda::device_sink: one arena for this rank's device tensors at their part
  // sizes); a rank that cannot (out of memory) fails every rank, in the same
  // status exchange as the I/O set-up (one meeting of the ranks for both).
  run_phase(c, "reserving the sink's memory and setting up I/O", [&] {
    s.reserve(plan, me);
    reader = std::make_unique<slice_reader>(open_source(ioc, {plan.local_size, opt.connections_per_rank, 0, page_cache}), opt.load);
    st.connections = reader->connections();
    if (reads_tables && table_readers.size() < plan.local_size && catalog_source)
      table_reader = std::make_unique<slice_reader>(
          open_source(ioc, {plan.local_size, opt.connections_per_rank, table_readers.size(), page_cache}), opt.load);
    if (reads_tables) {
      const auto& tr = table_reader ? *table_reader : *reader;
      st.table_connections = tr.connections();
      st.table_queue_depth = tr.queue_depth();
    }
  });

  std::uint64_t table_storage_bytes = 0, table_requests = 0;
  std::uint64_t table_cache[3] = {0, 0, 0};   // the table reader's cache counters (hit, fetched, refetched)
  memory::shared_host segment;
  const auto buffers = opt.buffers ? opt.buffers : std::make_shared<window_buffers>();
  std::uint64_t fetched = 0;  // tensor bytes this rank read (shared tables included)

  // Shared tables as views of the page cache: with the node's page cache as
  // its copy and views asked for (map_above), every local rank maps the
  // tables' file ranges; no segment is made or filled, and the kernel reads
  // each byte from disk once for the node. A table is memory its consumers
  // read sparsely (rows looked up), so each rank maps it without mapping its
  // pages in; it only makes sure its share of the node's reads is in the page
  // cache (mapping that share in where it is not: the cooperative cold fill).
  const bool table_views = shared && opt.table_views(local_files, plan.local_size);
  std::vector<lease> tables;  // by entry, table_views only
  std::uint64_t table_taken = 0, table_bytes = 0, table_resident = 0;
  if (table_views) {
    fault_point("tables", me);
    const auto r0 = clock::now();
    run_phase(c, "mapping shared tables", [&] {
      planned_reads fill;  // this rank's shares the page cache lacks
      tables.resize(plan.entries.size());
      for (std::size_t j = 0; j < plan.entries.size(); ++j) {
        const auto& e = plan.entries[j];
        if (!e.shared() || e.info.size == 0) continue;
        table_bytes += e.info.size;
        const auto& t = ck.tensors()[e.index];
        // Not can_map: a rank alone on its node reads its own bytes past the
        // page cache where they are not cached (io=automatic), and can_map
        // declines such ranges. A table's view is made either way, and its
        // share mapped in below (the catalog's files: view() throws
        // truncated_error for a range the file no longer holds).
        tables[j] = reader->source().view(t.shard, t.offset, e.info.size);
        std::uint64_t mine = 0;  // the plan's share of the node's storage reads
        for (const auto& r : e.reads) {
          if (r.reader != me) continue;
          mine += r.size;
          if (reader->source().cached(t.shard, t.offset + r.offset, r.size))
            table_resident += r.size;
          else
            fill.push_back({&t, r.offset, r.size, {}, true});
        }
        fetched += mine, table_taken += e.info.size - mine;
      }
      std::vector<lease> filled(fill.size());  // dropped: the tables' views hold the mapping
      run_blocking(ioc, reader->read(fill, &filled));
      table_reader.reset();
    });
    st.table_seconds = since(r0);
    st.read_seconds += st.table_seconds;
  }

  // Shared segment: created by local rank 0 of each node, attached by the others.
  st.shared_bytes = shared && !table_views ? plan.shared_bytes : 0;
  if (shared && !table_views) {
    const auto setup0 = clock::now();
    segment = share_node_memory(c, me, st.local_rank, plan.local_size, plan.shared_bytes, plan.segment_pieces,
                                fmt::format("{}-rank{}", opt.segment_name, me), "shared segment");
    st.setup_seconds += since(setup0);
    // This rank's slices of the shared tables, into the segment: those the
    // node's page cache holds written from views of the files, the others
    // read straight into its mapping.
    fault_point("tables", me);
    const auto r0 = clock::now();
    run_phase(c, "reading shared tables", [&] {
      auto& tr = table_reader ? *table_reader : *reader;
      // O_DIRECT asked for: every byte read from the disk, none from the
      // page cache. Where a fault in the segment takes a 2 MiB page
      // (shmem_huge_faults), faulting costs less than writing 4 KiB pages.
      const bool from_page_cache = opt.load.io != io_mode::direct && !::sluice::shmem_huge_faults();
      planned_reads reads;
      std::vector<table_write> writes;
      for (const auto& e : plan.entries) {
        if (!e.shared()) continue;
        const auto& t = ck.tensors()[e.index];
        for (const auto& r : e.reads)
          if (r.reader == me) {
            st.shared_bytes_written += r.size;
            fetched += r.size;
            // Asked of the page cache a piece at a time (table_probe bytes of
            // the file): a file the kernel has partly evicted (reclaim, DAMON)
            // sends its missing pieces to the reads, not the whole share.
            for (auto b = r.offset, end = r.offset + r.size; b < end;) {
              const auto stop = from_page_cache ? std::min(end, ((t.offset + b) / table_probe + 1) * table_probe - t.offset) : end;
              const auto n = stop - b;
              const auto at = e.shared_offset + b;
              if (from_page_cache && tr.source().cached(t.shard, t.offset + b, n)) {
                if (!writes.empty() && writes.back().t == &t && writes.back().offset + writes.back().size == b)
                  writes.back().size += n;
                else
                  writes.push_back({&t, b, n, at});
              } else if (!reads.empty() && reads.back().tensor == &t && reads.back().offset + reads.back().size == b) {
                auto& x = reads.back();
                x.size += n;
                x.direct = {x.direct.data(), x.size};
              } else {
                reads.push_back({&t, b, n, segment.bytes().subspan(at, n)});
              }
              b = stop;
            }
          }
      }
      const auto written = write_tables(ck, tr.source(), segment, writes, plan.local_size);
      st.resident_bytes += written.bytes;
      st.table_writers = written.threads;
      run_blocking(ioc, tr.read(reads));
      if (table_reader) {
        table_storage_bytes = table_reader->counters().bytes_read.load();
        table_requests = table_reader->counters().requests.load();
        table_cache[0] = table_reader->counters().cache_hit_bytes.load();
        table_cache[1] = table_reader->counters().cache_fetched_bytes.load();
        table_cache[2] = table_reader->counters().cache_refetched_bytes.load();
        table_reader.reset();  // its connections and slots are not needed for the windows
      }
    });
    segment.close_handle();  // written: from now on only the mappings hold it
    st.table_seconds = since(r0);
    st.read_seconds += st.table_seconds;
  }
  st.setup_seconds += since(t0) - st.read_seconds;

  // Overlapped: window w's exchange runs on its own thread while this one
  // reads window w+1 (two credits: two windows' buffers); serial: one
  // window at a time, the exchange inline.
  const bool overlap = opt.overlaps(plan.local_size, catalog_source && !ck.storage().shares_page_cache());
  st.overlapped = overlap;

  // The node window (node_copy::window): its parities in one memfd, made by
  // local rank 0 and attached by the others, as the shared segment. Two
  // serial; three overlapped, so that a rank may read a window ahead of the
  // slowest rank's reads, as over Gloo: with two, every window's reads
  // would wait for every rank's reads of the one before (parity_gate).
  // From an S3 endpoint limited to 24 MB/s per connection, 4 ranks of 2
  // cores, 1 GiB (bench/README.md): serial 4.68-4.75 s, overlapped with two
  // gated parities 4.02-4.07 s, with three 3.57-3.66 s (Gloo loopback
  // overlapped: 3.54-3.60 s).
  memory::node_window node_window;
  const std::uint32_t parities = overlap ? 3 : 2;
  if (schedule.node_window_bytes > 0) {
    const auto setup0 = clock::now();
    auto window = share_node_memory(c, me, st.local_rank, plan.local_size, parities * schedule.node_window_bytes, {},
                                    fmt::format("{}-window-rank{}", opt.segment_name, me - st.local_rank), "node window");
    window.close_handle();  // copied through the mapping only
    node_window = {std::move(window), schedule.node_window_bytes, parities};
    st.setup_seconds += since(setup0);
    st.node_window_bytes = node_window.size();
  }
  // The device lane uploads what it keeps of the node window from there:
  // pinned once for the load (the lane's own host buffers are pinned already).
  const lease node_window_pinned = lane && node_window ? lane->pin(node_window.bytes(), node_window.keep()) : lease{};

  // The windows. Overlapped through the node window, a parity is read into
  // again only after every local rank has copied from it: the parity_gate
  // (window.hpp) keeps that order.
  std::optional<asio::thread_pool> exchange_thread;
  if (overlap) {
    exchange_thread.emplace(1);
    asio::post(*exchange_thread, [] { name_this_thread("sluice-exchange"); });
  }
  std::optional<parity_gate> gate;
  if (overlap && node_window) gate.emplace(plan.windows, parities);
  // A large tensor a rank gets whole through its own source is read as it
  // is delivered (distributed_options::pieces_above), in pieces of a read
  // request each, at most delivery_piece, unless the sink wants whole tensors.
  const delivery_reads delivery{s.traits().whole_tensors ? 0 : opt.pieces_above,
                                std::min(delivery_piece, request_bytes_for(opt.load.max_read, slot_size_for(opt.load.max_read))),
                                reader->queue_depth()};
  auto pipeline = read_window(ck, plan, schedule, me, lane, *buffers, *reader, opt.load.map_above, node_window ? &node_window : nullptr,
                              gate ? &*gate : nullptr, delivery) |
                  exchange_window(c, plan, lane, plan.windows, exchange_thread ? &*exchange_thread : nullptr, gate ? &*gate : nullptr) |
                  deliver_window(ck, plan, me, segment, tables, s, opt.placeholders, *reader, *buffers, delivery);
  auto done = run_blocking(ioc, run_windows(pipeline, plan.windows, overlap ? 2u : 1u));
  const auto& w = done.stats;
  st.read_seconds += w.read_seconds, st.exchange_seconds += w.exchange_seconds, st.deliver_seconds += w.deliver_seconds;
  st.status_exchanges = w.status_exchanges;
  st.bytes_sent += w.sent, st.bytes_received += w.received, st.bytes_uploaded += w.uploaded, st.messages += w.messages;
  st.tensors += w.tensors, st.accepted += w.accepted, st.owned += w.owned, st.placeholders += w.placeholders;
  st.shared_views += w.shared_views, st.device_views += w.device_views, st.bytes_kept += w.kept;
  fetched += w.fetched;
  // A delivery of the last windows that failed: no window's status exchange reported it yet.
  check_peers(c, done.failure, "delivering tensors to the sink");
  // The sink's last calls; with them, whether this rank still holds a view
  // of the node's segment. Where no rank of the node does, nothing will read
  // it again: each frees its share of the pieces at once, in parallel,
  // instead of the last rank to unmap it freeing all of it alone.
  {
    std::byte unheld{0};
    std::vector<std::byte> unhelds(c.size());
    run_phase(
        c, "finishing the sink",
        [&] {
          s.finish();
          unheld = segment.sole() ? std::byte{1} : std::byte{0};
        },
        std::span(&unheld, 1), unhelds);
    const auto local = unhelds.begin() + static_cast<std::ptrdiff_t>(me - st.local_rank);
    const bool node_done =
        std::all_of(local, local + static_cast<std::ptrdiff_t>(plan.local_size), [](std::byte b) { return b == std::byte{1}; });
    if (segment && node_done) {
      const auto r0 = clock::now();
      st.shared_bytes_released = segment.release(st.local_rank, plan.local_size);
      st.release_seconds = since(r0);
    }
  }
  st.bytes_read = fetched;
  st.page_cache_bytes = w.taken + table_taken;
  st.resident_bytes += table_resident;
  st.node_copied_bytes = w.node;
  st.mapped_bytes = w.mapped + table_bytes;
  st.delivered_read_bytes = w.delivered_read;
  // Takes are read buffered (exact); table views are not reads (their fills are).
  st.storage_bytes = reader->counters().bytes_read.load() + table_storage_bytes - w.taken;
  st.requests = reader->counters().requests.load() + table_requests;
  st.cache_hit_bytes = reader->counters().cache_hit_bytes.load() + table_cache[0];
  st.cache_fetched_bytes = reader->counters().cache_fetched_bytes.load() + table_cache[1];
  st.cache_refetched_bytes = reader->counters().cache_refetched_bytes.load() + table_cache[2];
  st.seconds = since(t0);
  return st;
}

}  // namespace sluice::inline v0::detail
