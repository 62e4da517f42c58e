// S3 configuration from the AWS conventions (see include/sluice/s3/config.hpp).
#include <sluice/s3/config.hpp>

#include <sluice/core/size.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>

#include <arpa/inet.h>
#include <fmt/format.h>

#include "../http/ascii.hpp"

namespace sluice::inline v0::s3 {

namespace ascii = http::ascii;

namespace {
std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}
std::string lower(std::string s) {
  for (auto& c : s) c = ascii::to_lower(c);
  return s;
}
bool truthy(const std::optional<std::string>& v) {
  if (!v) return false;
  auto l = lower(trim(*v));
  return l == "1" || l == "true" || l == "yes" || l == "on";
}
std::optional<std::string> non_empty(std::optional<std::string> v) {
  if (v && trim(*v).empty()) return std::nullopt;
  if (v) *v = trim(*v);
  return v;
}
std::optional<std::string> lookup(const ini_file& f, const std::string& section, const std::string& key) {
  auto s = f.find(section);
  if (s == f.end()) return std::nullopt;
  auto k = s->second.find(key);
  if (k == s->second.end() || k->second.empty()) return std::nullopt;
  return k->second;
}
// A bucket name usable as a DNS label (virtual-hosted addressing).
bool dns_compatible(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!(ascii::is_lower(static_cast<unsigned char>(c)) || ascii::is_digit(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.'))
      return false;
  return b.front() != '-' && b.back() != '-' && b.find("..") == std::string_view::npos;
}
}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  if (const char* v = std::getenv(name.c_str())) return std::string(v);
  return std::nullopt;
}

object_uri object_uri::parse(std::string_view uri) {
  if (!uri.starts_with("s3://"))
    throw config_error(fmt::format("not an S3 URI: '{}' (expected s3://bucket/key)", uri));
  auto rest = uri.substr(5);
  auto slash = rest.find('/');
  object_uri u;
  u.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) u.key = std::string(rest.substr(slash + 1));
  if (u.bucket.empty()) throw config_error(fmt::format("S3 URI without a bucket: '{}'", uri));
  return u;
}

ini_file parse_aws_ini(const std::string& path) {
  ini_file f;
  std::ifstream in(path);
  if (!in) return f;
  std::string line, section, parent;
  while (std::getline(in, line)) {
    const bool indented = !line.empty() && (line[0] == ' ' || line[0] == '\t');
    auto t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(std::string_view(t).substr(1, t.size() - 2));
      f[section];
      parent.clear();
      continue;
    }
    auto eq = t.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    auto key = lower(trim(std::string_view(t).substr(0, eq)));
    auto value = trim(std::string_view(t).substr(eq + 1));
    if (indented && !parent.empty()) {
      f[section][parent + "." + key] = value;
    } else if (value.empty()) {
      parent = key;   // "s3 =" opens a nested block
    } else {
      parent.clear();
      f[section][key] = value;
    }
  }
  return f;
}

config config::from_environment(const env_lookup& env) {
  config c;
  auto get = [&](const char* name) { return non_empty(env(name)); };
  const std::string home = get("HOME").value_or("");
  c.profile = get("AWS_PROFILE").value_or(get("AWS_DEFAULT_PROFILE").value_or("default"));
  const std::string cred_path = get("AWS_SHARED_CREDENTIALS_FILE").value_or(home + "/.aws/credentials");
  const std::string conf_path = get("AWS_CONFIG_FILE").value_or(home + "/.aws/config");
  const ini_file cred_file = parse_aws_ini(cred_path);
  const ini_file conf_file = parse_aws_ini(conf_path);
  const std::string conf_section = c.profile == "default" ? "default" : "profile " + c.profile;
  auto setting = [&](const std::string& key) { return lookup(conf_file, conf_section, key); };

  // Credentials.
  if (truthy(env("AWS_NO_SIGN_REQUEST"))) {
    c.creds.source = "AWS_NO_SIGN_REQUEST (anonymous)";
  } else if (auto id = get("AWS_ACCESS_KEY_ID"), secret = get("AWS_SECRET_ACCESS_KEY"); id && secret) {
    c.creds = {*id, *secret, get("AWS_SESSION_TOKEN").value_or(""), "environment (AWS_ACCESS_KEY_ID)"};
  } else if (auto fid = lookup(cred_file, c.profile, "aws_access_key_id")) {
    c.creds = {*fid, lookup(cred_file, c.profile, "aws_secret_access_key").value_or(""),
               lookup(cred_file, c.profile, "aws_session_token").value_or(""),
               fmt::format("{} [{}]", cred_path, c.profile)};
  } else if (auto cid = setting("aws_access_key_id")) {
    c.creds = {*cid, setting("aws_secret_access_key").value_or(""), setting("aws_session_token").value_or(""),
               fmt::format("{} [{}]", conf_path, conf_section)};
  } else {
    c.creds.source = fmt::format("none found (environment, {}, {}; profile '{}'): anonymous", cred_path,
                                 conf_path, c.profile);
  }

  // Region.
  c.region = get("AWS_REGION").value_or(get("AWS_DEFAULT_REGION").value_or(setting("region").value_or("us-east-1")));

  // Endpoint.
  std::optional<std::string> ep = get("AWS_ENDPOINT_URL_S3");
  if (!ep) ep = get("AWS_ENDPOINT_URL");
  if (!ep) ep = setting("s3.endpoint_url");
  if (!ep) ep = setting("endpoint_url");
  if (ep) {
    c.endpoint = http_endpoint::parse(*ep);
    c.custom_endpoint = true;
  } else {
    c.endpoint = http_endpoint::parse("https://s3." + c.region + ".amazonaws.com");
  }

  // Addressing style.
  if (auto style = setting("s3.addressing_style")) {
    auto s = lower(*style);
    if (s == "auto")
      c.addressing = addressing_style::automatic;
    else if (s == "path")
      c.addressing = addressing_style::path;
    else if (s == "virtual")
      c.addressing = addressing_style::virtual_hosted;
    else
      throw config_error(fmt::format("unknown s3 addressing_style '{}' in {} [{}] (expected auto, path or virtual)",
                                     *style, conf_path, conf_section));
  }

  // TLS.
  if (auto ca = get("AWS_CA_BUNDLE"))
    c.ca_bundle = *ca;
  else if (auto cca = setting("ca_bundle"))
    c.ca_bundle = *cca;

  // The node-local cache (cache/block_cache.hpp).
  if (auto dir = get("SLUICE_CACHE_DIR")) c.cache.dir = *dir;
  if (auto cap = get("SLUICE_CACHE_MAX")) c.cache.max_bytes = parse_size(*cap);
  return c;
}

bool config::use_path_style(std::string_view bucket) const {
  if (!dns_compatible(bucket)) return true;
  switch (addressing) {
    case addressing_style::path:
      return true;
    case addressing_style::virtual_hosted:
      return false;
    case addressing_style::automatic:
      break;
  }
  if (endpoint.is_ip_or_localhost()) return true;
  // A dotted bucket name breaks the wildcard certificate of virtual-hosted HTTPS.
  return endpoint.tls() && bucket.find('.') != std::string_view::npos;
}

}  // namespace sluice::inline v0::s3
