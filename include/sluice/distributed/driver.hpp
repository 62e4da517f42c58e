#pragma once
/// \file
/// The distributed driver: loads this rank's part of a checkpoint per a
/// plan, reading through a slice_reader and exchanging the rest over a
/// communicator (and a device lane). See <sluice/distributed.hpp> for the
/// whole picture.

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

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/concepts.hpp>
#include <sluice/distributed/file_reader.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/error.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/stages/broadcast.hpp>

namespace sluice::inline v0 {

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
  st.kept_whole = plan.kept_whole;
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

  // A sink that sizes its memory from the plan does so once, before any read
  // (cuda::device_sink: one arena for this rank's device tensors at their part
  // sizes); a rank that cannot (out of memory) fails every rank.
  if constexpr (requires { s.reserve(plan, me); }) {
    try {
      s.reserve(plan, me);
    } catch (...) {
      failure = std::current_exception();
    }
    detail::check_peers(c, failure, "reserving the sink's memory");
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

}  // namespace sluice::inline v0
