#pragma once
/// \file
/// read_window: window_ticket → window_state. The first stage of a
/// distributed load's window pipeline (read_window | exchange_window |
/// deliver_window). For each ticket it takes this rank's layout of the window
/// from the schedule (policy/schedule.hpp),
/// reads this rank's planned slices through the slice reader (a task on the
/// driver's io_context: coalesce | fetch | stage | place, into the window's
/// host memory), and, where the schedule carries a message through the
/// node's page cache, the bytes it would have received (its takes: the same
/// reader, the same batch), cuts column parts, and lists the device lane's
/// uploads (through the node window, what it reads lands there, and
/// exchange_window copies and cuts after the status exchange). A
/// failure of this rank (a read of this window, or a delivery the ticket
/// reports) does not throw: it travels in the window (window_state::failure)
/// to its status exchange, so that every rank stops at the same point; from
/// then on this stage reads nothing more.
///
/// Its state is its own: where it is in the plan, and this rank's failure so
/// far. It calls the lane's host_buffer / device_buffer (on the driver's
/// thread; see device_lane). Compiled once, in the driver
/// (src/core/driver.cpp), over an erased lane.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/memory/node_window.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/policy/schedule.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0::detail {

// Column-split tensors: cuts each TP part out of the rows this rank read;
// then merges adjacent uploads into one copy.
inline void cut_and_list_uploads(const policy::load_plan& plan, lane_window& L) {
  const bool dev = L.which == window_lane::device;
  const auto& mine = L.layout->reads;
  for (const auto& cut : L.layout->cuts) {
    const auto& e = plan.entries[mine[cut.from].entry];
    const auto& rd = e.reads[mine[cut.from].read];
    // The read covers whole runs (rows, or a model's runs): block
    // `cut.part` of each, packed.
    const auto n = plan.parts(e);
    const std::byte* src = L.host_at(mine[cut.from].at, rd.size).data();
    auto dst = L.host_at(cut.at, rd.size / n);
    std::uint64_t out = 0;
    for (auto at = rd.offset; at < rd.offset + rd.size;) {
      const auto end = policy::load_plan::run_end_at(e, at), block = (end - at) / n;
      std::memcpy(dst.data() + out, src + (at - rd.offset) + cut.part * block, block);
      out += block;
      at = end;
    }
    if (dev) L.uploads.emplace_back(L.data_at(cut.at, rd.size / n), dst);
  }
  std::sort(L.uploads.begin(), L.uploads.end(), [](const auto& a, const auto& b) { return a.first.data() < b.first.data(); });
  std::size_t n = 0;
  for (const auto& u : L.uploads) {
    auto& prev = L.uploads[n ? n - 1 : 0];
    if (n && prev.first.data() + prev.first.size() == u.first.data() &&
        prev.second.data() + prev.second.size() == u.second.data())
      prev = {{prev.first.data(), prev.first.size() + u.first.size()}, {prev.second.data(), prev.second.size() + u.second.size()}};
    else
      L.uploads[n++] = u;
  }
  L.uploads.resize(n);
  for (const auto& u : L.uploads) L.uploaded += u.first.size();
}


class read_window : public pipeable {
 public:
  using input_type = window_ticket;  ///< the window to read, in plan order
  using output_type = window_state;

