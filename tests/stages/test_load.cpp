// tests for <sluice/load.hpp>, <sluice/load_file.hpp>, the fetch/stage/place
// stages and the sinks, end to end over io_uring.
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <utility>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <latch>
#include <thread>
#include <variant>
#include <stop_token>
#include <string>

#include <catch2/catch.hpp>

#include <sluice/sluice.hpp>
#include <sluice/core/cores.hpp>
#include <sluice/source/page_cache.hpp>
#include <sluice/testing/generator.hpp>

#include "support/coro.hpp"
#include "support/pages.hpp"

using namespace sluice;

namespace {

// sha256 of every tensor, computed by Python from the files alone (an
// independent parser and hash), as "name -> hex".
std::map<std::string, std::string> python_digests(const std::filesystem::path& dir) {
  const std::string script =
      "import hashlib,json,struct,os,sys\n"
      "d=sys.argv[1]\n"
      "for f in sorted(os.listdir(d)):\n"
      "  if not f.endswith('.safetensors'): continue\n"
      "  b=open(os.path.join(d,f),'rb').read(); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])\n"
      "  for k,v in h.items():\n"
      "    if k=='__metadata__': continue\n"
      "    s,e=v['data_offsets']; print(k, hashlib.sha256(b[8+n+s:8+n+e]).hexdigest())\n";
  const auto py = dir / "digest.py";
  std::FILE* f = std::fopen(py.c_str(), "w");
  std::fputs(script.c_str(), f);
  std::fclose(f);
  std::map<std::string, std::string> out;
  std::FILE* p = ::popen(("/usr/bin/python3 " + py.string() + " " + dir.string()).c_str(), "r");
  REQUIRE(p);
  char name[1024], hex[128];
  while (std::fscanf(p, "%1023s %127s", name, hex) == 2) out[name] = hex;
  REQUIRE(::pclose(p) == 0);
  std::filesystem::remove(py);
  return out;
}

testing::generator_options small_model() {
  testing::generator_options o;
  o.layers = 3;
  o.experts = 4;
  o.hidden = 256;
  o.engram_rows = 4096;
  o.max_shard_bytes = 1 << 20;
  return o;
}

load_options small_staging() {
  load_options o;
  o.staging_budget = 1 << 20;  // 3 slots of 256 KiB + alignment room
  o.max_read = 256 << 10;
  return o;
}

// Page-aligned destinations in one arena of fresh memory for every tensor of
// at least `min_size` bytes, set on `h`; returns the arena's page-rounded size.
template <class Sink>
std::size_t page_arena(const checkpoint& ck, Sink& h, lease& arena, std::uint64_t min_size) {
  std::vector<std::pair<const tensor_ref*, std::size_t>> at;
  std::size_t bytes = 0;
  for (const auto& t : ck.tensors()) {
    if (t.size < min_size) continue;
    at.emplace_back(&t, bytes);
    bytes += (t.size + 4095) / 4096 * 4096;
  }
  arena = lease::allocate(bytes, 4096);
  for (const auto& [t, off] : at) h.set_destination(t->name, arena.bytes().subspan(off, t->size));
  return bytes;
}

// Every tensor `h` holds is the generator's bytes for it.
void require_generated_bytes(const checkpoint& ck, const host_sink& h) {
  for (const auto& t : ck.tensors()) {
    auto got = h.get(t.name);
    REQUIRE(got.size() == t.size);
    const auto e = testing::tensor_bytes(1, t.source_name, t.size);
    REQUIRE(std::equal(got.begin(), got.end(), e.begin(), e.end()));
  }
}

}  // namespace

TEST_CASE("every tensor's digest equals an independent hash of the files", "[stages][load]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  digest_sink d;
  auto st = load(ck, d, small_staging());
  auto expected = python_digests(dir.path);
  REQUIRE(d.digests().size() == expected.size());
  for (const auto& [name, dg] : d.digests()) {
    INFO(name);
    REQUIRE(dg.sha256 == expected.at(name));
  }
  REQUIRE(st.tensors == ck.tensors().size());
  REQUIRE(st.bytes_read == ck.tensor_bytes());
  REQUIRE(st.slots_used <= st.slots);
}

