#pragma once
/// \file
/// An HTTP(S) endpoint of an object store: scheme, host and port (S3's and
/// any later store's).

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::inline v0::http {

/// An HTTP(S) endpoint: scheme, host and port.
struct endpoint {
  std::string scheme = "https";   ///< "http" or "https"
  std::string host;               ///< name or IP address (IPv6 without brackets)
  std::uint16_t port = 443;

  /// Parses "http[s]://host[:port][/]"; throws config_error on anything else.
  [[nodiscard]] static endpoint parse(std::string_view url);
  [[nodiscard]] bool tls() const noexcept { return scheme == "https"; }
  /// "https://host:port" (the port only when not the scheme's default).
  [[nodiscard]] std::string url() const;
  /// The Host header for `host_name` on this endpoint's port.
  [[nodiscard]] std::string host_header(std::string_view host_name) const;
  /// True for IPv4/IPv6 literals and "localhost" (these get path-style addressing).
  [[nodiscard]] bool is_ip_or_localhost() const;
};

}  // namespace sluice::inline v0::http
