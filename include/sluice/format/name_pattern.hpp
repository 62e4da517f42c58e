#pragma once
/// \file
/// Patterns over tensor names: RE2 syntax, matched in time linear in the
/// name, with no recursion and no backtracking.
///
/// A checkpoint's names come from whoever published it, and patterns come
/// from users (`--select`, `select=`, the classifier's table and pipeline
/// patterns, a contract's layer pattern): both meet here, in the compiled
/// core (src/core/name_pattern.cpp), where RE2 does the matching. RE2 is the
/// core's private dependency: no installed header names it. Its syntax is
/// ECMAScript's for everything sluice's presets use (`\d`, `\.`, `(a|b)`,
/// `^`, `$`, groups); it has no backreferences and no lookaround
/// (https://github.com/google/re2/wiki/Syntax). A pattern of the form
/// `LITERAL(\d+)LITERAL` (the layer and expert rules, `layers\.(\d+)\.`) is
/// matched by hand, without RE2, with the same leftmost-match result.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::inline v0::format {

/// A compiled pattern, searched (not anchored) in a name. Copies share the
/// compiled form; matching is const and safe from any thread.
class name_pattern {
 public:
  /// Matches nothing.
  name_pattern() = default;
  /// Compiles `pattern` (RE2 syntax). Throws config_error naming the pattern
  /// and RE2's reason when it is not valid.
  explicit name_pattern(std::string_view pattern);

  /// No pattern: search() is false for every name.
  [[nodiscard]] bool empty() const noexcept { return impl_ == nullptr; }
  /// The pattern's text ("" when empty()).
  [[nodiscard]] const std::string& pattern() const noexcept;
  /// Capture groups in the pattern.
  [[nodiscard]] int groups() const noexcept;
  /// Whether the pattern matches somewhere in `name`.
  [[nodiscard]] bool search(std::string_view name) const;
  /// The text of the first capture group in the leftmost match (a view into
  /// `name`); nullopt when there is no match or the group took no part in it.
  [[nodiscard]] std::optional<std::string_view> group(std::string_view name) const;
  /// Whether matching is done by hand (the `LITERAL(\d+)LITERAL` form) rather than by RE2.
  [[nodiscard]] bool hand_parsed() const noexcept;

 private:
  struct impl;
  std::shared_ptr<const impl> impl_;
};

/// A name filter for open_options::select: true for the names `pattern`
/// (RE2 syntax) matches somewhere. Throws config_error for an invalid pattern.
[[nodiscard]] std::function<bool(std::string_view)> matching(std::string_view pattern);

}  // namespace sluice::inline v0::format
