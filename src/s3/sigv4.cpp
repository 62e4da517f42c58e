// AWS SigV4 (see include/sluice/s3/sigv4.hpp).
#include <sluice/s3/sigv4.hpp>

#include <sluice/error.hpp>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <stdexcept>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "../http/ascii.hpp"

namespace sluice::inline v0::s3 {

namespace ascii = http::ascii;

namespace {
std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = ascii::to_lower(c);
  return r;
}
// Trimall: strip leading/trailing whitespace, collapse runs of spaces to one.
std::string trim_all(std::string_view v) {
  std::string r;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !r.empty();
      continue;
    }
    if (space) r += ' ';
    space = false;
    r += c;
  }
  return r;
}
std::string canonical_query(const std::vector<std::pair<std::string, std::string>>& q) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(q.size());
  for (const auto& [k, v] : q) enc.emplace_back(uri_encode(k, false), uri_encode(v, false));
  std::sort(enc.begin(), enc.end());
  std::string s;
  for (const auto& [k, v] : enc) {
    if (!s.empty()) s += '&';
    s += k;
    s += '=';
    s += v;
  }
  return s;
}
}  // namespace

std::string to_hex(std::span<const unsigned char> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  ::SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  return to_hex(md);
}

std::string sha256_hex(std::span<const std::byte> data) {
  return sha256_hex(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
}

digest hmac_sha256(std::span<const unsigned char> key, std::string_view data) {
  digest out{};
  unsigned int len = 0;
  if (!::HMAC(::EVP_sha256(), key.data(), static_cast<int>(key.size()),
              reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len) ||
      len != out.size())
    throw resource_error("HMAC-SHA256 failed (OpenSSL)");
  return out;
}

digest derive_signing_key(std::string_view secret, std::string_view date, std::string_view region,
                          std::string_view service) {
  std::string k = "AWS4";
  k += secret;
  auto k_date = hmac_sha256({reinterpret_cast<const unsigned char*>(k.data()), k.size()}, date);
  auto k_region = hmac_sha256(k_date, region);
  auto k_service = hmac_sha256(k_region, service);
  return hmac_sha256(k_service, "aws4_request");
}

std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char digits[] = "0123456789ABCDEF";
  std::string r;
  r.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (ascii::is_alnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      r += ch;
    } else {
      r += '%';
      r += digits[c >> 4];
      r += digits[c & 15];
    }
  }
  return r;
}

std::string amz_date(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  ::gmtime_r(&tt, &tm);
  char buf[17];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string signable_request::target() const {
  std::string t = uri_encode(path.empty() ? std::string_view("/") : std::string_view(path), true);
  if (!query.empty()) {
    t += '?';
    t += canonical_query(query);
  }
  return t;
}

std::string canonical_request(const signable_request& req, std::string* signed_headers_out) {
  std::vector<std::pair<std::string, std::string>> hs;
  hs.reserve(req.headers.size());
  for (const auto& [k, v] : req.headers) {
    auto name = lower(trim_all(k));
    auto value = trim_all(v);
    auto it = std::find_if(hs.begin(), hs.end(), [&](const auto& h) { return h.first == name; });
    if (it != hs.end())
      it->second += "," + value;   // repeated headers: comma-joined, in order
    else
      hs.emplace_back(std::move(name), std::move(value));
  }
  std::sort(hs.begin(), hs.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [k, v] : hs) {
    canonical_headers += k + ":" + v + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += k;
  }
  std::string cr = req.method;
  cr += '\n';
  cr += uri_encode(req.path.empty() ? std::string_view("/") : std::string_view(req.path), true);
  cr += '\n';
  cr += canonical_query(req.query);
  cr += '\n';
  cr += canonical_headers;
  cr += '\n';
  cr += signed_headers;
  cr += '\n';
  cr += req.payload_hash;
  if (signed_headers_out) *signed_headers_out = std::move(signed_headers);
  return cr;
}

signature_result sign(signable_request& req, const credentials& creds, std::string_view region,
                      std::chrono::system_clock::time_point now, std::string_view service) {
  auto set = [&req](std::string name, std::string value) {
    auto it = std::find_if(req.headers.begin(), req.headers.end(),
                           [&](const auto& h) { return lower(h.first) == name; });
    if (it != req.headers.end())
      it->second = std::move(value);
    else
      req.headers.emplace_back(std::move(name), std::move(value));
  };
  for (auto& h : req.headers) h.first = lower(h.first);
  // Re-signing (a retry) must not sign the previous signature.
  std::erase_if(req.headers, [](const auto& h) { return h.first == "authorization"; });
  if (std::none_of(req.headers.begin(), req.headers.end(), [](const auto& h) { return h.first == "host"; }))
    throw usage_error("SigV4: the request has no host header");
  set("x-amz-content-sha256", req.payload_hash);
  if (creds.anonymous()) return {};
  const std::string date_time = amz_date(now);
  const std::string date = date_time.substr(0, 8);
  set("x-amz-date", date_time);
  if (!creds.session_token.empty()) set("x-amz-security-token", creds.session_token);

  signature_result r;
  r.canonical_request = canonical_request(req, &r.signed_headers);
  const std::string scope = date + "/" + std::string(region) + "/" + std::string(service) + "/aws4_request";
  r.string_to_sign = "AWS4-HMAC-SHA256\n" + date_time + "\n" + scope + "\n" + sha256_hex(r.canonical_request);
  const auto key = derive_signing_key(creds.secret_access_key, date, region, service);
  r.signature = to_hex(hmac_sha256(key, r.string_to_sign));
  r.authorization = "AWS4-HMAC-SHA256 Credential=" + creds.access_key_id + "/" + scope +
                    ", SignedHeaders=" + r.signed_headers + ", Signature=" + r.signature;
  set("authorization", r.authorization);
  return r;
}

}  // namespace sluice::inline v0::s3
