#pragma once
/// \file
/// The sluice::error hierarchy. Every error names what it is about: the file or
/// object, the tensor and the byte range, where they are known. Every class is
/// declared here, except those of the optional components: S3's in
/// s3/error.hpp, CUDA's and NCCL's in cuda/error.hpp.

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace sluice::inline v0 {

/// `s` as it may be printed inside one line of text: a tab, a newline and
/// every other control byte become `\t`, `\n`, `\r` or `\xHH`; with
/// `escape_backslash`, a backslash becomes `\\` too (so that the escapes
/// cannot be forged: what names use); longer than `max` bytes, it is cut at
/// `max` and "...(N bytes)" says how long it was. A checkpoint's names and
/// an S3 server's keys come from strangers: whatever prints one (errors,
/// `--digest` lines) prints it through this, so that a name cannot forge a
/// line of output.
[[nodiscard]] inline std::string printable(std::string_view s, std::size_t max = std::string_view::npos,
                                           bool escape_backslash = true) {
  static constexpr char hex[] = "0123456789abcdef";
  auto n = std::min(s.size(), max);
  while (n < s.size() && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // whole UTF-8 characters
  std::string out;
  out.reserve(n + 16);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '\\': out += escape_backslash ? "\\\\" : "\\"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  if (n < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

/// A half-open byte range [begin, end) in a file or object.
struct byte_range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  [[nodiscard]] std::uint64_t size() const noexcept { return end - begin; }
  friend bool operator==(const byte_range&, const byte_range&) = default;
};

/// What an error is about. Empty fields are unknown / not applicable.
struct error_context {
  std::string file;                  ///< file path or s3://bucket/key
  std::string tensor;                ///< tensor name
  std::optional<byte_range> range;   ///< bytes within `file`
};

/// Base of every exception sluice throws. `what()` is a complete one-line
/// message: "<detail> (file F, tensor T, bytes [b, e))".
class error : public std::runtime_error {
 public:
  error(std::string detail, error_context ctx = {})
      : std::runtime_error(compose(detail, ctx)), detail_(std::move(detail)), ctx_(std::move(ctx)) {}

  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }
  [[nodiscard]] const std::string& file() const noexcept { return ctx_.file; }
  [[nodiscard]] const std::string& tensor() const noexcept { return ctx_.tensor; }
  [[nodiscard]] const std::optional<byte_range>& range() const noexcept { return ctx_.range; }
  [[nodiscard]] const error_context& context() const noexcept { return ctx_; }

 private:
  // One line whatever the detail, file and tensor hold (they may quote names
  // and keys that strangers chose): control bytes escaped, each part bounded.
  static std::string compose(const std::string& detail, const error_context& c) {
    std::string s = printable(detail, max_detail_bytes, false);
    std::string where;
    auto add = [&where](const std::string& part) {
      if (!where.empty()) where += ", ";
      where += part;
    };
    if (!c.file.empty()) add(fmt::format("file '{}'", printable(c.file, max_name_bytes)));
    if (!c.tensor.empty()) add(fmt::format("tensor '{}'", printable(c.tensor, max_name_bytes)));
    if (c.range) add(fmt::format("bytes [{}, {})", c.range->begin, c.range->end));
    if (!where.empty()) s += " (" + where + ")";
    return s;
  }
  static constexpr std::size_t max_detail_bytes = 8192, max_name_bytes = 512;
  std::string detail_;
  error_context ctx_;
};

/// A checkpoint file (safetensors header, index) breaks a format rule.
/// `rule()` is a short stable identifier of the violated rule, e.g. "header-length".
class format_error : public error {
 public:
  format_error(std::string rule, std::string detail, error_context ctx = {})
      : error(fmt::format("{}: {}", rule, detail), std::move(ctx)), rule_(std::move(rule)) {}
  [[nodiscard]] const std::string& rule() const noexcept { return rule_; }

 private:
  std::string rule_;
};

/// The sharded index disagrees with itself or with the shards.
class index_error : public format_error {
 public:
  using format_error::format_error;
};

/// Reading from storage failed (errno-style `code()`, 0 when not applicable).
class io_error : public error {
 public:
  io_error(std::string detail, error_context ctx = {}, int code = 0)
      : error(std::move(detail), std::move(ctx)), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }

 private:
  int code_;
};

/// The storage returned fewer bytes than the checkpoint's headers promise
/// (a truncated file or object).
class truncated_error : public io_error {
 public:
  using io_error::io_error;
};

/// A load was stopped by request.
class cancelled_error : public error {
 public:
  explicit cancelled_error(std::string detail = "load cancelled") : error(std::move(detail)) {}
};

/// An invalid option, topology or plan (caught before any I/O).
class config_error : public error {
 public:
  using error::error;
};

/// A feature whose component the program does not link: a location's URI
/// scheme (s3://: sluice::s3) or a multi-rank world (sluice::gloo).
/// `component()` names the CMake target to link. A component registers its
/// backend when the program links its target (docs/design.md, "Components
/// and CMake targets"); nothing needs to be included for it.
class missing_component_error : public config_error {
 public:
  missing_component_error(std::string component, std::string detail, error_context ctx = {})
      : config_error(std::move(detail), std::move(ctx)), component_(std::move(component)) {}
  [[nodiscard]] const std::string& component() const noexcept { return component_; }

 private:
  std::string component_;
};

/// A contract or reload rule was broken (see sluice/manifest/).
class contract_error : public error {
 public:
  using error::error;
};

/// The system refused a resource sluice needs: memory, a mapping, a library
/// call that cannot fail on valid input (OpenSSL's digests).
class resource_error : public error {
 public:
  using error::error;
};

/// An API was used against its documented contract (a programming error in
/// the caller, e.g. sending on a closed channel).
class usage_error : public error {
 public:
  using error::error;
};

/// Another rank of a distributed load (or this one) failed; every rank throws
/// it, naming the lowest failed rank and its error.
class distributed_error : public error {
 public:
  distributed_error(std::string detail, std::size_t failed_rank)
      : error(std::move(detail)), failed_rank_(failed_rank) {}
  /// The lowest rank that reported a failure.
  [[nodiscard]] std::size_t failed_rank() const noexcept { return failed_rank_; }

 private:
  std::size_t failed_rank_;
};

namespace comm {
/// A collective failed: a peer disconnected, timed out, or reported an error.
class comm_error : public error {
 public:
  using error::error;
};

/// A peer died (its process ended without a word: killed, crashed): every
/// survivor throws it within seconds, in whatever phase the load was, naming
/// the rank and, once the load has added it, the phase. A peer that hangs
/// without dying (stopped) is never reported as lost: see comm_timeout.
class peer_lost : public comm_error {
 public:
  peer_lost(std::size_t lost_rank, std::string detail, std::string phase = {})
      : comm_error(compose(lost_rank, detail, phase)), lost_rank_(lost_rank), what_(std::move(detail)), phase_(std::move(phase)) {}
  /// The rank that died.
  [[nodiscard]] std::size_t lost_rank() const noexcept { return lost_rank_; }
  /// The phase of the load that saw it ("exchanging window 2 of 5"); empty when unknown.
  [[nodiscard]] const std::string& phase() const noexcept { return phase_; }
  /// How the loss was seen, without the rank and the phase.
  [[nodiscard]] const std::string& reason() const noexcept { return what_; }
  /// The same loss, in `phase` (kept when a phase is already known).
  [[nodiscard]] peer_lost in_phase(std::string phase) const {
    return phase_.empty() ? peer_lost(lost_rank_, what_, std::move(phase)) : *this;
  }

 private:
  static std::string compose(std::size_t r, const std::string& detail, const std::string& phase) {
    return phase.empty() ? fmt::format("peer rank {} lost: {}", r, detail)
                         : fmt::format("peer rank {} lost while {}: {}", r, phase, detail);
  }
  std::size_t lost_rank_;
  std::string what_, phase_;
};

/// A collective ran out of the communicator's timeout: a peer hangs without
/// dying (stopped, stuck), or the machine is too slow for the timeout.
/// Names the ranks that had not reached the collective, where known.
class comm_timeout : public comm_error {
 public:
  comm_timeout(std::vector<std::size_t> lagging, std::string detail, std::string phase = {})
      : comm_error(compose(lagging, detail, phase)), lagging_(std::move(lagging)), what_(std::move(detail)), phase_(std::move(phase)) {}
  /// The ranks that had not reached the collective that timed out (empty: unknown).
  [[nodiscard]] const std::vector<std::size_t>& lagging() const noexcept { return lagging_; }
  [[nodiscard]] const std::string& phase() const noexcept { return phase_; }
  [[nodiscard]] comm_timeout in_phase(std::string phase) const {
    return phase_.empty() ? comm_timeout(lagging_, what_, std::move(phase)) : *this;
  }

 private:
  static std::string compose(const std::vector<std::size_t>& lagging, const std::string& detail, const std::string& phase) {
    std::string who;
    for (auto r : lagging) who += (who.empty() ? "" : ", ") + std::to_string(r);
    std::string s = "timed out";
    if (!phase.empty()) s += " while " + phase;
    if (!who.empty()) s += fmt::format(" (rank{} {} did not get there)", lagging.size() > 1 ? "s" : "", who);
    return s + ": " + detail;
  }
  std::vector<std::size_t> lagging_;
  std::string what_, phase_;
};
}  // namespace comm

}  // namespace sluice::inline v0
