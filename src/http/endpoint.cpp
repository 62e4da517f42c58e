// HTTP(S) endpoints (http/endpoint.hpp).
#include <sluice/http/endpoint.hpp>

#include <arpa/inet.h>

#include <charconv>

#include <fmt/format.h>

#include <sluice/error.hpp>

#include "ascii.hpp"

namespace sluice::inline v0::http {

namespace {
std::string lower(std::string s) {
  for (auto& c : s) c = ascii::to_lower(c);
  return s;
}
}  // namespace

endpoint endpoint::parse(std::string_view url) {
  auto fail = [&](std::string_view why) {
    return config_error(fmt::format("invalid endpoint URL '{}': {} (expected http[s]://host[:port])", url, why));
  };
  endpoint e;
  auto sep = url.find("://");
  if (sep == std::string_view::npos) throw fail("no scheme");
  e.scheme = lower(std::string(url.substr(0, sep)));
  if (e.scheme != "http" && e.scheme != "https") throw fail("scheme must be http or https");
  auto rest = url.substr(sep + 3);
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    if (rest.substr(slash).find_first_not_of('/') != std::string_view::npos) throw fail("a path is not supported");
    rest = rest.substr(0, slash);
  }
  e.port = e.tls() ? 443 : 80;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {   // [IPv6]:port
    auto close = rest.find(']');
    if (close == std::string_view::npos) throw fail("unbalanced '['");
    e.host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw fail("junk after ']'");
      port = rest.substr(1);
    }
  } else {
    auto colon = rest.rfind(':');
    e.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
  }
  if (e.host.empty()) throw fail("no host");
  if (!port.empty()) {
    unsigned p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc{} || ptr != port.data() + port.size() || p == 0 || p > 65535) throw fail("bad port");
    e.port = static_cast<std::uint16_t>(p);
  }
  e.host = lower(e.host);
  return e;
}

std::string endpoint::host_header(std::string_view host_name) const {
  // fmt, not `"[" + std::string(...)`: GCC 12 warns (a false -Wrestrict) on
  // operator+(const char*, std::string&&) inlined at -O2.
  std::string h = host_name.find(':') != std::string_view::npos ? fmt::format("[{}]", host_name) : std::string(host_name);
  if (port != (tls() ? 443 : 80)) h += fmt::format(":{}", port);
  return h;
}

std::string endpoint::url() const { return scheme + "://" + host_header(host); }

bool endpoint::is_ip_or_localhost() const {
  if (host == "localhost" || host.ends_with(".localhost")) return true;
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace sluice::inline v0::http
