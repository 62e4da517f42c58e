#pragma once
/// \file
/// What an S3 listing returns (s3::client::list): plain values, no I/O, so
/// that the listing's parsing (src/s3/xml.hpp) builds without Asio.

#include <cstdint>
#include <string>
#include <vector>

namespace sluice::inline v0::s3 {

/// One object of a listing.
struct list_entry {
  std::string key;
  std::uint64_t size = 0;
  std::string etag;
};

/// A complete listing (all pages followed).
struct list_result {
  std::vector<list_entry> objects;            ///< in the server's (lexicographic) order
  std::vector<std::string> common_prefixes;   ///< "sub/dir/" entries when a delimiter is given
  unsigned pages = 0;                         ///< ListObjectsV2 requests made
};

}  // namespace sluice::inline v0::s3
