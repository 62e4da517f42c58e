#pragma once
/// \file
/// `testing::reload_meter`: a sink in front of a `manifest::reload_session`
/// that checks, view by view, the session's memory bound — the bytes it
/// buffers never exceed this rank's share of the layers still incomplete —
/// and reports the figures a test asserts on and a bench prints.
///
/// *This rank's share of the incomplete layers*, at a moment: the contract's
/// bytes (`layer_contract::bytes`, the rank's own keys' source tensors) of the
/// layers that received a tensor of the current update and are not yet
/// published. The bound is computed from outside the session, from the
/// contract and `published()` alone, so a test does not take the session's
/// word for it.
///
/// Where the session's buffering peaks inside one `accept` (the buffer of the
/// view's tensor is made at its first piece, and a layer that this view
/// completes is published and freed before `accept` returns), the meter takes
/// the bytes buffered before the call plus the part the view's tensor
/// occupies (nothing for a whole shared view, which the session keeps
/// instead of copying), against the share with the view's layers counted and the
/// publish states from before the call. After the call it checks the bytes
/// still buffered against the share then. One meter per session and update:
/// `finish()` ends both.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <sluice/manifest/contract.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::testing {

template <class Session>
class reload_meter {
 public:
  static constexpr bool whole_tensors = Session::whole_tensors;

  explicit reload_meter(Session& s) : s_(&s) {
    for (const auto& [l, lc] : s.expected().layers())
      for (const auto& k : lc.keys) {
        auto& ls = layers_of_[k.source];
        if (ls.empty() || ls.back() != l) ls.push_back(l);
      }
  }

  bool accept(tensor_view v) {
    const bool opens = v.carries_data() && v.first();
    // The session copies what it buffers, except a whole shared view (the
    // node's one copy), which it keeps as it is.
    const bool copies = opens && !(v.kind == view_kind::shared && v.whole());
    const std::uint64_t part = copies ? v.part_size() : 0;
    if (opens)
      if (auto it = layers_of_.find(v.name()); it != layers_of_.end()) touched_.insert(it->second.begin(), it->second.end());
    const auto share_before = share();
    const auto buffered_before = s_->stats().buffered_bytes;
    const bool kept = s_->accept(std::move(v));
    // accept() returns true only for a piece it buffered: a new tensor's
    // buffer was made during the call, at `part` bytes.
    const auto peak_in_call = buffered_before + (kept ? part : 0);
    note(peak_in_call, share_before);
    note(s_->stats().buffered_bytes, share());
    max_share_ = std::max(max_share_, share_before);
    return kept;
  }

  bool finish() {
    touched_.clear();
    return s_->finish();
  }

  /// The most bytes the session buffered at once (its own count).
  [[nodiscard]] std::uint64_t peak_buffered() const noexcept { return s_->stats().peak_buffered_bytes; }
  /// The bound at the moment the meter saw the most bytes buffered.
  [[nodiscard]] std::uint64_t share_at_peak() const noexcept { return share_at_peak_; }
  /// The largest share of incomplete layers over the update.
  [[nodiscard]] std::uint64_t max_share() const noexcept { return max_share_; }
  /// The most the buffered bytes exceeded the share at any check (0: the bound held).
  [[nodiscard]] std::uint64_t max_excess() const noexcept { return max_excess_; }
  /// The most bytes buffered at a check (<= peak_buffered()).
  [[nodiscard]] std::uint64_t seen_peak() const noexcept { return seen_peak_; }
  /// Bytes of the rank's whole contract.
  [[nodiscard]] std::uint64_t contract_bytes() const { return s_->expected().bytes(); }

 private:
  [[nodiscard]] std::uint64_t share() const {
    std::uint64_t n = 0;
    for (const auto l : touched_)
      if (!s_->published(l))
        if (const auto* lc = s_->expected().layer(l)) n += lc->bytes;
    return n;
  }
  void note(std::uint64_t buffered, std::uint64_t bound) {
    if (buffered > bound) max_excess_ = std::max(max_excess_, buffered - bound);
    if (buffered >= seen_peak_) {
      seen_peak_ = buffered;
      share_at_peak_ = bound;
    }
  }

  Session* s_;
  std::map<std::string, std::vector<std::int64_t>, std::less<>> layers_of_;  ///< source → layers of its keys
  std::set<std::int64_t> touched_;
  std::uint64_t max_share_ = 0, max_excess_ = 0, seen_peak_ = 0, share_at_peak_ = 0;
};

}  // namespace sluice::inline v0::testing
