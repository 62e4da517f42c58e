#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <cerrno>
#include <cstring>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/core/run.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/testing/generator.hpp>

#include "core/open_record.hpp"  // the record's parses, to spoil them (src/core/)
#include "support/temp_dir.hpp"

using namespace sluice;
namespace gen = sluice::testing;
using sluice_test::read_file;
using sluice_test::temp_dir;

namespace {

std::string draft_prefix(const gen::generator_options& o, const std::string& model = "model.") {
  return model + "layers." + std::to_string(o.layers) + ".";
}

std::uint64_t size_of(const std::filesystem::path& p) { return std::filesystem::file_size(p); }

// A pread(2) source over a checkpoint's shards (this executable does not link
// the io_uring component). It counts the bytes read from each file, so a test
// sees what a load read, and where.
class pread_source {
 public:
  explicit pread_source(const checkpoint& ck) {
    for (const auto& s : ck.shards()) {
      const int fd = ::open(s.uri.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw io_error(std::strerror(errno), {s.uri}, errno);
      files_.push_back({s.uri, fd});
      counters_.files_opened.fetch_add(1);
    }
    read_.resize(files_.size());
  }
  ~pread_source() {
    for (const auto& f : files_) ::close(f.fd);
  }
  pread_source(const pread_source&) = delete;
  pread_source& operator=(const pread_source&) = delete;

  [[nodiscard]] task<std::size_t> read_at(std::uint32_t file, std::uint64_t offset, std::span<std::byte> dst) {
    const auto n = ::pread(files_.at(file).fd, dst.data(), dst.size(), static_cast<off_t>(offset));
    if (n < 0) throw io_error(std::strerror(errno), {files_[file].uri, "", byte_range{offset, offset + dst.size()}}, errno);
    counters_.bytes_read.fetch_add(static_cast<std::uint64_t>(n));
    counters_.requests.fetch_add(1);
    read_[file] += static_cast<std::uint64_t>(n);
    co_return static_cast<std::size_t>(n);
  }
  [[nodiscard]] std::size_t file_count() const noexcept { return files_.size(); }
  [[nodiscard]] std::string file_uri(std::uint32_t file) const { return files_.at(file).uri; }
  [[nodiscard]] const io_counters& counters() const noexcept { return counters_; }
  /// Bytes read from each file (by the checkpoint's shard index).
  [[nodiscard]] const std::vector<std::uint64_t>& bytes_per_file() const noexcept { return read_; }

 private:
  struct file {
    std::string uri;
    int fd;
  };
  std::vector<file> files_;
  std::vector<std::uint64_t> read_;
  io_counters counters_;
};
static_assert(source<pread_source>);

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  REQUIRE(EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) == 1);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

// Loads `ck` through the pipeline into a digest_sink and checks that exactly
// its tensors' bytes were read, from the shards holding them, and that every
// tensor arrived with the generator's bytes.
void load_and_check(const checkpoint& ck, const gen::generator_options& o) {
  pread_source src(ck);
  digest_sink sink;
  staging_pool pool({std::size_t{1} << 20, slot_size_for(64u << 10)});
  load_options opt;
  opt.max_read = 64u << 10;  // several requests per shard
  const auto st = run_blocking(load_async(ck, src, sink, pool, opt));

  CHECK(st.tensors == ck.tensors().size());
  CHECK(st.tensor_bytes == ck.tensor_bytes());
  CHECK(st.bytes_read == ck.tensor_bytes());
  CHECK(src.counters().bytes_read.load() == ck.tensor_bytes());  // no byte outside the selection's tensors
  CHECK(sink.bytes() == ck.tensor_bytes());
  CHECK(src.counters().files_opened.load() == ck.shards().size());
  std::vector<std::uint64_t> per_shard(ck.shards().size());
  for (const auto& t : ck.tensors()) per_shard[t.shard] += t.size;
  CHECK(src.bytes_per_file() == per_shard);

  REQUIRE(sink.digests().size() == ck.tensors().size());
  for (const auto& t : ck.tensors()) {
    CAPTURE(t.name);
    const auto it = sink.digests().find(t.name);
    REQUIRE(it != sink.digests().end());
    CHECK(it->second.sha256 == sha256_hex(gen::tensor_bytes(o.seed, t.name, t.size)));
    CHECK(it->second.shape == t.shape);
  }
}

}  // namespace

