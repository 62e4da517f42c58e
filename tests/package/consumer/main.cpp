// What an engine writes: open a checkpoint, load it through its weight loader;
// set up S3 access (configuration, signing, a client) from the s3 component.
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <sluice/sluice.hpp>
#include <sluice/s3/client.hpp>
#include <sluice/s3/config.hpp>
#include <sluice/s3/sigv4.hpp>

#ifndef SLUICE_HAS_S3
#error "sluice::s3 must define SLUICE_HAS_S3"
#endif

namespace {

// Calls into libsluice_s3 (config.cpp, sigv4.cpp, client.cpp); no server needed.
bool s3_component_works() {
  const std::map<std::string, std::string> env{{"AWS_ENDPOINT_URL", "http://127.0.0.1:9"},
                                               {"AWS_REGION", "eu-west-1"},
                                               {"AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"},
                                               {"AWS_SECRET_ACCESS_KEY", "secret"},
                                               {"AWS_CONFIG_FILE", "/nonexistent"},
                                               {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"}};
  const auto cfg = sluice::s3::config::from_environment([&](const std::string& k) -> std::optional<std::string> {
    const auto it = env.find(k);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
  const auto uri = sluice::s3::object_uri::parse("s3://bucket/ckpt/");
  // AWS's published SigV4 example (the signing-key derivation in the SigV4 docs).
  const auto key = sluice::s3::derive_signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215",
                                                  "us-east-1", "iam");
  boost::asio::io_context ioc;
  sluice::s3::client client(ioc.get_executor(), cfg);
  const bool ok = cfg.endpoint.host == "127.0.0.1" && cfg.endpoint.port == 9 && cfg.region == "eu-west-1" &&
                  !cfg.creds.anonymous() && cfg.use_path_style(uri.bucket) && uri.key == "ckpt/" &&
                  sluice::s3::sha256_hex(std::string_view{}) == sluice::s3::empty_payload_sha256 &&
                  sluice::s3::to_hex(key) == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d" &&
                  client.cfg().endpoint.url() == "http://127.0.0.1:9" && client.idle_connections() == 0;
  std::printf("consumer: s3 client for %s at %s: %s\n", uri.str().c_str(), client.cfg().endpoint.url().c_str(),
              ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main(int, char** argv) {
  const std::filesystem::path dir = argv[1];
  std::vector<std::byte> bytes(64, std::byte{7});
  sluice::format::writer w;
  w.add("a", sluice::format::dtype::F32, {4, 4}, bytes).add("b", sluice::format::dtype::U8, {3}, std::span(bytes).first(3));
  w.write(dir / "model.safetensors");
  auto ck = sluice::checkpoint::open(dir);
  int n = 0;
  auto loader = [&](sluice::tensor_view v) { n += v.whole(); };
  sluice::callback_sink<decltype(loader)> sink(loader);
  auto st = sluice::load(ck, sink);
  std::printf("consumer: loaded %d tensors, %llu bytes\n", n, static_cast<unsigned long long>(st.tensor_bytes));
  const bool s3_ok = s3_component_works();
  return n == 2 && s3_ok ? 0 : 1;
}
