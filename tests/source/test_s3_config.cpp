// Tests for include/sluice/s3/config.hpp: the AWS conventions, with a
// private environment and a temporary HOME.
#include <sluice/s3/config.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

using namespace sluice;
namespace fs = std::filesystem;

namespace {
// A temporary HOME with ~/.aws/{credentials,config}, removed at scope exit.
struct temp_home {
  fs::path dir;
  temp_home() {
    std::string tmpl = (fs::temp_directory_path() / "sluice-s3-home-XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
    fs::create_directories(dir / ".aws");
  }
  ~temp_home() { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir / ".aws" / name) << text; }
};
struct fake_env {
  std::map<std::string, std::string> vars;
  s3::env_lookup lookup() const {
    return [this](const std::string& n) -> std::optional<std::string> {
      auto it = vars.find(n);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  }
};
}  // namespace

TEST_CASE("environment credentials, region and endpoint are used first", "[source][s3][config]") {
  temp_home home;
  home.write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n");
  fake_env env{{{"HOME", home.dir.string()},
                {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"},
                {"AWS_SESSION_TOKEN", "ENVTOKEN"},
                {"AWS_REGION", "eu-west-3"},
                {"AWS_DEFAULT_REGION", "us-west-1"},
                {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000"}}};
  auto c = s3::config::from_environment(env.lookup());
  CHECK(c.creds.access_key_id == "ENVKEY");
  CHECK(c.creds.secret_access_key == "ENVSECRET");
  CHECK(c.creds.session_token == "ENVTOKEN");
  CHECK(c.region == "eu-west-3");
  CHECK(c.custom_endpoint);
  CHECK(c.endpoint.url() == "http://127.0.0.1:9000");
  CHECK(c.use_path_style("bucket"));   // IP endpoint: path-style automatically
}

TEST_CASE("AWS_ENDPOINT_URL_S3 wins over AWS_ENDPOINT_URL and AWS_DEFAULT_REGION is a fallback",
          "[source][s3][config]") {
  temp_home home;
  fake_env env{{{"HOME", home.dir.string()},
                {"AWS_DEFAULT_REGION", "us-west-1"},
                {"AWS_ENDPOINT_URL", "http://wrong:1"},
                {"AWS_ENDPOINT_URL_S3", "https://minio.example.com:9443/"}}};
  auto c = s3::config::from_environment(env.lookup());
  CHECK(c.region == "us-west-1");
  CHECK(c.endpoint.scheme == "https");
  CHECK(c.endpoint.host == "minio.example.com");
  CHECK(c.endpoint.port == 9443);
  CHECK_FALSE(c.use_path_style("bucket"));   // a named custom endpoint: virtual-hosted
}

TEST_CASE("the profile's credentials file and config file are read with AWS_PROFILE", "[source][s3][config]") {
  temp_home home;
  home.write("credentials",
             "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = DEFSECRET\n\n"
             "[work]\naws_access_key_id = WORKKEY\naws_secret_access_key = WORKSECRET\n"
             "aws_session_token = WORKTOKEN\n");
  home.write("config",
             "[default]\nregion = us-east-2\n\n[profile work]\nregion = ap-south-1\n"
             "s3 =\n    addressing_style = path\n    endpoint_url = http://localhost:4569\n"
             "ca_bundle = /etc/ssl/work.pem\n");
  SECTION("default profile") {
    fake_env env{{{"HOME", home.dir.string()}}};
    auto c = s3::config::from_environment(env.lookup());
    CHECK(c.creds.access_key_id == "DEFKEY");
    CHECK(c.region == "us-east-2");
    CHECK_FALSE(c.custom_endpoint);
    CHECK(c.endpoint.url() == "https://s3.us-east-2.amazonaws.com");
    CHECK(c.addressing == s3::addressing_style::automatic);
    CHECK_FALSE(c.use_path_style("my-bucket"));
  }
  SECTION("named profile") {
    fake_env env{{{"HOME", home.dir.string()}, {"AWS_PROFILE", "work"}}};
    auto c = s3::config::from_environment(env.lookup());
    CHECK(c.creds.access_key_id == "WORKKEY");
    CHECK(c.creds.secret_access_key == "WORKSECRET");
    CHECK(c.creds.session_token == "WORKTOKEN");
    CHECK(c.region == "ap-south-1");
    CHECK(c.addressing == s3::addressing_style::path);
    CHECK(c.endpoint.url() == "http://localhost:4569");
    CHECK(c.ca_bundle == "/etc/ssl/work.pem");
  }
  SECTION("AWS_CA_BUNDLE overrides the profile's ca_bundle") {
    fake_env env{{{"HOME", home.dir.string()}, {"AWS_PROFILE", "work"}, {"AWS_CA_BUNDLE", "/tmp/ca.pem"}}};
    CHECK(s3::config::from_environment(env.lookup()).ca_bundle == "/tmp/ca.pem");
  }
}

TEST_CASE("credentials in the config file are used when the credentials file has none", "[source][s3][config]") {
  temp_home home;
  home.write("config", "[profile p]\naws_access_key_id = CONFKEY\naws_secret_access_key = CONFSECRET\n");
  fake_env env{{{"HOME", home.dir.string()}, {"AWS_PROFILE", "p"}}};
  auto c = s3::config::from_environment(env.lookup());
  CHECK(c.creds.access_key_id == "CONFKEY");
  CHECK(c.creds.secret_access_key == "CONFSECRET");
}

TEST_CASE("no credentials anywhere or AWS_NO_SIGN_REQUEST means anonymous", "[source][s3][config]") {
  temp_home home;
  fake_env env{{{"HOME", home.dir.string()}}};
  auto c = s3::config::from_environment(env.lookup());
  CHECK(c.creds.anonymous());
  CHECK(c.creds.source.find("anonymous") != std::string::npos);
  fake_env env2{{{"HOME", home.dir.string()},
                 {"AWS_ACCESS_KEY_ID", "K"},
                 {"AWS_SECRET_ACCESS_KEY", "S"},
                 {"AWS_NO_SIGN_REQUEST", "true"}}};
  CHECK(s3::config::from_environment(env2.lookup()).creds.anonymous());
}

TEST_CASE("addressing style follows the option, the endpoint and the bucket name", "[source][s3][config]") {
  s3::config c;
  c.endpoint = s3::http_endpoint::parse("https://s3.us-east-1.amazonaws.com");
  CHECK_FALSE(c.use_path_style("bucket"));
  CHECK(c.use_path_style("Upper_Case"));   // not a DNS name
  CHECK(c.use_path_style("dotted.bucket"));   // would break the wildcard certificate
  c.addressing = s3::addressing_style::path;
  CHECK(c.use_path_style("bucket"));
  c.addressing = s3::addressing_style::virtual_hosted;
  CHECK_FALSE(c.use_path_style("dotted.bucket"));
  c.addressing = s3::addressing_style::automatic;
  for (auto url : {"http://127.0.0.1:9000", "http://[::1]:9000", "http://localhost", "https://10.0.0.2"}) {
    c.endpoint = s3::http_endpoint::parse(url);
    INFO(url);
    CHECK(c.use_path_style("bucket"));
  }
}

TEST_CASE("endpoints parse with default ports and reject junk", "[source][s3][config]") {
  auto e = s3::http_endpoint::parse("HTTP://Example.COM");
  CHECK(e.scheme == "http");
  CHECK(e.host == "example.com");
  CHECK(e.port == 80);
  CHECK(e.host_header("bucket.example.com") == "bucket.example.com");
  auto v6 = s3::http_endpoint::parse("http://[::1]:9000");
  CHECK(v6.host == "::1");
  CHECK(v6.host_header(v6.host) == "[::1]:9000");
  CHECK_THROWS_AS(s3::http_endpoint::parse("ftp://x"), config_error);
  CHECK_THROWS_AS(s3::http_endpoint::parse("127.0.0.1:9000"), config_error);
  CHECK_THROWS_AS(s3::http_endpoint::parse("http://h:99999"), config_error);
  CHECK_THROWS_AS(s3::http_endpoint::parse("http://h/path"), config_error);
}

TEST_CASE("an unknown addressing_style in the config file is a config_error", "[source][s3][config]") {
  temp_home home;
  home.write("config", "[default]\ns3 =\n  addressing_style = sideways\n");
  fake_env env{{{"HOME", home.dir.string()}}};
  CHECK_THROWS_WITH(s3::config::from_environment(env.lookup()), Catch::Contains("sideways"));
}

TEST_CASE("s3 URIs split into bucket and key", "[source][s3][config]") {
  auto u = s3::object_uri::parse("s3://bucket/prefix/dir/");
  CHECK(u.bucket == "bucket");
  CHECK(u.key == "prefix/dir/");
  CHECK(s3::object_uri::parse("s3://bucket").key.empty());
  CHECK(s3::object_uri::parse("s3://b/k").str() == "s3://b/k");
  CHECK_THROWS_AS(s3::object_uri::parse("http://bucket/key"), config_error);
  CHECK_THROWS_AS(s3::object_uri::parse("s3:///key"), config_error);
}

TEST_CASE("backoff grows exponentially, is capped and jittered", "[source][s3][retry]") {
  s3::retry_policy p{6, std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};
  CHECK(p.backoff(1, 0).count() == 50);
  CHECK(p.backoff(1, 50).count() == 100);
  CHECK(p.backoff(3, 0).count() == 200);
  CHECK(p.backoff(10, 0).count() == 500);
  CHECK(p.backoff(10, 999'999).count() <= 1000);
  CHECK(s3::is_retryable(503, "SlowDown"));
  CHECK(s3::is_retryable(500, ""));
  CHECK_FALSE(s3::is_retryable(404, "NoSuchKey"));
  CHECK_FALSE(s3::is_retryable(403, "SignatureDoesNotMatch"));
}