TEST_CASE("opening a multi-shard checkpoint reads the index and the shard headers, nothing else", "[checkpoint]") {
  temp_dir dir("ckpt");
  const auto plan = gen::write_checkpoint(dir.path(), gen::generator_options{});
  REQUIRE(plan.shards.size() >= 7);

  directory_catalog cat(dir.path());
  const auto ck = checkpoint::open(cat);
  std::uint64_t expected = size_of(dir.path() / "model.safetensors.index.json");
  for (const auto& s : ck.shards()) expected += s.header.header_bytes();
  CHECK(ck.header_bytes_read() == expected);
  CHECK(ck.header_bytes_read() == plan.header_bytes());
  CHECK(cat.bytes_read() == expected);
  CHECK(ck.shards().size() == plan.shards.size());
  CHECK(ck.tensors().size() == plan.tensors.size());
  CHECK(ck.tensor_bytes() == plan.total_size);
  // Far less than the checkpoint: the data was not touched.
  CHECK(ck.header_bytes_read() * 10 < plan.file_bytes());
}

TEST_CASE("tensors come in file order: shard order, then offset", "[checkpoint]") {
  temp_dir dir("ckpt");
  const auto plan = gen::write_checkpoint(dir.path(), gen::generator_options{});
  const auto ck = checkpoint::open(dir.path());
  REQUIRE(ck.tensors().size() == plan.tensors.size());
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    const auto& t = ck.tensors()[i];
    const auto& p = plan.tensors[i];
    CAPTURE(i, p.name);
    CHECK(t.name == p.name);
    CHECK(t.source_name == p.name);
    CHECK(ck.shards()[t.shard].name == plan.shards[p.shard].name);
    CHECK(t.offset == plan.shards[p.shard].header_bytes() + p.begin);
    CHECK(t.size == p.size);
    CHECK(t.type == p.type);
    CHECK(t.shape == p.shape);
    if (i > 0) {
      const auto& prev = ck.tensors()[i - 1];
      CHECK((prev.shard < t.shard || (prev.shard == t.shard && prev.offset + prev.size == t.offset)));
    }
  }
}

TEST_CASE("a tensor's bytes in the file are the generator's content function of (seed, name, offset)", "[checkpoint]") {
  temp_dir dir("ckpt");
  gen::generator_options o;
  o.seed = 42;
  const auto plan = gen::write_checkpoint(dir.path(), o);
  const auto ck = checkpoint::open(dir.path());
  std::vector<std::vector<std::byte>> files;
  for (const auto& s : ck.shards()) files.push_back(read_file(s.uri));
  for (const auto& t : ck.tensors()) {
    CAPTURE(t.name);
    const auto expect = gen::tensor_bytes(o.seed, t.name, t.size);
    REQUIRE(files[t.shard].size() >= t.offset + t.size);
    CHECK(std::equal(expect.begin(), expect.end(), files[t.shard].begin() + static_cast<std::ptrdiff_t>(t.offset)));
  }
}

TEST_CASE("selecting the draft module opens and reads only its three shards", "[checkpoint]") {
  temp_dir dir("ckpt");
  const gen::generator_options o;
  const auto plan = gen::write_checkpoint(dir.path(), o);
  const auto prefix = draft_prefix(o);
  std::set<std::uint32_t> draft_shards;
  std::size_t draft_tensors = 0;
  for (const auto& t : plan.tensors)
    if (t.name.starts_with(prefix)) {
      draft_shards.insert(t.shard);
      ++draft_tensors;
      CHECK(t.role == gen::tensor_role::draft);
    }
  REQUIRE(draft_shards.size() == 3);

  directory_catalog cat(dir.path());
  open_options opt;
  opt.select = [&](std::string_view name) { return name.starts_with(prefix); };
  const auto ck = checkpoint::open(cat, opt);
  REQUIRE(ck.shards().size() == 3);
  CHECK(ck.tensors().size() == draft_tensors);
  std::uint64_t expected = size_of(dir.path() / "model.safetensors.index.json");
  for (auto s : draft_shards) {
    CHECK(std::any_of(ck.shards().begin(), ck.shards().end(), [&](const shard& x) { return x.name == plan.shards[s].name; }));
    expected += plan.shards[s].header_bytes();
  }
  CHECK(ck.header_bytes_read() == expected);
  CHECK(cat.counters().files_opened.load() == 1 + 2 * 3);  // the index; length + JSON per shard
  std::uint64_t draft_bytes = 0;
  for (const auto& t : plan.tensors)
    if (t.name.starts_with(prefix)) draft_bytes += t.size;
  CHECK(ck.tensor_bytes() == draft_bytes);
  CHECK(draft_bytes < plan.total_size);

  // Loading the selection reads the draft tensors' bytes and nothing else;
  // every draft tensor arrives, with the generator's bytes.
  load_and_check(ck, o);

  // Selecting after a full open gives the same three shards, renumbered, in order.
  const auto full = checkpoint::open(dir.path());
  const auto sub = full.select([&](const tensor_ref& t) { return t.name.starts_with(prefix); });
  REQUIRE(sub.shards().size() == 3);
  REQUIRE(sub.tensors().size() == ck.tensors().size());
  for (std::size_t i = 0; i < sub.tensors().size(); ++i) {
    CHECK(sub.tensors()[i].name == ck.tensors()[i].name);
    CHECK(sub.shards()[sub.tensors()[i].shard].name == ck.shards()[ck.tensors()[i].shard].name);
  }
  load_and_check(sub, o);
}