TEST_CASE("O_DIRECT, buffered (punted or inline) and multi-threaded loads deliver the same bytes", "[stages][load][concurrent]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  digest_sink a, b, c, d;
  auto o = small_staging();
  o.io = io_mode::buffered;
  (void)load(ck, a, o);
  o.punt_buffered = false;  // page-cache copies inline in the submitting thread
  (void)load(ck, d, o);
  o.punt_buffered = true;
  o.io = io_mode::automatic;
  o.queue_depth = 8;
  (void)load(ck, b, o);
  o.threads = 3;
  o.register_buffers = false;
  (void)load(ck, c, o);
  REQUIRE(a.digests().size() == ck.tensors().size());
  for (const auto& [name, dg] : a.digests()) {
    REQUIRE(b.digests().at(name).sha256 == dg.sha256);
    REQUIRE(c.digests().at(name).sha256 == dg.sha256);
    REQUIRE(d.digests().at(name).sha256 == dg.sha256);
  }
}

TEST_CASE("a checkpoint four times the staging budget loads within the budget", "[stages][load]") {
  sluice_test::scratch_dir dir;
  auto plan = testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  auto o = small_staging();
  REQUIRE(ck.tensor_bytes() >= 4 * o.staging_budget);
  discard_sink s;
  auto st = load(ck, s, o);
  REQUIRE(s.bytes() == ck.tensor_bytes());
  REQUIRE(st.slots_used * st.slot_size <= o.staging_budget);
}

TEST_CASE("multi-chunk tensors arrive as ordered pieces or whole, by the sink's choice", "[stages][load]") {
  sluice_test::scratch_dir dir;
  format::writer w;
  auto big = testing::tensor_bytes(7, "big", 1'000'003);
  auto tiny = testing::tensor_bytes(7, "tiny", 3);
  w.add("scalar", format::dtype::F32, {}, testing::tensor_bytes(7, "scalar", 4));
  w.add("big", format::dtype::U8, {1'000'003}, big);
  w.add("empty", format::dtype::BF16, {0, 5}, std::span<const std::byte>{});
  w.add("tiny", format::dtype::U8, {3}, tiny);
  w.write(dir.path / "model.safetensors");
  auto ck = checkpoint::open(dir.path);
  auto o = small_staging();

  std::vector<std::pair<std::string, std::uint64_t>> pieces;
  std::vector<std::byte> assembled;
  auto piecewise = [&](tensor_view v) {
    pieces.emplace_back(v.name(), v.offset);
    if (v.name() == "big") assembled.insert(assembled.end(), v.bytes.begin(), v.bytes.end());
    return true;
  };
  struct piece_sink {
    decltype(piecewise)& f;
    bool accept(tensor_view v) { return f(std::move(v)); }
  } ps{piecewise};
  (void)load(ck, ps, o);
  REQUIRE(assembled == big);
  std::size_t big_pieces = 0;
  for (auto& [n, off] : pieces) big_pieces += n == "big";
  REQUIRE(big_pieces == 4);  // 1,000,003 bytes in 256 KiB chunks

  std::map<std::string, std::vector<std::byte>> whole;
  auto loader = [&](tensor_view v) {
    REQUIRE(v.whole());
    whole[v.name()].assign(v.bytes.begin(), v.bytes.end());
  };
  callback_sink<decltype(loader)> cs(loader);
  (void)load(ck, cs, o);
  REQUIRE(whole.at("big") == big);
  REQUIRE(whole.at("tiny") == tiny);
  REQUIRE(whole.at("empty").empty());
  REQUIRE(whole.at("scalar").size() == 4);
}

TEST_CASE("a host sink reads large tensors straight into aligned caller memory", "[stages][load][sink]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  const tensor_ref* biggest = &ck.tensors().front();
  for (const auto& t : ck.tensors())
    if (t.size > biggest->size) biggest = &t;
  auto dst = lease::allocate(biggest->size, 4096);
  host_sink h({.allocate = true, .direct_min_bytes = 64 << 10});
  h.set_destination(biggest->name, dst.bytes());
  auto st = load(ck, h, small_staging());
  REQUIRE(st.tensors == ck.tensors().size());
  const auto expect = testing::tensor_bytes(1, biggest->source_name, biggest->size);
  REQUIRE(std::memcmp(dst.bytes().data(), expect.data(), expect.size()) == 0);
  require_generated_bytes(ck, h);
}

