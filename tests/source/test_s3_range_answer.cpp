// src/http/range_answer.hpp (what an answer to a range GET allows the client to
// read) and the listing's bounds (src/s3/xml.hpp check_list_page, the client's
// page cap): a lying server gets a named error, never a write past the
// destination or an endless listing. The end-to-end cases, through
// sluice-load against tests/hostile/hostile_s3.py, are tests/hostile's.
#include "http/range_answer.hpp"
#include "s3/xml.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <variant>

#include <sluice/core/run.hpp>
#include <sluice/s3/client.hpp>
#include <sluice/s3/error.hpp>

#include "s3_test_support.hpp"

using namespace sluice;
using namespace sluice::http::detail;
using namespace sluice::s3::detail;

namespace {

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

std::string refused(const std::variant<range_body, range_refusal>& v) {
  return std::holds_alternative<range_refusal>(v) ? std::get<range_refusal>(v).code : std::string("allowed");
}

}  // namespace

TEST_CASE("the wraparound answer of issue 40 is refused, not read without bound", "[source][s3][range_answer]") {
  // Asked bytes 8-1048583; answered "bytes 8-0/1" with Content-Length 2^64 - 8 + 1.
  const auto v = check_range_answer(8, 1048584, 206, "bytes 8-0/1", u64_max - 8 + 2);
  CHECK(refused(v) == "BadContentRange");
  // Every first byte: F > L is never accepted, whatever Content-Length says.
  for (const std::uint64_t b : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{4096}, u64_max - 1})
    CHECK(refused(check_range_answer(b, b + 1, 206, "bytes " + std::to_string(b) + "-0/1", u64_max - b + 2)) ==
          "BadContentRange");
}

TEST_CASE("an honest 206 allows exactly the bytes asked for, or the object's tail", "[source][s3][range_answer]") {
  auto v = check_range_answer(100, 200, 206, "bytes 100-199/1000", 100);
  REQUIRE(refused(v) == "allowed");
  CHECK(std::get<range_body>(v).first == 100);
  CHECK(std::get<range_body>(v).count == 100);
  CHECK(std::get<range_body>(v).object_size == 1000);
  v = check_range_answer(900, 2000, 206, "bytes 900-999/1000", 100);   // the object ends inside the range
  REQUIRE(refused(v) == "allowed");
  CHECK(std::get<range_body>(v).count == 100);
  v = check_range_answer(0, 10, 200, std::nullopt, 4);                  // a server that ignored Range, whole object
  REQUIRE(refused(v) == "allowed");
  CHECK(std::get<range_body>(v).count == 4);
  CHECK(std::get<range_body>(v).count <= 10);
}

TEST_CASE("every other lie is refused with its code", "[source][s3][range_answer]") {
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-199/1000", 101)) == "BadContentLength");
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-199/1000", std::nullopt)) == "BadContentLength");
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-299/1000", 200)) == "BadContentRange");   // more than asked
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 101-199/1000", 99)) == "BadContentRange");    // shifted
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-199/150", 100)) == "BadContentRange");    // L >= T
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-199/*", 100)) == "BadContentRange");
  CHECK(refused(check_range_answer(100, 200, 206, std::nullopt, 100)) == "BadContentRange");
  CHECK(refused(check_range_answer(100, 200, 206, "bytes -100-199/1000", 100)) == "BadContentRange");
  CHECK(refused(check_range_answer(100, 200, 206, "bytes +100-199/1000", 100)) == "BadContentRange");
  CHECK(refused(check_range_answer(100, 200, 206, "bytes 100-199/99999999999999999999999", 100)) == "BadContentRange");
  CHECK(refused(check_range_answer(0, 10, 200, std::nullopt, 11)) == "RangeIgnored");     // bigger than the buffer
  CHECK(refused(check_range_answer(5, 10, 200, std::nullopt, 5)) == "RangeIgnored");      // not from the start
  CHECK(refused(check_range_answer(0, 10, 200, std::nullopt, std::nullopt)) == "BadContentLength");
  CHECK(refused(check_range_answer(0, 10, 302, std::nullopt, 0)) == "RangeIgnored");
}

TEST_CASE("Content-Range parses strictly", "[source][s3][range_answer]") {
  CHECK(parse_content_range("bytes 0-9/10"));
  CHECK(parse_content_range("bytes */10")->total == 10u);
  CHECK_FALSE(parse_content_range("bytes 9-0/10"));
  CHECK_FALSE(parse_content_range("bytes 0-10/10"));
  CHECK_FALSE(parse_content_range("bytes */*"));
  CHECK_FALSE(parse_content_range("bytes 0-9/10 "));
  CHECK_FALSE(parse_content_range("bytes 0x1-9/10"));
  CHECK_FALSE(parse_content_range("items 0-9/10"));
  CHECK_FALSE(parse_content_range("bytes 18446744073709551616-18446744073709551617/*"));
}

TEST_CASE("a listing page is checked against the prefix, max-keys and S3's key limit", "[source][s3][list]") {
  list_page p;
  p.objects.push_back({"ck/model.safetensors", 8, "\"e\""});
  CHECK_FALSE(check_list_page(p, "ck/", 1000));
  CHECK(check_list_page(p, "other/", 1000));
  p.common_prefixes.push_back("ck/sub/");
  CHECK(check_list_page(p, "ck/", 1));   // two entries, one asked for
  p.common_prefixes.back() = "elsewhere/";
  CHECK(check_list_page(p, "ck/", 1000));
  p.common_prefixes.clear();
  p.objects.push_back({"ck/" + std::string(max_key_bytes, 'k'), 1, ""});
  CHECK_THAT(*check_list_page(p, "ck/", 1000), Catch::Contains("longer than S3's limit"));
  p.objects.pop_back();
  p.next_token = std::string(max_token_bytes + 1, 't');
  CHECK(check_list_page(p, "ck/", 1000));
}

TEST_CASE("a server that never stops saying 'truncated' ends the listing at the page cap", "[source][s3][list]") {
  const auto dir = std::filesystem::temp_directory_path() / ("sluice-endless-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "x.safetensors") << "x";
  sluice_test::child server({SLUICE_PYTHON3, SLUICE_SOURCE_DIR "/tests/hostile/hostile_s3.py", dir.string(), "listing-endless"});
  const auto port = server.read_line();
  s3::config cfg;
  cfg.endpoint = s3::http_endpoint::parse("http://127.0.0.1:" + port);
  cfg.custom_endpoint = true;
  cfg.max_list_pages = 25;
  cfg.retry = {1, std::chrono::milliseconds(1), std::chrono::milliseconds(1)};
  asio::io_context ioc;
  s3::client c(ioc.get_executor(), cfg);
  try {
    (void)run_blocking(ioc, c.list("b", "ck/"));
    FAIL("the listing ended");
  } catch (const sluice::s3_error& e) {
    CHECK(e.info().s3_code == "ListingTooLong");
    CHECK_THAT(e.what(), Catch::Contains("after 25 pages"));
  }
  std::filesystem::remove_all(dir);
}