TEST_CASE("renaming the VL wrapper's prefix gives the plain model's names in the same order", "[checkpoint]") {
  temp_dir plain_dir("plain"), vl_dir("vl");
  gen::generator_options o;
  (void)gen::write_checkpoint(plain_dir.path(), o);
  o.vl_prefix = true;
  (void)gen::write_checkpoint(vl_dir.path(), o);
  const auto plain = checkpoint::open(plain_dir.path());
  const std::vector<rename_rule> rules{{"model.language_model.", "model."}};

  open_options opt;
  opt.rename = rules;
  const auto renamed_at_open = checkpoint::open(vl_dir.path(), opt);
  const auto renamed_after = checkpoint::open(vl_dir.path()).rename(rules);
  for (const auto* vl : {&renamed_at_open, &renamed_after}) {
    REQUIRE(vl->tensors().size() == plain.tensors().size());
    for (std::size_t i = 0; i < plain.tensors().size(); ++i) {
      const auto& a = plain.tensors()[i];
      const auto& b = vl->tensors()[i];
      CAPTURE(i, a.name, b.source_name);
      CHECK(b.name == a.name);
      CHECK(b.offset == a.offset + (vl->shards()[b.shard].header.header_bytes() - plain.shards()[a.shard].header.header_bytes()));
      CHECK((b.source_name == a.name || b.source_name == "model.language_model." + a.name.substr(6)));
    }
    REQUIRE(vl->find("model.embed_tokens.weight") != nullptr);
    CHECK(vl->find("model.embed_tokens.weight")->source_name == "model.language_model.embed_tokens.weight");
    CHECK(vl->find("lm_head.weight") != nullptr);
  }
}

TEST_CASE("a rename that makes two tensors share a name is a config_error", "[checkpoint]") {
  temp_dir dir("ckpt");
  (void)gen::write_checkpoint(dir.path(), gen::generator_options{});
  const auto ck = checkpoint::open(dir.path());
  CHECK_THROWS_AS(ck.rename({{"model.layers.0.", "model.layers.1."}}), config_error);
}

TEST_CASE("selecting a name the checkpoint lacks is a config_error naming it", "[checkpoint]") {
  temp_dir dir("ckpt");
  (void)gen::write_checkpoint(dir.path(), gen::generator_options{});
  const auto ck = checkpoint::open(dir.path());
  const auto two = ck.select(std::set<std::string>{"lm_head.weight", "model.norm.weight"});
  CHECK(two.tensors().size() == 2);
  try {
    (void)ck.select(std::set<std::string>{"lm_head.weight", "no.such.tensor"});
    FAIL("accepted");
  } catch (const config_error& e) {
    CHECK(e.tensor() == "no.such.tensor");
  }
}

TEST_CASE("one .safetensors file opens as a checkpoint of one shard", "[checkpoint]") {
  temp_dir dir("ckpt");
  const auto plan = gen::write_checkpoint(dir.path(), gen::generator_options{});
  const auto& s = plan.shards.back();
  const auto ck = checkpoint::open(dir.path() / s.name);
  REQUIRE(ck.shards().size() == 1);
  CHECK(ck.tensors().size() == s.tensors.size());
  CHECK(ck.header_bytes_read() == s.header_bytes());
  CHECK(ck.tensor_bytes() == s.data_size);
}

