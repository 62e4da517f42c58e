#pragma once
// The S3 XML documents the client reads (error bodies, ListObjectsV2 pages),
// parsed with pugixml. Private to the compiled s3 component: pugixml appears
// in no public header.
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <sluice/s3/listing.hpp>

namespace sluice::inline v0::s3::detail {

/// A response body that is not the XML document expected; what() says why
/// (the parser's description and byte offset, or the missing/invalid element).
class malformed_xml : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// `<Error><Code>…</Code><Message>…</Message></Error>`, entities decoded.
struct error_document {
  std::string code;      ///< empty when the document has no <Code>
  std::string message;   ///< empty when the document has no <Message>
};

/// The error document in `body`; nullopt when `body` is empty, is not
/// well-formed XML, or its root element is not <Error> (e.g. an HTML page from
/// a proxy). Never throws on bad input.
[[nodiscard]] std::optional<error_document> parse_error_document(std::string_view body);

/// One ListObjectsV2 page (`<ListBucketResult>`).
struct list_page {
  std::vector<list_entry> objects;            ///< <Contents>: <Key>, <Size> required, <ETag> optional
  std::vector<std::string> common_prefixes;   ///< <CommonPrefixes><Prefix>
  bool truncated = false;                     ///< <IsTruncated>; absent = false
  std::string next_token;                     ///< <NextContinuationToken>; empty when absent
};

/// Parses one ListObjectsV2 page. Throws malformed_xml when `body` is not
/// well-formed XML, its root is not <ListBucketResult>, a <Contents> lacks
/// <Key> or <Size>, <Size> is not a decimal integer, or <IsTruncated> is
/// neither "true" nor "false".
[[nodiscard]] list_page parse_list_page(std::string_view body);

/// Bounds on a listing, whatever the server says.
inline constexpr std::size_t max_key_bytes = 1024;          ///< S3's own limit on a key
inline constexpr std::size_t max_token_bytes = 4096;        ///< a continuation token

/// Checks a parsed page against what was asked: at most `max_keys` keys and
/// common prefixes, each key at most max_key_bytes, starting with `prefix`
/// (and each common prefix too), a continuation token at most
/// max_token_bytes. The reason when it breaks one (a lying or broken
/// server), else nullopt. Pure: fuzzed with parse_list_page.
[[nodiscard]] std::optional<std::string> check_list_page(const list_page& page, std::string_view prefix, unsigned max_keys);

/// At most `max` bytes of `body` with control characters replaced by spaces and
/// "..." appended when cut: for quoting an unexpected body in an error message.
[[nodiscard]] std::string excerpt(std::string_view body, std::size_t max = 120);

}  // namespace sluice::inline v0::s3::detail
