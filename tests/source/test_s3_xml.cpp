// Tests for src/s3/xml.hpp (private to the s3 component): the S3 XML documents
// the client reads, well-formed or not. The client-level consequences (typed
// errors from client::list and failed requests) are in test_s3_client.cpp.
#include "s3/xml.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace sluice::s3::detail;

namespace {
constexpr const char* two_pages_first =
    R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>ckpt/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>ckpt/a.safetensors</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;0123&quot;</ETag><Size>18446744073709551615</Size><StorageClass>STANDARD</StorageClass></Contents>
  <!-- a comment between entries -->
  <Contents><Key>ckpt/b.safetensors</Key><Size>0</Size></Contents>
  <CommonPrefixes><Prefix>ckpt/sub/</Prefix></CommonPrefixes>
  <NextContinuationToken>tok+/=&amp;1</NextContinuationToken>
</ListBucketResult>)";
}  // namespace

TEST_CASE("a ListObjectsV2 page gives keys, sizes, ETags, prefixes and the continuation token", "[source][s3][xml]") {
  const auto page = parse_list_page(two_pages_first);
  REQUIRE(page.objects.size() == 2);
  CHECK(page.objects[0].key == "ckpt/a.safetensors");
  CHECK(page.objects[0].size == 18446744073709551615ull);
  CHECK(page.objects[0].etag == "\"0123\"");
  CHECK(page.objects[1].key == "ckpt/b.safetensors");
  CHECK(page.objects[1].size == 0);
  CHECK(page.objects[1].etag.empty());
  CHECK(page.common_prefixes == std::vector<std::string>{"ckpt/sub/"});
  CHECK(page.truncated);
  CHECK(page.next_token == "tok+/=&1");
}

TEST_CASE("entity-escaped keys are decoded, and a key that is only spaces is kept", "[source][s3][xml]") {
  const auto page = parse_list_page(
      "<ListBucketResult><IsTruncated>false</IsTruncated>"
      "<Contents><Key>a&amp;b &lt;c&gt; &quot;d&quot; &apos;e&apos; &#x263A;&#233;.bin</Key><Size>1</Size></Contents>"
      "<Contents><Key>   </Key><Size>2</Size></Contents>"
      "<Contents><Key><![CDATA[cdata&key]]></Key><Size>3</Size></Contents>"
      "</ListBucketResult>");
  REQUIRE(page.objects.size() == 3);
  CHECK(page.objects[0].key == "a&b <c> \"d\" 'e' \xE2\x98\xBA\xC3\xA9.bin");
  CHECK(page.objects[1].key == "   ");
  CHECK(page.objects[2].key == "cdata&key");
  CHECK_FALSE(page.truncated);
  CHECK(page.next_token.empty());
}

TEST_CASE("an empty listing has no objects and is not truncated", "[source][s3][xml]") {
  const auto page = parse_list_page("<ListBucketResult><Name>b</Name><KeyCount>0</KeyCount></ListBucketResult>");
  CHECK(page.objects.empty());
  CHECK(page.common_prefixes.empty());
  CHECK_FALSE(page.truncated);
}

TEST_CASE("a malformed or unexpected listing is a malformed_xml error that says what is wrong", "[source][s3][xml]") {
  struct bad_case {
    const char* body;
    const char* says;
  };
  const auto c = GENERATE(
      bad_case{"", "not well-formed XML: No document element found at byte 0 of 0"},
      bad_case{"Service Unavailable", "not well-formed XML"},
      bad_case{"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Si", "not well-formed XML"},
      bad_case{"<ListBucketResult><Contents><Key>a</Key><Size>1</Size></Contents>", "not well-formed XML"},
      bad_case{"<html><body>502 Bad Gateway</body></html>", "root element is <html>, not <ListBucketResult>"},
      bad_case{"<?xml version=\"1.0\"?><!-- nothing -->", "not well-formed XML: No document element"},
      bad_case{"<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
               "<Contents> entry 1 has no <Key>"},
      bad_case{"<ListBucketResult><Contents><Key>k&amp;1</Key></Contents></ListBucketResult>",
               "<Contents> of key 'k&1' has no <Size>"},
      bad_case{"<ListBucketResult><Contents><Key>k</Key><Size>12x</Size></Contents></ListBucketResult>",
               "<Size> of key 'k' is '12x', not a byte count"},
      bad_case{"<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
               "<Size> of key 'k' is '-1', not a byte count"},
      bad_case{"<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999</Size></Contents></ListBucketResult>",
               "not a byte count"},
      bad_case{"<ListBucketResult><Contents><Key>k</Key><Size></Size></Contents></ListBucketResult>",
               "<Size> of key 'k' is '', not a byte count"},
      bad_case{"<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
               "<IsTruncated> is 'yes', not true or false"});
  INFO("body: " << c.body);
  CHECK_THROWS_AS(parse_list_page(c.body), malformed_xml);
  CHECK_THROWS_WITH(parse_list_page(c.body), Catch::Contains(c.says));
}

TEST_CASE("an S3 error document gives its code and decoded message", "[source][s3][xml]") {
  const auto doc = parse_error_document(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code>"
      "<Message>The key &apos;a&amp;b&apos; does not exist.</Message><Key>a&amp;b</Key><RequestId>1</RequestId></Error>");
  REQUIRE(doc);
  CHECK(doc->code == "NoSuchKey");
  CHECK(doc->message == "The key 'a&b' does not exist.");

  const auto bare = parse_error_document("<Error><Message>no code</Message></Error>");
  REQUIRE(bare);
  CHECK(bare->code.empty());
  CHECK(bare->message == "no code");
}

TEST_CASE("a body that is not an S3 error document gives no error document, never a crash", "[source][s3][xml]") {
  const auto body = GENERATE(as<std::string>{}, "", "Internal Server Error", "<Error><Code>SlowDown</Code><Mess",
                             "<html><head><title>503</title></head></html>", "<ErrorResponse><Error><Code>x</Code></Error></ErrorResponse>",
                             std::string("\0\x01\xff<Error>", 10));
  INFO("body: " << body);
  CHECK_FALSE(parse_error_document(body));
}

TEST_CASE("an excerpt of an unexpected body is short and on one line", "[source][s3][xml]") {
  CHECK(excerpt("<html>\r\n<body>\tx</body>") == "<html>  <body> x</body>");
  CHECK(excerpt(std::string(200, 'a'), 10) == "aaaaaaaaaa...");
  CHECK(excerpt("") == "");
}