TEST_CASE("a directory without an index opens model.safetensors, or else every *.safetensors file", "[checkpoint]") {
  temp_dir dir("ckpt");
  const auto plan = gen::write_checkpoint(dir.path(), gen::generator_options{});
  std::filesystem::remove(dir.path() / "model.safetensors.index.json");
  const auto all = checkpoint::open(dir.path());
  CHECK(all.shards().size() == plan.shards.size());
  CHECK(all.tensors().size() == plan.tensors.size());
  std::filesystem::copy_file(dir.path() / plan.shards[0].name, dir.path() / "model.safetensors");
  const auto single = checkpoint::open(dir.path());
  REQUIRE(single.shards().size() == 1);
  CHECK(single.shards()[0].name == "model.safetensors");
}

TEST_CASE("a path to the index file opens the whole checkpoint", "[checkpoint]") {
  temp_dir dir("ckpt");
  const auto plan = gen::write_checkpoint(dir.path(), gen::generator_options{});
  const auto ck = checkpoint::open(dir.path() / "model.safetensors.index.json");
  CHECK(ck.shards().size() == plan.shards.size());
  CHECK(ck.header_bytes_read() == plan.header_bytes());
}

TEST_CASE("a directory with no checkpoint in it is an io_error naming it", "[checkpoint]") {
  temp_dir dir("empty");
  CHECK_THROWS_AS(checkpoint::open(dir.path()), io_error);
  CHECK_THROWS_AS(checkpoint::open(dir.path() / "missing"), io_error);
}

namespace {

// A draft engine's setup: the generated checkpoint's shards in `shards/`
// (no index there), and a local index in `local/` naming only the draft
// module's tensors, recording each draft shard's size.
struct draft_index_setup {
  temp_dir dir{"ckpt-index"};
  gen::generator_options o;
  gen::checkpoint_layout plan = gen::write_checkpoint(dir.path() / "shards", o);
  std::filesystem::path index = dir.path() / "local" / "draft.index.json";
  std::set<std::string> draft_shards, draft_tensors;

  draft_index_setup() {
    std::filesystem::remove(shards() / "model.safetensors.index.json");
    std::filesystem::create_directories(index.parent_path());
    for (const auto& t : plan.tensors)
      if (t.name.starts_with(draft_prefix(o))) {
        draft_tensors.insert(t.name);
        draft_shards.insert(plan.shards[t.shard].name);
      }
    REQUIRE(draft_shards.size() == 3);
  }
  [[nodiscard]] std::filesystem::path shards() const { return dir.path() / "shards"; }
  // Writes the index: `where(tensor)` is the shard it names (default: the real one).
  void write(const std::function<std::string(const std::string&, const std::string&)>& where = {},
             bool record_sizes = true) const {
    nlohmann::json j;
    for (const auto& t : plan.tensors) {
      if (!draft_tensors.contains(t.name)) continue;
      const auto& real = plan.shards[t.shard].name;
      j["weight_map"][t.name] = where ? where(t.name, real) : real;
    }
    if (record_sizes)
      for (const auto& sh : draft_shards) j["metadata"]["shards"][sh]["size"] = size_of(shards() / sh);
    std::ofstream(index) << j.dump(1);
  }
  // Bytes of the draft shards' headers (8-byte length + JSON).
  [[nodiscard]] std::uint64_t draft_header_bytes() const {
    std::uint64_t n = 0;
    for (const auto& sh : plan.shards)
      if (draft_shards.contains(sh.name)) n += sh.header_bytes();
    return n;
  }
};

}  // namespace

TEST_CASE("a local index opens the draft module's shards from another directory and reads only them",
          "[checkpoint][index]") {
  draft_index_setup d;
  d.write();
  directory_catalog cat(d.shards());
  open_options opt;
  opt.index = d.index;
  const auto ck = checkpoint::open(cat, opt);
  std::set<std::string> shards, tensors;
  for (const auto& s : ck.shards()) shards.insert(s.name);
  for (const auto& t : ck.tensors()) tensors.insert(t.name);
  CHECK(shards == d.draft_shards);
  CHECK(tensors == d.draft_tensors);
  CHECK(cat.bytes_read() == d.draft_header_bytes());  // the draft shards' headers, nothing else
  load_and_check(ck, d.o);

  // The same through a location, and with the full index plus a selection.
  const auto by_path = checkpoint::open(location(d.shards()), opt);
  CHECK(by_path.tensors().size() == ck.tensors().size());
  temp_dir full("ckpt-full");
  gen::write_checkpoint(full.path(), d.o);
  open_options sel;
  sel.index = full.path() / "model.safetensors.index.json";
  sel.select = [&](std::string_view n) { return d.draft_tensors.contains(std::string(n)); };
  directory_catalog cat2(d.shards());
  const auto selected = checkpoint::open(cat2, sel);
  CHECK(selected.shards().size() == 3);
  CHECK(selected.tensors().size() == d.draft_tensors.size());
  CHECK(cat2.bytes_read() == d.draft_header_bytes());
}