TEST_CASE("direct destinations are faulted in ahead of the reads, or not when asked", "[stages][load][sink][prefault]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  for (const std::uint64_t above : {std::uint64_t{0}, std::uint64_t{1}}) {
    CAPTURE(above);
    // Every tensor of 64 KiB or more into fresh memory of the test's own.
    host_sink h({.allocate = true, .direct_min_bytes = 64 << 10});
    lease arena;
    const auto arena_bytes = page_arena(ck, h, arena, 64 << 10);
    REQUIRE(arena_bytes > 0);
    auto o = small_staging();
    o.prefault_above = above;
    auto st = load(ck, h, o);
    REQUIRE(st.tensors == ck.tensors().size());
    if (above == 0) CHECK(st.prefaulted_bytes == 0);
    CHECK(st.prefaulted_bytes <= arena_bytes);  // whole pages of the destinations, each at most once
    require_generated_bytes(ck, h);
  }
}

TEST_CASE("a load stopped while its destinations are faulted in ends with the prefaulter joined", "[stages][load][cancel][prefault]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  std::stop_source stop;
  struct stopping_sink : host_sink {
    using host_sink::host_sink;
    std::stop_source* stop = nullptr;
    int seen = 0;
    bool accept(tensor_view v) {
      if (++seen == 5) stop->request_stop();
      return host_sink::accept(std::move(v));
    }
  } s({.allocate = false, .direct_min_bytes = 1});
  s.stop = &stop;
  lease arena;
  (void)page_arena(ck, s, arena, 0);
  auto o = small_staging();
  o.stop = stop.get_token();
  o.prefault_above = 1;
  REQUIRE_THROWS_AS(load(ck, s, o), cancelled_error);
  arena = {};  // the destinations go: a prefaulter still running would now fault freed memory in (ASan, TSan)
}

TEST_CASE("a shard truncated after opening fails naming the file, tensor and bytes", "[stages][load][errors]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  const auto& victim = ck.shards().back();
  const auto size = std::filesystem::file_size(victim.uri);
  std::filesystem::resize_file(victim.uri, size - 1000);
  discard_sink s;
  try {
    (void)load(ck, s, small_staging());
    FAIL("no error");
  } catch (const truncated_error& e) {
    REQUIRE(e.file() == victim.uri);
    REQUIRE_FALSE(e.tensor().empty());
    REQUIRE(e.range());
    REQUIRE(e.range()->end > size - 1000);
  }
}

TEST_CASE("a header truncated on disk is rejected at open", "[stages][load][errors]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  const auto shard = dir.path / "model-00001-of-" ;
  for (auto& e : std::filesystem::directory_iterator(dir.path))
    if (e.path().extension() == ".safetensors") {
      std::filesystem::resize_file(e.path(), 100);
      break;
    }
  REQUIRE_THROWS_AS(checkpoint::open(dir.path), format_error);
}

TEST_CASE("a load stopped mid-way ends promptly with every slot returned", "[stages][load][cancel]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  std::stop_source stop;
  struct stopping_sink {
    std::stop_source* stop;
    int seen = 0;
    bool accept(tensor_view) {
      if (++seen == 20) stop->request_stop();
      return true;
    }
  } s{&stop};
  auto o = small_staging();
  o.stop = stop.get_token();
  REQUIRE_THROWS_AS(load(ck, s, o), cancelled_error);
  REQUIRE(s.seen < static_cast<int>(ck.tensors().size()));
}

TEST_CASE("a stop requested from another thread ends the load", "[stages][load][cancel][concurrent]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  std::stop_source stop;
  // The stop lands mid-load whatever the machine's speed: the sink's first
  // call waits until the other thread has requested it (a timed stop missed
  // a load that finished first on a fast machine, or raced nothing).
  std::latch first_call(1), requested(1);
  struct waiting_sink {
    std::latch *first_call, *requested;
    std::atomic<int> calls = 0;  // the sink may be called from the load's threads
    bool accept(tensor_view) {
      if (++calls == 1) first_call->count_down(), requested->wait();
      return true;
    }
  } s{&first_call, &requested};
  auto o = small_staging();
  o.stop = stop.get_token();
  o.threads = 2;
  std::thread stopper([&] {
    first_call.wait();
    stop.request_stop();
    requested.count_down();
  });
  REQUIRE_THROWS_AS(load(ck, s, o), cancelled_error);
  stopper.join();
}

