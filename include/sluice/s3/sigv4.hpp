#pragma once
/// \file
/// AWS Signature Version 4 for S3 (header-based authorization), with OpenSSL's
/// HMAC-SHA256 and SHA-256. Pure functions of their inputs (the time is a
/// parameter), so they can be checked against AWS's published examples and
/// against botocore. Compiled in src/s3/sigv4.cpp (OpenSSL stays out of headers).

#include <array>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::inline v0::s3 {

/// Credentials used to sign requests. Empty `access_key_id` means anonymous
/// (requests are sent unsigned).
struct credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;   ///< STS session token, sent as x-amz-security-token
  std::string source;          ///< where they came from, for messages ("env", "~/.aws/credentials [p]")
  [[nodiscard]] bool anonymous() const noexcept { return access_key_id.empty(); }
};

/// "UNSIGNED-PAYLOAD": the x-amz-content-sha256 value for bodies that are not hashed.
inline constexpr std::string_view unsigned_payload = "UNSIGNED-PAYLOAD";
/// SHA-256 of the empty string.
inline constexpr std::string_view empty_payload_sha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

using digest = std::array<unsigned char, 32>;
using header_list = std::vector<std::pair<std::string, std::string>>;

/// Lower-case hex of `bytes`.
[[nodiscard]] std::string to_hex(std::span<const unsigned char> bytes);
/// SHA-256 of `data`, lower-case hex.
[[nodiscard]] std::string sha256_hex(std::string_view data);
/// SHA-256 of `data`, lower-case hex.
[[nodiscard]] std::string sha256_hex(std::span<const std::byte> data);
/// HMAC-SHA256(key, data).
[[nodiscard]] digest hmac_sha256(std::span<const unsigned char> key, std::string_view data);
/// kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request").
/// `date` is YYYYMMDD.
[[nodiscard]] digest derive_signing_key(std::string_view secret, std::string_view date,
                                        std::string_view region, std::string_view service);
/// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters
/// (A-Z a-z 0-9 - _ . ~) stay, everything else becomes %XX (upper case);
/// '/' stays when `keep_slash` (paths), and is encoded otherwise (query parts).
[[nodiscard]] std::string uri_encode(std::string_view s, bool keep_slash);
/// "YYYYMMDDTHHMMSSZ" (UTC) of `t`.
[[nodiscard]] std::string amz_date(std::chrono::system_clock::time_point t);

/// An HTTP request to be signed. `path` and `query` are NOT encoded: the signer
/// encodes them, and the request must be sent with `target()`, so what is
/// signed is exactly what goes on the wire.
struct signable_request {
  std::string method = "GET";
  std::string path = "/";      ///< e.g. "/bucket/dir/key name" (path-style) or "/dir/key name"
  std::vector<std::pair<std::string, std::string>> query;   ///< decoded name/value pairs
  header_list headers;         ///< must contain "host"; every header listed is signed
  std::string payload_hash{unsigned_payload};   ///< hex SHA-256 of the body, or UNSIGNED-PAYLOAD

  /// The request target: the encoded path, then "?" and the canonical query string if any.
  [[nodiscard]] std::string target() const;
};

/// The intermediate and final results of signing (for tests and debugging).
struct signature_result {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;       ///< hex
  std::string signed_headers;  ///< "host;range;x-amz-content-sha256;x-amz-date"
  std::string authorization;   ///< the Authorization header value
};

/// Signs `req` for service `service` in `region` at time `now`: adds the
/// x-amz-date, x-amz-content-sha256 and (with a session token)
/// x-amz-security-token headers, then an Authorization header. Anonymous
/// credentials leave the request unsigned (only x-amz-content-sha256 is added)
/// and return an empty result. Header names are lower-cased.
signature_result sign(signable_request& req, const credentials& creds, std::string_view region,
                      std::chrono::system_clock::time_point now, std::string_view service = "s3");

/// The canonical request of `req` as it stands (its headers already include
/// x-amz-date etc.). Exposed for tests.
[[nodiscard]] std::string canonical_request(const signable_request& req, std::string* signed_headers = nullptr);

}  // namespace sluice::inline v0::s3