TEST_CASE("a local index placing a tensor in the wrong shard is an index_error naming it, before any tensor byte",
          "[checkpoint][index]") {
  draft_index_setup d;
  const std::string moved = *d.draft_tensors.begin();
  std::string wrong;
  d.write([&](const std::string& t, const std::string& real) {
    if (t != moved) return real;
    for (const auto& s : d.draft_shards)
      if (s != real) wrong = s;
    return wrong;
  });
  directory_catalog cat(d.shards());
  open_options opt;
  opt.index = d.index;
  try {
    (void)checkpoint::open(cat, opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "missing-tensor");
    CHECK(e.tensor() == moved);
    CHECK_THAT(e.what(), Catch::Contains(wrong));
  }
  CHECK(cat.bytes_read() <= d.draft_header_bytes());  // headers only
}

TEST_CASE("a local index naming a shard the location lacks is an index_error naming it, before any read",
          "[checkpoint][index]") {
  draft_index_setup d;
  d.write();
  const auto gone = *d.draft_shards.rbegin();
  std::filesystem::remove(d.shards() / gone);
  directory_catalog cat(d.shards());
  open_options opt;
  opt.index = d.index;
  try {
    (void)checkpoint::open(cat, opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "missing-shard");
    CHECK_THAT(e.what(), Catch::Contains(gone));
    CHECK(e.file() == d.index.string());
  }
  CHECK(cat.bytes_read() == 0);  // checked against the listing, before any header
}

TEST_CASE("a local index naming a shard whose header disagrees is an index_error naming the shard",
          "[checkpoint][index]") {
  draft_index_setup d;
  // Another (non-draft) shard's bytes under a draft shard's name: a different
  // header, and a different size from the one the index records.
  const auto victim = *d.draft_shards.begin();
  std::string other;
  for (const auto& s : d.plan.shards)
    if (!d.draft_shards.contains(s.name) && size_of(d.shards() / s.name) != size_of(d.shards() / victim)) other = s.name;
  REQUIRE_FALSE(other.empty());
  d.write();  // records the sizes of the real draft shards
  std::filesystem::copy_file(d.shards() / other, d.shards() / victim, std::filesystem::copy_options::overwrite_existing);
  open_options opt;
  opt.index = d.index;
  {
    directory_catalog cat(d.shards());
    try {
      (void)checkpoint::open(cat, opt);
      FAIL("no error");
    } catch (const index_error& e) {
      CHECK(e.rule() == "stale-shard");
      CHECK_THAT(e.file(), Catch::Contains(victim));
    }
    CHECK(cat.bytes_read() == 0);  // the size alone gave it away
  }
  // Without recorded sizes, the header itself disagrees with the index.
  d.write({}, false);
  directory_catalog cat(d.shards());
  try {
    (void)checkpoint::open(cat, opt);
    FAIL("no error");
  } catch (const index_error& e) {
    CHECK(e.rule() == "missing-tensor");
    CHECK_THAT(e.file(), Catch::Contains(victim));
  }
}

TEST_CASE("an index file that cannot be read is an io_error naming it", "[checkpoint][index]") {
  draft_index_setup d;
  open_options opt;
  opt.index = d.dir.path() / "nowhere.json";
  try {
    (void)checkpoint::open(location(d.shards()), opt);
    FAIL("no error");
  } catch (const io_error& e) {
    CHECK(e.file() == opt.index.string());
  }
}