TEST_CASE("an error thrown by the sink stops the load and is rethrown", "[stages][load][errors]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  auto loader = [n = 0](tensor_view v) mutable -> bool {
    if (++n == 5) throw config_error("engine refused", {"", v.name()});
    return true;
  };
  callback_sink<decltype(loader)> cs(loader);
  REQUIRE_THROWS_AS(load(ck, cs, small_staging()), config_error);
}

TEST_CASE("selected tensors are the only ones read", "[stages][load][checkpoint]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  open_options oo;
  oo.select = [](std::string_view n) { return n.find("layers.1.") != std::string_view::npos; };
  auto ck = checkpoint::open(dir.path, oo);
  digest_sink d;
  auto st = load(ck, d, small_staging());
  REQUIRE(st.bytes_read == ck.tensor_bytes());
  for (const auto& [name, _] : d.digests()) REQUIRE(name.find("layers.1.") != std::string::npos);
}

TEST_CASE("a request is max_read bytes, capped by what a slot holds beside its alignment room", "[stages][load]") {
  constexpr std::uint64_t mib = 1u << 20;
  STATIC_REQUIRE(request_bytes_for(mib, slot_size_for(mib)) == mib);
  STATIC_REQUIRE(request_bytes_for(5000, slot_size_for(5000)) == 5000);
  STATIC_REQUIRE(request_bytes_for(64 * mib, slot_size_for(mib)) == mib);  // a pool cut for smaller reads
  STATIC_REQUIRE(request_bytes_for(mib, slot_size_for(64 * mib)) == mib);
  STATIC_REQUIRE(request_bytes_for(0, slot_size_for(mib)) == 4096);
  STATIC_REQUIRE(request_bytes_for(mib, 4096) == 4096);  // a slot without the room: one page
}

TEST_CASE("tensors of map_above bytes or more come whole as views of the page cache, outside the staging pool", "[stages][load][map]") {
  sluice_test::scratch_dir dir;
  testing::write_checkpoint(dir.path, small_model());
  auto ck = checkpoint::open(dir.path);
  auto o = small_staging();
  o.io = io_mode::buffered;  // every range maps (automatic: only cached ones)
  o.map_above = 300 << 10;   // above a slot's read, so these would otherwise come in pieces
  std::uint64_t large = 0, large_bytes = 0;
  for (const auto& t : ck.tensors())
    if (t.size >= o.map_above) ++large, large_bytes += t.size;
  REQUIRE(large > 0);
  staging_pool pool({o.staging_budget, slot_size_for(o.max_read)});
  struct recording_sink {
    const staging_pool* pool;
    std::uint64_t map_above;
    digest_sink digests;
    std::vector<lease> kept;  // views kept after the load: their mappings stay valid
    int outside_pool = 0, pieces_of_large = 0;
    bool accept(tensor_view v) {
      if (v.tensor->size >= map_above) {
        if (!v.whole()) ++pieces_of_large;
        if (pool->slot_index(v.bytes.data()) < 0) ++outside_pool;
        kept.push_back(v.hold);
      }
      return digests.accept(std::move(v));
    }
  } s{&pool, o.map_above, {}, {}, 0, 0};
  auto st = load(ck, s, pool, o);
  REQUIRE(st.mapped_tensors == large);
  REQUIRE(st.mapped_bytes == large_bytes);
  REQUIRE(s.pieces_of_large == 0);
  REQUIRE(s.outside_pool == static_cast<int>(large));
  REQUIRE(st.bytes_read == ck.tensor_bytes());
  const auto expected = python_digests(dir.path);
  for (const auto& [name, dg] : s.digests.digests()) {
    INFO(name);
    REQUIRE(dg.sha256 == expected.at(name));
  }
  // Without map_above (and under io_mode::direct) nothing is mapped.
  o.map_above = 0;
  digest_sink plain;
  REQUIRE(load(ck, plain, o).mapped_tensors == 0);
}

