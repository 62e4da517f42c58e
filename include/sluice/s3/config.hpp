#pragma once
/// \file
/// Where and how to reach S3: endpoint, region, credentials, addressing style,
/// TLS verification, pool size, timeouts and retries - resolved from the
/// conventions users expect (AWS_* environment variables, ~/.aws/credentials
/// and ~/.aws/config with AWS_PROFILE), and `s3://bucket/key` URIs.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <sluice/cache/options.hpp>
#include <sluice/error.hpp>
#include <sluice/http/endpoint.hpp>
#include <sluice/s3/retry.hpp>
#include <sluice/s3/sigv4.hpp>

namespace sluice::inline v0::s3 {

/// Path-style (`host/bucket/key`) or virtual-hosted (`bucket.host/key`) URLs.
enum class addressing_style {
  automatic,       ///< path-style for IP / localhost endpoints and non-DNS bucket names, else virtual-hosted
  path,
  virtual_hosted,  ///< falls back to path-style for bucket names that cannot be host names
};

/// An HTTP(S) endpoint (the HTTP room's).
using http_endpoint = http::endpoint;

/// `s3://bucket/key`. A key ending in '/' (or empty) is a prefix.
struct object_uri {
  std::string bucket;
  std::string key;
  /// Parses "s3://bucket[/key]"; throws config_error naming the input otherwise.
  [[nodiscard]] static object_uri parse(std::string_view uri);
  [[nodiscard]] std::string str() const { return "s3://" + bucket + "/" + key; }
};

/// Looks up an environment variable (tests pass their own).
using env_lookup = std::function<std::optional<std::string>(const std::string&)>;
/// The process environment (std::getenv).
[[nodiscard]] std::optional<std::string> process_env(const std::string& name);

/// Everything an S3 client needs. Build one with `config::from_environment()`
/// and adjust fields, or fill it by hand.
struct config {
  http_endpoint endpoint;         ///< where requests go
  bool custom_endpoint = false;   ///< set from AWS_ENDPOINT_URL[_S3] / endpoint_url / by hand
  std::string region = "us-east-1";
  s3::credentials creds;          ///< anonymous when access_key_id is empty
  addressing_style addressing = addressing_style::automatic;
  bool verify_tls = true;         ///< verify the server certificate and host name
  std::string ca_bundle;          ///< PEM file of trusted CAs (AWS_CA_BUNDLE); empty = system store
  std::string profile = "default";

  std::size_t max_connections = 16;                    ///< pool size: concurrent requests per client
  std::chrono::milliseconds connect_timeout{10'000};   ///< TCP connect + TLS handshake
  /// Low-speed detection: a response that delivers fewer than
  /// `low_speed_limit` bytes/s over `low_speed_window` (or nothing at all for
  /// a window, headers included) is abandoned and retried.
  std::uint64_t low_speed_limit = 64 * 1024;
  std::chrono::milliseconds low_speed_window{10'000};
  retry_policy retry;
  /// Pages one listing may take (1000 keys each) before it is an error
  /// (ListingTooLong): a server that never stops saying "truncated" ends the
  /// listing instead of looping. A checkpoint's prefix holds far fewer keys.
  unsigned max_list_pages = 1000;
  /// The node-local cache objects are read through (cache/block_cache.hpp);
  /// none when `cache.dir` is empty. From SLUICE_CACHE_DIR and
  /// SLUICE_CACHE_MAX (a size: the cap) in from_environment().
  cache::options cache;

  /// Resolves the standard AWS conventions, in this order of precedence:
  /// - credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
  ///   then the profile (AWS_PROFILE, else "default") in AWS_SHARED_CREDENTIALS_FILE
  ///   (~/.aws/credentials), then in AWS_CONFIG_FILE (~/.aws/config, section
  ///   "[profile NAME]" or "[default]"); none found, or AWS_NO_SIGN_REQUEST=true:
  ///   anonymous (unsigned requests);
  /// - region: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, "us-east-1";
  /// - endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
  ///   `s3 = endpoint_url`, its `endpoint_url`, else https://s3.REGION.amazonaws.com;
  /// - addressing: the profile's `s3 = addressing_style` (auto | path | virtual);
  /// - CA bundle: AWS_CA_BUNDLE, the profile's `ca_bundle`;
  /// - the cache: SLUICE_CACHE_DIR, SLUICE_CACHE_MAX.
  /// Throws config_error for a malformed endpoint or an unknown addressing style.
  [[nodiscard]] static config from_environment(const env_lookup& env = process_env);

  /// True when requests for `bucket` use path-style URLs.
  [[nodiscard]] bool use_path_style(std::string_view bucket) const;
};

/// An INI-style AWS shared config/credentials file: section -> key -> value.
/// Nested settings ("s3 =" followed by indented "addressing_style = path")
/// appear as "s3.addressing_style".
using ini_file = std::map<std::string, std::map<std::string, std::string>>;
/// Parses an AWS shared config or credentials file; a missing file is empty.
[[nodiscard]] ini_file parse_aws_ini(const std::string& path);

}  // namespace sluice::inline v0::s3