// checkpoint::open(location, communicator) between two in-process ranks: the
// opening record rank 0 broadcasts is kept on a tape, and rank 1 replays
// what the tape holds, so a test can damage it on the way.
namespace {

class tape_communicator {
 public:
  tape_communicator(std::size_t rank, std::vector<std::vector<std::byte>>& tape) : rank_(rank), tape_(&tape) {}
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return 2; }
  // Rank 0 records what it sends; rank 1 receives the tape's next entry.
  void broadcast(std::span<std::byte> buf, std::size_t) {
    if (rank_ == 0) {
      tape_->emplace_back(buf.begin(), buf.end());
      return;
    }
    const auto& b = tape_->at(next_++);
    REQUIRE(b.size() == buf.size());
    std::copy(b.begin(), b.end(), buf.begin());
  }
  void all_gather(std::span<const std::byte>, std::span<std::byte>) { FAIL("not used by the collective open"); }
  void all_gather_v(std::span<std::byte>, std::span<const std::size_t>) { FAIL("not used by the collective open"); }
  void exchange(std::span<const comm::send_message>, std::span<const comm::recv_message>) { FAIL("not used by the collective open"); }
  void barrier() { FAIL("not used by the collective open"); }

 private:
  std::size_t rank_;
  std::vector<std::vector<std::byte>>* tape_;
  std::size_t next_ = 0;
};
static_assert(comm::communicator<tape_communicator>);

gen::generator_options small_generator() {
  gen::generator_options o;
  o.layers = 2, o.experts = 2, o.engram_tables = 1, o.engram_rows = 64, o.draft = false;
  o.max_shard_bytes = 64u << 10;
  return o;
}

// Rank 0's record of opening `dir`.
std::vector<std::byte> opening_record(const std::filesystem::path& dir) {
  std::vector<std::vector<std::byte>> tape;
  tape_communicator c(0, tape);
  (void)checkpoint::open(location(dir.string()), c);
  REQUIRE(tape.size() == 2);  // the record's size, then the record
  return tape[1];
}

// Rank 1's open of `dir` from `record`.
checkpoint replay(const std::filesystem::path& dir, const std::vector<std::byte>& record) {
  std::uint64_t n = record.size();
  const auto* p = reinterpret_cast<const std::byte*>(&n);
  std::vector<std::vector<std::byte>> tape{{p, p + sizeof n}, record};
  tape_communicator c(1, tape);
  return checkpoint::open(location(dir.string()), c);
}

// A record's parts (src/core/open_record.cpp): the CBOR part's length (8
// bytes, little-endian), the CBOR part, then rank 0's parses.
std::uint64_t cbor_size(const std::vector<std::byte>& record) {
  REQUIRE(record.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(record[static_cast<std::size_t>(i)]);
  REQUIRE(n <= record.size() - 8);
  return n;
}
nlohmann::json json_of(const std::vector<std::byte>& record) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(record.data()) + 8;
  return nlohmann::json::from_cbor(p, p + cbor_size(record));
}
std::vector<std::byte> parses_of(const std::vector<std::byte>& record) {
  return {record.begin() + static_cast<std::ptrdiff_t>(8 + cbor_size(record)), record.end()};
}
// A record of `j` and `parses`, framed as rank 0 frames one.
std::vector<std::byte> framed(const nlohmann::json& j, const std::vector<std::byte>& parses = {}) {
  const auto b = nlohmann::json::to_cbor(j);
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(static_cast<std::uint64_t>(b.size()) >> (8 * i)));
  const auto* p = reinterpret_cast<const std::byte*>(b.data());
  out.insert(out.end(), p, p + b.size());
  out.insert(out.end(), parses.begin(), parses.end());
  return out;
}

}  // namespace

TEST_CASE("a rank that replays rank 0's opening record opens the same checkpoint without reading a header", "[checkpoint][collective]") {
  temp_dir dir("collective");
  (void)gen::write_checkpoint(dir.path(), small_generator());
  const auto record = opening_record(dir.path());
  const auto own = checkpoint::open(dir.path());
  const auto ck = replay(dir.path(), record);
  CHECK(ck.header_bytes_read() == 0);
  REQUIRE(ck.tensors().size() == own.tensors().size());
  for (std::size_t i = 0; i < own.tensors().size(); ++i) {
    CAPTURE(own.tensors()[i].name);
    CHECK(ck.tensors()[i].name == own.tensors()[i].name);
    CHECK(ck.tensors()[i].offset == own.tensors()[i].offset);
    CHECK(ck.tensors()[i].size == own.tensors()[i].size);
    CHECK(ck.tensors()[i].shape == own.tensors()[i].shape);
  }
  // The record's CBOR part is a map with its format tag. Rank 0's parses
  // follow it, and stand for the header and index bytes, which the record
  // no longer holds: the replay above read nothing, so it took the parses.
  const auto j = json_of(record);
  CHECK(j.at("format") == "sluice-open/3");
  CHECK(j.at("parsed") == parses_of(record).size());
  CHECK_FALSE(parses_of(record).empty());
  for (const auto& call : j.at("calls")) {
    CAPTURE(call.dump());
    CHECK_FALSE(call.at(6).is_binary());  // no read's bytes
  }
}