namespace {
// Whether every byte of the checkpoint's shards is in the page cache (false
// also where this kernel has no cachestat(2)).
bool all_cached(const checkpoint& ck) {
  for (const auto& sh : ck.shards()) {
    const int fd = ::open(sh.uri.c_str(), O_RDONLY);
    if (fd < 0) return false;
    const bool cached = detail::fully_cached(fd, 0, std::filesystem::file_size(sh.uri));
    ::close(fd);
    if (!cached) return false;
  }
  return true;
}

// A load whose views (tensors of map_above bytes or more) nobody touches
// while it runs: how many there were, and how many of their pages the load
// mapped in; the views are kept, with their tensors.
struct untouched_views {
  std::uint64_t map_above = 0;
  std::vector<std::pair<const tensor_ref*, lease>> kept;
  std::size_t views = 0, present = 0, pages = 0;
  bool accept(tensor_view v) {
    if (v.tensor->size < map_above) return true;
    ++views;
    present += sluice_test::present_pages(v.bytes);
    pages += sluice_test::spanned_pages(v.bytes);
    kept.emplace_back(v.tensor, v.hold);
    return true;
  }
};
untouched_views load_untouched(const checkpoint& ck, const load_options& o) {
  untouched_views s{o.map_above};
  if (load(ck, s, o).mapped_tensors != s.views) throw std::runtime_error("a view the load did not count as mapped");
  return s;
}

// A checkpoint of the small model, just written (so in the page cache), and
// options that hand its tensors of 300 KiB or more out as views.
struct viewed_checkpoint {
  sluice_test::scratch_dir dir;
  checkpoint ck = [this] {
    testing::write_checkpoint(dir.path, small_model());
    return checkpoint::open(dir.path);
  }();
  load_options o = [] {
    auto o = small_staging();
    o.io = io_mode::buffered;
    o.map_above = 300 << 10;
    return o;
  }();
};
}  // namespace

TEST_CASE("populate_views: a cached view comes with its pages mapped in, or leaves them to its consumer", "[stages][load][map]") {
  viewed_checkpoint c;
  const auto mode = GENERATE(populate_mode::on, populate_mode::off);
  c.o.populate_views = mode;
  if (!all_cached(c.ck)) {
    WARN("cachestat(2) unavailable (Linux < 6.5): nothing counts as cached, every view is mapped in");
    return;
  }
  const auto s = load_untouched(c.ck, c.o);
  REQUIRE(s.views > 0);
  INFO("present " << s.present << " of " << s.pages << " pages in " << s.views << " views");
  if (mode == populate_mode::on)
    REQUIRE(s.present == s.pages);
  else
    REQUIRE(s.present == 0);
  for (const auto& [t, v] : s.kept) {  // the file's bytes either way
    INFO(t->name);
    std::ifstream f(c.ck.shards()[t->shard].uri, std::ios::binary);
    std::vector<char> want(v.bytes().size());
    f.seekg(static_cast<std::streamoff>(t->offset));
    f.read(want.data(), static_cast<std::streamsize>(want.size()));
    REQUIRE(std::memcmp(v.bytes().data(), want.data(), want.size()) == 0);
  }
}

TEST_CASE("populate_views automatic maps in ahead only with two hardware threads per local rank, counted from the CPU affinity",
          "[stages][load][map]") {
  viewed_checkpoint c;
  c.o.populate_views = populate_mode::automatic;
  if (!all_cached(c.ck)) {
    WARN("cachestat(2) unavailable (Linux < 6.5): nothing counts as cached, every view is mapped in");
    return;
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(::sched_getaffinity(0, sizeof mask, &mask) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &mask)) ++first;
  // A thread allowed one CPU (as a rank pinned to one core, or a container
  // of one): one hardware thread, none to spare, so views are left to their
  // consumer. Asserted here, on the test's own thread.
  std::size_t threads = 0;
  bool spare = true;
  untouched_views pinned;
  std::exception_ptr failure;
  std::thread([&] {
    try {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(first, &one);
      if (::sched_setaffinity(0, sizeof one, &one) != 0) throw std::runtime_error("sched_setaffinity failed");
      threads = hardware_threads();
      spare = cores_to_spare(1);
      pinned = load_untouched(c.ck, c.o);
    } catch (...) {
      failure = std::current_exception();
    }
  }).join();
  if (failure) std::rethrow_exception(failure);
  REQUIRE(threads == 1);
  REQUIRE_FALSE(spare);
  REQUIRE(pinned.views > 0);
  REQUIRE(pinned.present == 0);
  if (hardware_threads() < 2) {
    WARN("one hardware thread here: automatic never maps in ahead");
    return;
  }
  REQUIRE(cores_to_spare(1));
  const auto s = load_untouched(c.ck, c.o);  // this thread, every CPU of the test's affinity
  REQUIRE(s.views == pinned.views);
  REQUIRE(s.present == s.pages);
}
