// S3 XML documents (see xml.hpp), parsed with pugixml.
#include "xml.hpp"

#include <charconv>

#include <fmt/format.h>
#include <pugixml.hpp>

#include <sluice/error.hpp>

namespace sluice::inline v0::s3::detail {

namespace {

// Default parsing (entities decoded, comments and the XML declaration skipped)
// plus whitespace-only text kept when it is an element's only content: a key
// made of spaces is a key, not an empty element.
constexpr unsigned parse_options = pugi::parse_default | pugi::parse_ws_pcdata_single;

/// Parses `body` into `doc`; the error text when it is not well-formed XML.
std::optional<std::string> load(pugi::xml_document& doc, std::string_view body) {
  const auto r = doc.load_buffer(body.data(), body.size(), parse_options, pugi::encoding_utf8);
  if (r) return std::nullopt;
  return fmt::format("{} at byte {} of {}", r.description(), r.offset, body.size());
}

std::string text_of(const pugi::xml_node& parent, const char* name) { return parent.child(name).text().get(); }

std::uint64_t object_size(const pugi::xml_node& size, std::string_view key) {
  const std::string_view s = size.text().get();
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size())
    throw malformed_xml(fmt::format("<Size> of key '{}' is '{}', not a byte count", key, excerpt(s, 40)));
  return v;
}

}  // namespace

std::optional<error_document> parse_error_document(std::string_view body) {
  if (body.empty()) return std::nullopt;
  pugi::xml_document doc;
  if (load(doc, body)) return std::nullopt;
  const auto root = doc.child("Error");
  if (!root) return std::nullopt;
  return error_document{text_of(root, "Code"), text_of(root, "Message")};
}

list_page parse_list_page(std::string_view body) {
  pugi::xml_document doc;
  if (auto bad = load(doc, body)) throw malformed_xml("not well-formed XML: " + *bad);
  const auto root = doc.child("ListBucketResult");
  if (!root) {
    const auto first = doc.document_element();
    throw malformed_xml(first ? fmt::format("root element is <{}>, not <ListBucketResult>", first.name())
                              : std::string("no root element"));
  }
  list_page page;
  for (const auto contents : root.children("Contents")) {
    const auto key = contents.child("Key");
    if (!key) throw malformed_xml(fmt::format("<Contents> entry {} has no <Key>", page.objects.size() + 1));
    list_entry e;
    e.key = key.text().get();
    const auto size = contents.child("Size");
    if (!size) throw malformed_xml(fmt::format("<Contents> of key '{}' has no <Size>", e.key));
    e.size = object_size(size, e.key);
    e.etag = text_of(contents, "ETag");
    page.objects.push_back(std::move(e));
  }
  for (const auto prefixes : root.children("CommonPrefixes"))
    if (const auto p = prefixes.child("Prefix")) page.common_prefixes.emplace_back(p.text().get());
  if (const auto t = root.child("IsTruncated")) {
    const std::string_view v = t.text().get();
    if (v != "true" && v != "false")
      throw malformed_xml(fmt::format("<IsTruncated> is '{}', not true or false", excerpt(v, 40)));
    page.truncated = v == "true";
  }
  page.next_token = text_of(root, "NextContinuationToken");
  return page;
}

std::optional<std::string> check_list_page(const list_page& page, std::string_view prefix, unsigned max_keys) {
  const auto entries = page.objects.size() + page.common_prefixes.size();
  if (entries > max_keys)
    return fmt::format("{} keys and common prefixes in a page, more than the {} asked for", entries, max_keys);
  auto key_problem = [&](std::string_view key, const char* what) -> std::optional<std::string> {
    if (key.size() > max_key_bytes)
      return fmt::format("a {} of {} bytes, longer than S3's limit of {}", what, key.size(), max_key_bytes);
    if (!key.starts_with(prefix))
      return fmt::format("the {} '{}' is outside the prefix '{}' that was listed", what, printable(key, 120),
                         printable(prefix, 120));
    return std::nullopt;
  };
  for (const auto& o : page.objects)
    if (auto p = key_problem(o.key, "key")) return p;
  for (const auto& c : page.common_prefixes)
    if (auto p = key_problem(c, "common prefix")) return p;
  if (page.next_token.size() > max_token_bytes)
    return fmt::format("a continuation token of {} bytes, longer than {}", page.next_token.size(), max_token_bytes);
  return std::nullopt;
}

std::string excerpt(std::string_view body, std::size_t max) {
  std::string s(body.substr(0, max));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  if (body.size() > max) s += "...";
  return s;
}

}  // namespace sluice::inline v0::s3::detail