TEST_CASE("a rank whose limits are not rank 0's parses the headers itself", "[checkpoint][collective]") {
  temp_dir dir("collective-limits");
  (void)gen::write_checkpoint(dir.path(), small_generator());
  const auto record = opening_record(dir.path());
  std::uint64_t n = record.size();
  const auto* p = reinterpret_cast<const std::byte*>(&n);
  std::vector<std::vector<std::byte>> tape{{p, p + sizeof n}, record};
  tape_communicator c(1, tape);
  open_options opt;
  opt.limits.max_name_bytes = 4096;  // rank 0 parsed within 1024
  const auto ck = checkpoint::open(location(dir.path().string()), c, opt);
  const auto own = checkpoint::open(dir.path());
  CHECK(ck.header_bytes_read() == own.header_bytes_read());  // what the record left out, read here
  REQUIRE(ck.tensors().size() == own.tensors().size());
  for (std::size_t i = 0; i < own.tensors().size(); ++i) {
    CHECK(ck.tensors()[i].name == own.tensors()[i].name);
    CHECK(ck.tensors()[i].offset == own.tensors()[i].offset);
  }
}

TEST_CASE("rank 0's parses that break a rule of the format are a damaged record, not a checkpoint", "[checkpoint][collective]") {
  namespace rec = sluice::detail::open_record;
  temp_dir dir("collective-rules");
  (void)gen::write_checkpoint(dir.path(), small_generator());
  const auto record = opening_record(dir.path());
  const auto j = json_of(record);
  const auto good = rec::decode_parsed(parses_of(record), 0);
  REQUIRE(good.index);
  REQUIRE(good.headers.size() > 1);
  auto spoiled = [&](const std::function<void(rec::parsed&)>& f) {
    auto p = good;
    f(p);
    std::vector<std::pair<std::string, const format::header*>> headers;
    for (const auto& [name, h] : p.headers) headers.emplace_back(name, &h);
    const auto parses = rec::encode_parsed(p.limits, headers, p.index ? &*p.index : nullptr);
    auto k = j;
    k["parsed"] = parses.size();
    try {
      (void)replay(dir.path(), framed(k, parses));
    } catch (const comm::comm_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 0") && Catch::Contains("break a rule"));
      return std::string(e.what());
    }
    FAIL("the spoiled parses were taken");
    return std::string();
  };
  auto& first = good.headers.front().second.tensors;
  REQUIRE(first.size() > 1);
  SECTION("a tensor overlapping the next") {
    CHECK_THAT(spoiled([](rec::parsed& p) { p.headers.front().second.tensors[0].end += 1; }), Catch::Contains("layout") || Catch::Contains("tensor-size"));
  }
  SECTION("a size its shape and dtype do not need") {
    CHECK_THAT(spoiled([](rec::parsed& p) { p.headers.front().second.tensors[0].shape.push_back(3); }), Catch::Contains("tensor-size"));
  }
  SECTION("a name twice") {
    CHECK_THAT(spoiled([](rec::parsed& p) {
                 auto& t = p.headers.front().second.tensors;
                 t[1].name = t[0].name;
               }),
               Catch::Contains("duplicate-name"));
  }
  SECTION("a header longer than its file") {
    CHECK_THAT(spoiled([](rec::parsed& p) { p.headers.front().second.json_size = p.headers.front().second.file_size; }),
               Catch::Contains("header-length"));
  }
  SECTION("an index that places a tensor outside the checkpoint") {
    CHECK_THAT(spoiled([](rec::parsed& p) { p.index->weight_map.begin()->second = "../../etc/passwd"; }), Catch::Contains("shard-name"));
  }
  SECTION("a name longer than the limits rank 0 says it parsed within") {
    CHECK_THAT(spoiled([](rec::parsed& p) { p.headers.front().second.tensors[0].name.assign(2000, 'x'); }), Catch::Contains("name-length"));
  }
}

