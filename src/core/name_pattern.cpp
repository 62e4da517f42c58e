// Name patterns (format/name_pattern.hpp): RE2, or by hand for the
// `LITERAL(\d+)LITERAL` form. std::regex is not used on names: libstdc++'s
// matcher recurses once per character (a name of 200,000 digits overflowed
// the stack) and backtracks.

#include <sluice/format/name_pattern.hpp>

#include <cctype>
#include <string>

#include <fmt/format.h>
#include <re2/re2.h>

#include <sluice/error.hpp>

namespace sluice::inline v0::format {

namespace {

// Bytes RE2 gives a special meaning outside a character class.
constexpr std::string_view metachars = R"(\.^$|?*+()[]{})";

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

// The literal text `p` spells, if it is only plain bytes and escaped
// metacharacters (`\.`); nullopt for anything RE2 must interpret.
std::optional<std::string> literal(std::string_view p) {
  std::string out;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 == p.size() || metachars.find(p[i + 1]) == std::string_view::npos) return std::nullopt;
      out += p[++i];
    } else if (metachars.find(c) != std::string_view::npos) {
      return std::nullopt;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

struct name_pattern::impl {
  std::string text;
  // The hand-parsed form PREFIX(\d+)SUFFIX: both literal, PREFIX not empty
  // and SUFFIX not starting with a digit (so the digit run is taken whole,
  // as RE2's greedy \d+ would).
  bool by_hand = false;
  std::string prefix, suffix;
  std::unique_ptr<re2::RE2> re;

  // Leftmost match of PREFIX digits SUFFIX: the digits, or nullopt.
  std::optional<std::string_view> numbered(std::string_view name) const {
    for (std::size_t at = name.find(prefix); at != std::string_view::npos; at = name.find(prefix, at + 1)) {
      const std::size_t first = at + prefix.size();
      std::size_t end = first;
      while (end < name.size() && is_digit(name[end])) ++end;
      if (end > first && name.substr(end).starts_with(suffix)) return name.substr(first, end - first);
    }
    return std::nullopt;
  }
};

name_pattern::name_pattern(std::string_view pattern) {
  auto i = std::make_shared<impl>();
  i->text = std::string(pattern);
  static constexpr std::string_view group = R"((\d+))";
  if (const auto g = pattern.find(group); g != std::string_view::npos) {
    auto prefix = literal(pattern.substr(0, g));
    auto suffix = literal(pattern.substr(g + group.size()));
    if (prefix && suffix && !prefix->empty() && !(suffix->size() && is_digit(suffix->front()))) {
      i->by_hand = true;
      i->prefix = std::move(*prefix);
      i->suffix = std::move(*suffix);
    }
  }
  if (!i->by_hand) {
    re2::RE2::Options o;
    o.set_log_errors(false);
    i->re = std::make_unique<re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()), o);
    if (!i->re->ok())
      throw config_error(fmt::format("pattern '{}' is not a valid regular expression (RE2 syntax): {}",
                                     printable(pattern, 256), i->re->error()));
  }
  impl_ = std::move(i);
}

const std::string& name_pattern::pattern() const noexcept {
  static const std::string none;
  return impl_ ? impl_->text : none;
}

int name_pattern::groups() const noexcept {
  if (!impl_) return 0;
  return impl_->by_hand ? 1 : impl_->re->NumberOfCapturingGroups();
}

bool name_pattern::hand_parsed() const noexcept { return impl_ && impl_->by_hand; }

bool name_pattern::search(std::string_view name) const {
  if (!impl_) return false;
  if (impl_->by_hand) return impl_->numbered(name).has_value();
  return impl_->re->Match(re2::StringPiece(name.data(), name.size()), 0, name.size(), re2::RE2::UNANCHORED, nullptr, 0);
}

std::optional<std::string_view> name_pattern::group(std::string_view name) const {
  if (!impl_) return std::nullopt;
  if (impl_->by_hand) return impl_->numbered(name);
  if (impl_->re->NumberOfCapturingGroups() < 1) return std::nullopt;
  re2::StringPiece g[2];
  if (!impl_->re->Match(re2::StringPiece(name.data(), name.size()), 0, name.size(), re2::RE2::UNANCHORED, g, 2))
    return std::nullopt;
  if (g[1].data() == nullptr) return std::nullopt;   // the group took no part in the match
  return std::string_view(g[1].data(), g[1].size());
}

std::function<bool(std::string_view)> matching(std::string_view pattern) {
  name_pattern p(pattern);
  return [p = std::move(p)](std::string_view name) { return p.search(name); };
}

}  // namespace sluice::inline v0::format
