#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <sluice/sink/any_sink.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/sink/forwarding_sink.hpp>

using namespace sluice;

namespace {
// A device-capable sink with every optional member, recording what reaches it.
struct full_sink {
  static constexpr bool device_views = true;
  static constexpr bool whole_tensors = true;
  std::vector<std::string> calls;
  std::byte buf[8]{};
  bool accept(tensor_view) { calls.push_back("accept"); return true; }
  std::span<std::byte> direct_destination(const tensor_ref&) { calls.push_back("direct"); return buf; }
  void finish() { calls.push_back("finish"); }
  template <class Plan>
  void reserve(const Plan&, std::uint32_t rank) { calls.push_back("reserve " + std::to_string(rank)); }
};

// A host sink with nothing optional.
struct bare_sink {
  bool accept(tensor_view) { return true; }
};

// Wrappers that override accept only.
struct counting_full : forwarding_sink<full_sink> {
  using forwarding_sink::forwarding_sink;
  int seen = 0;
  bool accept(tensor_view v) { ++seen; return forwarding_sink::accept(std::move(v)); }
};
struct counting_bare : forwarding_sink<bare_sink> {
  using forwarding_sink::forwarding_sink;
};
struct dummy_plan {};
template <class S>
concept has_finish = requires(S& s) { s.finish(); };
template <class S>
concept has_reserve = requires(S& s, const dummy_plan& p) { s.reserve(p, 3u); };
}  // namespace

TEST_CASE("sink_traits_of reads a sink's declarations, false where it declares none", "[sink][concepts]") {
  STATIC_REQUIRE(sink_traits_of<full_sink>() == sink_traits{true, true});
  STATIC_REQUIRE(sink_traits_of<bare_sink>() == sink_traits{false, false});
  STATIC_REQUIRE(sink_traits_of<digest_sink>() == sink_traits{false, false});
}

TEST_CASE("a forwarding wrapper has its inner sink's traits and optional members without restating them", "[sink][forwarding_sink]") {
  STATIC_REQUIRE(sink<counting_full>);
  STATIC_REQUIRE(sink_traits_of<counting_full>() == sink_traits_of<full_sink>());
  STATIC_REQUIRE(direct_sink<counting_full>);
  STATIC_REQUIRE(has_finish<counting_full>);
  STATIC_REQUIRE(has_reserve<counting_full>);
  // What the inner sink lacks, the wrapper lacks too.
  STATIC_REQUIRE(sink<counting_bare>);
  STATIC_REQUIRE(sink_traits_of<counting_bare>() == sink_traits{false, false});
  STATIC_REQUIRE_FALSE(direct_sink<counting_bare>);
  STATIC_REQUIRE_FALSE(has_finish<counting_bare>);
  STATIC_REQUIRE_FALSE(has_reserve<counting_bare>);

  full_sink inner;
  counting_full w(inner);
  tensor_ref t;
  REQUIRE(w.accept(tensor_view{}));
  REQUIRE(w.direct_destination(t).size() == 8);
  w.reserve(dummy_plan{}, 3u);
  w.finish();
  REQUIRE(w.seen == 1);
  REQUIRE(inner.calls == std::vector<std::string>{"accept", "direct", "reserve 3", "finish"});
}

TEST_CASE("any_sink carries the erased sink's traits and type as values", "[sink][any_sink]") {
  STATIC_REQUIRE_FALSE(takes_device_views<any_sink>());  // erased: a value, not a declaration
  full_sink f;
  digest_sink d;
  counting_full w(f);
  const any_sink a(f), b(d), c(w);
  CHECK(a.traits() == sink_traits{true, true});
  CHECK(a.whole_tensors());
  CHECK(b.traits() == sink_traits{false, false});
  CHECK(c.traits() == sink_traits{true, true});  // through the wrapper
  CHECK(b.name() == "sluice::v0::digest_sink");
  const any_sink copy = b;
  CHECK(copy.traits() == b.traits());
  CHECK(copy.name() == b.name());
}