TEST_CASE("a damaged opening record is a comm_error naming rank 0, however it was damaged", "[checkpoint][collective]") {
  temp_dir dir("collective-bad");
  (void)gen::write_checkpoint(dir.path(), small_generator());
  const auto record = opening_record(dir.path());
  const auto good = json_of(record);
  REQUIRE(good.at("calls").size() > 2);
  auto damaged_is_comm_error = [&](const std::vector<std::byte>& bad) {
    try {
      (void)replay(dir.path(), bad);
    } catch (const comm::comm_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 0"));
      return;
    }
    FAIL("the damaged record was replayed");
  };
  SECTION("cut short anywhere") {
    // Every length in the first and last 256 bytes, and about 500 between.
    const std::size_t n = record.size(), stride = std::max<std::size_t>(1, n / 500);
    for (std::size_t len = 0; len < n; len += (len < 256 || len + 256 >= n) ? 1 : stride) {
      CAPTURE(len, n);
      damaged_is_comm_error({record.begin(), record.begin() + static_cast<std::ptrdiff_t>(len)});
    }
  }
  SECTION("with trailing bytes") {
    auto bad = record;
    bad.push_back(std::byte{0});
    damaged_is_comm_error(bad);
  }
  SECTION("not a record at all") {
    damaged_is_comm_error(framed(nlohmann::json::array({1, 2, 3})));
    damaged_is_comm_error(framed({{"format", "sluice-open/2"}}));
    damaged_is_comm_error(std::vector<std::byte>(64, std::byte{0xff}));
    damaged_is_comm_error(std::vector<std::byte>(3, std::byte{0}));
  }
  SECTION("parses cut short, or more of them than the record says") {
    const auto parses = parses_of(record);
    REQUIRE(parses.size() > 16);
    damaged_is_comm_error(framed(good, {parses.begin(), parses.end() - 1}));
    auto more = parses;
    more.push_back(std::byte{1});
    damaged_is_comm_error(framed(good, more));
    damaged_is_comm_error(framed(good));  // cut where the parses begin
    auto k = good;  // the parses' length told, and trailing bytes inside them
    k["parsed"] = more.size();
    damaged_is_comm_error(framed(k, more));
  }
  SECTION("a field of the wrong type or an unknown call") {
    auto spoil = [&](const std::function<void(nlohmann::json&)>& f) {
      auto j = good;
      f(j);
      damaged_is_comm_error(framed(j, parses_of(record)));
    };
    spoil([](nlohmann::json& j) { j.erase("shards"); });
    spoil([](nlohmann::json& j) { j["calls"] = "none"; });
    spoil([](nlohmann::json& j) { j["at"] = 7; });
    spoil([](nlohmann::json& j) { j["failure"] = 1; });
    spoil([](nlohmann::json& j) { j["calls"][0][0] = 99; });                 // an operation that does not exist
    spoil([](nlohmann::json& j) { j["calls"][0][0] = -1; });
    spoil([](nlohmann::json& j) { j["calls"][0][2] = "0"; });                // an offset that is not a number
    spoil([](nlohmann::json& j) { j["calls"][0].erase(6); });                // a call without its answer
    spoil([](nlohmann::json& j) { j["shards"][0][1] = -5; });
    spoil([](nlohmann::json& j) { j["parsed"] = "all"; });
    spoil([](nlohmann::json& j) { j.erase("parsed"); });
    for (std::size_t i = 0; i < good.at("calls").size(); ++i) {  // every answer replaced by one of another type
      if (good["calls"][i][4].get<bool>()) continue;                // a failure has no answer
      spoil([i](nlohmann::json& j) {
        auto& a = j["calls"][i][6];
        a = a.is_string() || a.is_null() ? nlohmann::json(1) : nlohmann::json("x");
      });
    }
  }
}

TEST_CASE("an s3:// location in a program that does not link sluice::s3 names the component to link", "[checkpoint][location]") {
  // This executable links the core alone: nothing registered the s3 scheme.
  try {
    (void)checkpoint::open("s3://bucket/prefix/");
    FAIL("an s3:// location opened without the S3 component");
  } catch (const missing_component_error& e) {
    CHECK(e.component() == "sluice::s3");
    CHECK_THAT(e.what(), Catch::Contains("link sluice::s3"));
    CHECK(e.file() == "s3://bucket/prefix/");
  }
  // A scheme no component offers is a plain config_error.
  CHECK_THROWS_AS(checkpoint::open("gs://bucket/prefix/"), config_error);
}