  /// `lane`: the load's device lane; null: none (every tensor in host memory).
  /// `map_above`: a tensor (part) of at least this many bytes that this rank
  /// keeps in host memory as it lies in the file, and whose bytes all come
  /// to it through its source (its reads and takes: no message carries any
  /// of them, to it or from it), is handed out as a view of the page cache
  /// where the source can map it, not read into the window
  /// (load_options::map_above; 0: never).
  /// `node_window`: under node_copy::window, the node window
  /// (schedule::node_window_bytes per parity), mapped by every local rank;
  /// `gate`: where windows overlap, the node window's parity_gate (window.hpp).
  /// `delivery`: a tensor (part) of at least `delivery.above` bytes that
  /// this rank keeps in host memory, and whose bytes all come to it through
  /// its source as it lies in the file (below: whole), is not read into the
  /// window but left to deliver_window, which reads it as it delivers it
  /// (window_state::at_delivery; distributed_options::pieces_above; 0:
  /// never). A view of the page cache (map_above) comes first.
  read_window(const checkpoint& ck, const policy::load_plan& plan, const policy::schedule& schedule, policy::rank_t me,
              any_device_lane* lane, window_buffers& buffers, slice_reader& reader, std::uint64_t map_above = 0,
              const memory::node_window* node_window = nullptr, parity_gate* gate = nullptr, delivery_reads delivery = {})
      : ck_(&ck), plan_(&plan), schedule_(&schedule), me_(me), lane_(lane), buffers_(&buffers), reader_(&reader),
        map_above_(map_above), pieces_above_(delivery.above), node_window_(node_window), gate_(gate) {
    // Each lane's regions at the largest size they have in any window: every
    // window then fits every buffer, which the next window of its kind
    // takes again once free (memory/window_buffers.hpp); the host lane's
    // buffers of both parities (lane 0) stay in reserve between windows and
    // loads (a device lane's are its own). The kept region's size leaves
    // out the parts deliver_window reads (they lie last in it: the schedule
    // puts parts without a message last, smallest first), so a window of
    // one large tensor takes no buffer for it; the pieces deliver_window
    // reads such parts in come from the same buffers, and stay in reserve too.
    bool at_delivery = false;
    for (const auto& ws : schedule.windows)
      for (std::size_t k = 0; k < ws.lanes.size() && k < 2; ++k) {
        const auto& lay = ws.lanes[k].ranks.at(me);
        std::uint64_t kept = 0;
        for (const auto& part : lay.kept) {
          const auto n = plan.kept_bytes(plan.entries[part.entry]);
          if (read_at_delivery(part.entry, lay, k == 1))
            at_delivery = true;
          else
            kept = std::max(kept, part.off + n);
        }
        largest_[k][0] = std::max(largest_[k][0], kept);
        largest_[k][1] = std::max(largest_[k][1], lay.scratch_bytes);
      }
    const auto pieces = at_delivery ? delivery.depth * buffers.capacity_for(delivery.piece) : 0;
    buffers.reserve(2 * (buffers.capacity_for(largest_[0][0]) + buffers.capacity_for(largest_[0][1])) + pieces);
  }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    using clock = std::chrono::steady_clock;
    for (;;) {
      auto t = co_await in.receive();
      if (!t) break;
      if (t->failure && !failure_) failure_ = t->failure;
      fault_point("reads", me_);
      if (gate_) co_await gate_->wait(t->window);  // its parity of the node window is free on every local rank
      const auto r0 = clock::now();
      window_state ws;
      planned_reads reads;
      if (!failure_) {
        try {
          std::vector<std::size_t> mapped;  // entries (i - begin) mapped, in the order of their extents in `reads`
          reads = lay_out(t->window, ws, mapped);
          std::vector<lease> views(mapped.empty() ? 0 : reads.size());
          co_await reader_->read(reads, mapped.empty() ? nullptr : &views);  // one batch for every lane: adjacent slices still coalesce
          for (std::size_t k = 0, m = 0; k < reads.size(); ++k)
            if (reads[k].map) {
              const auto at = mapped.at(m++);
              ws.kept_at[at] = views[k].bytes();
              ws.views[at] = std::move(views[k]);
            }
          // Bytes that come through the node window arrive after the status
          // exchange (exchange_window copies them, then cuts): cut now only
          // what this rank has.
          if (ws.node_copies.empty())
            for (auto& L : ws.lanes) cut_and_list_uploads(*plan_, L);
          else
            ws.cut_later = true;
        } catch (...) {
          failure_ = std::current_exception();
        }
      }
      if (failure_) ws = failed(t->window, ws.stats.fetched);
      ws.failure = failure_;
      ws.stats.read_seconds = std::chrono::duration<double>(clock::now() - r0).count();
      co_await out.send(std::move(ws));
    }
  }

 private:
  // A window of a rank that failed: no layout, only what its status exchange needs.
  window_state failed(std::uint32_t w, std::uint64_t fetched) const {
    window_state ws;
    ws.window = w;
    ws.status = schedule_->windows.at(w).status;  // every rank enters the same status exchanges
    ws.stats.fetched = fetched;
    return ws;
  }

  // Lays window `w` out from the schedule: its entries, lanes, memory and
  // messages; returns this rank's reads of it (into the window's host
  // memory), and, one extent each, the entries it maps instead (`mapped`,
  // in the order of their extents).
  planned_reads lay_out(std::uint32_t w, window_state& ws, std::vector<std::size_t>& mapped) {
    const auto& plan = *plan_;
    const auto me = me_;
    const auto& sched = schedule_->windows.at(w);
    ws.window = w;
    ws.begin = sched.begin;
    ws.end = sched.end;
    ws.relayed = sched.relayed;
    ws.status = sched.status;
    ws.kept_at.resize(ws.end - ws.begin);
    ws.views.resize(ws.end - ws.begin);
    ws.lane_of.assign(ws.end - ws.begin, 0);
    ws.at_delivery.resize(ws.end - ws.begin);
    if (lane_) {
      ws.lanes.resize(2);
      ws.lanes[0].which = window_lane::host;
      ws.lanes[1].which = window_lane::device;
    } else {
      ws.lanes.resize(1);
    }
    // The schedule's layouts of this window (one per lane): their offsets
    // become spans of this window's buffers (host memory for the reads; for
    // the device lane, also its memory).
    planned_reads reads;
    constexpr auto none = ~std::size_t{0};
    std::size_t choice_for = none;  // the entry `choice` is whole_part's answer for
    whole choice = whole::no;
    for (std::uint8_t k = 0; k < ws.lanes.size(); ++k) {
      auto& L = ws.lanes[k];
      const bool dev = L.which == window_lane::device;
      const auto& scheduled = sched.lanes.at(k);
      const auto& lay = scheduled.ranks.at(me);
      L.layout = &lay;
      if (node_window_) L.node = node_window_->parity(w);
      const unsigned slot = (w % 2) * 2;
      const auto kept = lay.kept_bytes && largest_[k][0] ? largest_[k][0] : 0, scratch = lay.scratch_bytes ? largest_[k][1] : 0;
      L.kept = dev ? lane_->host_buffer(slot, kept) : buffers_->get(kept);
      L.scratch = dev ? lane_->host_buffer(slot + 1, scratch) : buffers_->get(scratch);
      if (dev) {
        L.dev_kept = lane_->device_buffer(slot, kept);
        L.dev_scratch = lane_->device_buffer(slot + 1, scratch);
      }
      for (const auto& part : lay.kept) {
        ws.lane_of[part.entry - ws.begin] = k;
        if (read_at_delivery(part.entry, lay, dev)) continue;  // no room in the window: see below
        ws.kept_at[part.entry - ws.begin] = L.data_at({true, part.off}, plan.kept_bytes(plan.entries[part.entry]));
      }
      // This rank's ends of the lane's messages, and of its relays' second steps.
      auto ends = [&L](const std::vector<policy::scheduled_message>& msgs, const std::vector<std::size_t>& sends,
                       const std::vector<std::size_t>& recvs, std::vector<comm::send_message>& out_sends,
                       std::vector<comm::recv_message>& out_recvs) {
        for (auto i : sends) {
          const auto& m = msgs[i];
          out_sends.push_back({m.to, m.tag, L.data_at(m.src, m.size)}), L.sent += m.size;
        }
        for (auto i : recvs) {
          const auto& m = msgs[i];
          out_recvs.push_back({m.from, m.tag, L.data_at(m.dst, m.size)}), L.received += m.size;
        }
      };
      ends(scheduled.messages, lay.sends, lay.recvs, L.sends, L.recvs);
      ends(scheduled.second, lay.sends2, lay.recvs2, L.sends2, L.recvs2);
      L.two_steps = !scheduled.second.empty();
      for (std::size_t x = 0; x < lay.reads.size(); ++x) {
        const auto& r = lay.reads[x];
        const auto& e = plan.entries[r.entry];
        const auto& rd = e.reads[r.read];
        if (r.node != policy::rank_layout::read_at::none) {
          // Through the node window: the reader reads there; it and every
          // take copy to `at` once the status exchange says all have read.
          // The device lane uploads from there instead (the window is pinned
          // once per load), except the whole rows of a column split, which
          // are cut in host memory first.
          const auto there = L.node.subspan(r.node, rd.size);
          if (!r.taken) reads.push_back({&ck_->tensors()[e.index], rd.offset, rd.size, there});
          (r.taken ? ws.stats.node : ws.stats.fetched) += rd.size;
          if (dev && rd.size && e.split != policy::tp_split::columns) {
            L.uploads.emplace_back(L.data_at(r.at, rd.size), there);
            continue;
          }
          ws.node_copies.emplace_back(L.host_at(r.at, rd.size), there);
        } else {
          (r.taken ? ws.stats.taken : ws.stats.fetched) += rd.size;
          // This rank's reads of e are contiguous in lay.reads: one choice for all of them.
          const bool first = choice_for != r.entry;
          if (first) choice = dev ? whole::no : whole_part(e, lay, x), choice_for = r.entry;
          if (choice == whole::mapped) {  // one view for all of them
            if (first) {
              const auto& t = ck_->tensors()[e.index];
              reads.push_back({&t, plan.kept_begin(e, me), plan.kept_bytes(e), {}, true});
              mapped.push_back(r.entry - ws.begin);
              ws.stats.mapped += plan.kept_bytes(e);
            }
            continue;
          }
          // Bytes several ranks of the node read (the reader and those that
          // take them, in any order: windows do not wait on each other's
          // reads) go through the page cache, so the disk gives each once;
          // the bytes one rank alone reads may bypass it (O_DIRECT where not
          // cached).
          const bool shared = rd.exchanged && schedule_->node == policy::node_copy::page_cache;
          if (choice == whole::at_delivery) {  // deliver_window reads it, in file order
            auto& later = ws.at_delivery[r.entry - ws.begin];
            later.push_back({&ck_->tensors()[e.index], rd.offset, rd.size, {}, false, shared});
            if (x + 1 == lay.reads.size() || lay.reads[x + 1].entry != r.entry) {
              std::sort(later.begin(), later.end(), [](const byte_extent& a, const byte_extent& b) { return a.offset < b.offset; });
              ws.stats.delivered_read += plan.kept_bytes(e);
            }
            continue;
          }
          reads.push_back({&ck_->tensors()[e.index], rd.offset, rd.size, L.host_at(r.at, rd.size), false, shared});
        }
        // What a device-lane rank read travels or stays as read, except the
        // whole rows of a column split: its cut parts do.
        if (dev && rd.size && e.split != policy::tp_split::columns)
          L.uploads.emplace_back(L.data_at(r.at, rd.size), L.host_at(r.at, rd.size));
      }
    }
    return reads;
  }

  // How this rank gets its part of e, one of whose reads (and takes) in
  // `lay` is lay.reads[x]: as a view of the page cache (map_above), read by
  // deliver_window (pieces_above), or into the window (no).
  enum class whole : std::uint8_t { no, mapped, at_delivery };
  whole whole_part(const policy::plan_entry& e, const policy::rank_layout& lay, std::size_t x) const {
    const auto n = plan_->kept_bytes(e);
    // Not views through the node window's schedule (S3, O_DIRECT, page_cache off): no page cache carries its takes.
    const bool may_map = map_above_ && n >= map_above_ && schedule_->node != policy::node_copy::window;
    const bool may_deliver = pieces_above_ && n >= pieces_above_;
    if ((!may_map && !may_deliver) || !comes_whole(e, lay, x)) return whole::no;
    const auto& t = ck_->tensors()[e.index];
    if (may_map && reader_->source().can_map(t.shard, t.offset + plan_->kept_begin(e, me_), n)) return whole::mapped;
    return may_deliver ? whole::at_delivery : whole::no;
  }

  // Whether deliver_window reads this rank's part of plan entry `i` (kept in
  // `lay`, of the device lane or not): the same choice as whole_part's,
  // without the page cache's say (a part it could map needs no room in the
  // window either).
  bool read_at_delivery(std::size_t i, const policy::rank_layout& lay, bool dev) const {
    if (dev || !pieces_above_) return false;
    const auto& e = plan_->entries[i];
    if (plan_->kept_bytes(e) < pieces_above_) return false;
    for (std::size_t x = 0; x < lay.reads.size(); ++x)
      if (lay.reads[x].entry == i) return comes_whole(e, lay, x);
    return false;
  }

  // Whether every byte this rank keeps of e comes to it through its source,
  // as it lies in the file: its reads and takes of e (lay.reads[x] one of
  // them) all land in its kept part as read and together cover it, none
  // goes through the node window, no message carries any of e's bytes to or
  // from it (within a node, the page cache carries them), and no column
  // part is cut. Its part is then one range of the file, which it may map,
  // or read when it delivers it.
  bool comes_whole(const policy::plan_entry& e, const policy::rank_layout& lay, std::size_t x) const {
    if (!e.owners.contains(me_) || e.split == policy::tp_split::columns) return false;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> covered;  // (offset, size) of its reads, as they lie
    while (x > 0 && lay.reads[x - 1].entry == lay.reads[x].entry) --x;  // its reads of e are contiguous: from the first
    for (std::size_t y = x; y < lay.reads.size() && lay.reads[y].entry == lay.reads[x].entry; ++y) {
      if (!lay.reads[y].at.kept || lay.reads[y].node != policy::rank_layout::read_at::none) return false;
      const auto& rd = e.reads[lay.reads[y].read];
      covered.emplace_back(rd.offset, rd.size);
    }
    std::sort(covered.begin(), covered.end());
    auto at = plan_->kept_begin(e, me_);
    for (const auto& [off, n] : covered) {
      if (off != at) return false;
      at += n;
    }
    if (at != plan_->kept_begin(e, me_) + plan_->kept_bytes(e)) return false;
    for (const auto& m : plan_->messages_of(e)) {
      const auto from = e.reads[m.read].reader;
      const bool travels = schedule_->node == policy::node_copy::none || plan_->node_of(from) != plan_->node_of(m.to);
      if (travels && (from == me_ || m.to == me_)) return false;
    }
    return true;
  }

  const checkpoint* ck_;
  const policy::load_plan* plan_;
  const policy::schedule* schedule_;
  policy::rank_t me_;
  any_device_lane* lane_;  // null: no device lane
  window_buffers* buffers_;
  std::uint64_t largest_[2][2] = {};  // by lane: the largest kept and scratch region of any window
  slice_reader* reader_;
  std::uint64_t map_above_;
  std::uint64_t pieces_above_;
  const memory::node_window* node_window_;
  parity_gate* gate_;  // overlapped windows through the node window: null otherwise
  std::exception_ptr failure_;   // this rank's first failure (sticky)
};

}  // namespace sluice::inline v0::detail
