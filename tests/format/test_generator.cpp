#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>
#include <sluice/testing/generator.hpp>

#include "support/temp_dir.hpp"

using namespace sluice;
namespace gen = sluice::testing;
using sluice_test::read_file;
using sluice_test::temp_dir;

TEST_CASE("content is a pure function of (seed, name, offset), whatever the chunking", "[testing][generator]") {
  const auto whole = gen::tensor_bytes(7, "w", 101);
  for (std::uint64_t off : {0u, 1u, 5u, 8u, 13u, 64u}) {
    for (std::uint64_t len : {0u, 1u, 3u, 8u, 9u, 20u}) {
      if (off + len > whole.size()) continue;
      std::vector<std::byte> part(len);
      gen::fill_bytes(7, "w", off, part);
      CAPTURE(off, len);
      CHECK(std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(off)));
    }
  }
  CHECK(gen::tensor_bytes(8, "w", 101) != whole);
  CHECK(gen::tensor_bytes(7, "v", 101) != whole);
  // Word 0 of tensor "w", seed 7: the documented formula, little-endian.
  const std::uint64_t w0 = gen::splitmix64_mix(gen::content_key(7, "w") + 0x9e3779b97f4a7c15ull);
  for (int b = 0; b < 8; ++b) CHECK(whole[static_cast<std::size_t>(b)] == static_cast<std::byte>(w0 >> (8 * b)));
}

TEST_CASE("the plan has every kind of tensor a DeepSeek-like checkpoint holds", "[testing][generator]") {
  const gen::generator_options o;
  const auto plan = gen::make_layout(o);
  std::map<gen::tensor_role, std::size_t> roles;
  for (const auto& t : plan.tensors) ++roles[t.role];
  for (auto r : {gen::tensor_role::embedding, gen::tensor_role::norm, gen::tensor_role::attention, gen::tensor_role::dense_mlp,
                 gen::tensor_role::router, gen::tensor_role::shared_expert, gen::tensor_role::routed_expert,
                 gen::tensor_role::expert_scale, gen::tensor_role::engram_table, gen::tensor_role::engram_small,
                 gen::tensor_role::draft, gen::tensor_role::odd}) {
    CAPTURE(gen::role_name(r));
    CHECK(roles[r] > 0);
  }
  const std::uint32_t moe_layers = o.layers - o.dense_layers;
  CHECK(roles[gen::tensor_role::routed_expert] == moe_layers * o.experts * 3);
  CHECK(roles[gen::tensor_role::expert_scale] == moe_layers * o.experts * 3);

  const auto* e = plan.find("model.layers.1.mlp.experts.2.down_proj.weight");
  REQUIRE(e);
  CHECK(e->type == format::dtype::F8_E4M3);
  CHECK(e->shape == std::vector<std::uint64_t>{o.hidden, o.moe_intermediate});
  const auto* s = plan.find("model.layers.1.mlp.experts.2.down_proj.weight_scale_inv");
  REQUIRE(s);
  CHECK(s->type == format::dtype::F32);
  CHECK(plan.find("model.layers.0.self_attn.q_proj.weight")->type == format::dtype::BF16);
  CHECK(plan.find("model.layers.0.mlp.gate_proj.weight")->role == gen::tensor_role::dense_mlp);

  // Odd tensors: a scalar, a zero-size tensor, BOOL and I64.
  CHECK(plan.find("model.odd.scalar")->shape.empty());
  CHECK(plan.find("model.odd.scalar")->size == 4);
  CHECK(plan.find("model.odd.empty")->size == 0);
  CHECK(plan.find("model.odd.mask")->type == format::dtype::BOOL);
  CHECK(plan.find("model.odd.positions")->type == format::dtype::I64);
}

TEST_CASE("each Engram table sits in a shard of its own with a few small ordinary tensors", "[testing][generator]") {
  const gen::generator_options o;
  const auto plan = gen::make_layout(o);
  std::set<std::uint32_t> table_shards;
  for (const auto& t : plan.tensors)
    if (t.role == gen::tensor_role::engram_table && t.name.ends_with(".table")) {
      table_shards.insert(t.shard);
      CHECK(t.type == format::dtype::F8_E4M3);
    }
  REQUIRE(table_shards.size() == o.engram_tables);
  for (auto s : table_shards) {
    std::size_t tables = 0, small = 0, other = 0;
    for (auto i : plan.shards[s].tensors) {
      const auto r = plan.tensors[i].role;
      (r == gen::tensor_role::engram_table ? tables : r == gen::tensor_role::engram_small ? small : other)++;
    }
    CHECK(tables == 2);  // table + scale
    CHECK(small == 2);
    CHECK(other == 0);
  }
}

TEST_CASE("the draft module fills three shards that hold nothing else", "[testing][generator]") {
  const auto plan = gen::make_layout(gen::generator_options{});
  std::set<std::uint32_t> draft_shards;
  for (const auto& t : plan.tensors)
    if (t.role == gen::tensor_role::draft) draft_shards.insert(t.shard);
  REQUIRE(draft_shards.size() == 3);
  for (auto s : draft_shards)
    for (auto i : plan.shards[s].tensors) CHECK(plan.tensors[i].role == gen::tensor_role::draft);
}

TEST_CASE("written files are the plan byte for byte, and the index verifies against them", "[testing][generator]") {
  temp_dir dir("gen");
  gen::generator_options o;
  o.vl_prefix = true;
  const auto plan = gen::write_checkpoint(dir.path(), o);
  std::map<std::string, format::header> headers;
  for (const auto& s : plan.shards) {
    const auto bytes = read_file(dir.path() / s.name);
    CHECK(bytes.size() == s.file_size());
    const auto h = format::parse_header(std::span<const std::byte>(bytes), bytes.size(), s.name);
    CHECK(h.header_bytes() == s.header_bytes());
    CHECK(h.data_start() % o.alignment == 0);
    CHECK(std::string(reinterpret_cast<const char*>(bytes.data()) + 8, s.header_json.size()) == s.header_json);
    REQUIRE(h.tensors.size() == s.tensors.size());
    for (std::size_t k = 0; k < s.tensors.size(); ++k) CHECK(h.tensors[k].name == plan.tensors[s.tensors[k]].name);
    headers.emplace(s.name, h);
  }
  const auto index_bytes = read_file(dir.path() / "model.safetensors.index.json");
  const auto ix = format::parse_index(std::string_view(reinterpret_cast<const char*>(index_bytes.data()), index_bytes.size()), "ix");
  CHECK(ix.total_size == plan.total_size);
  CHECK(ix.weight_map.size() == plan.tensors.size());
  std::map<std::string, const format::header*> ptrs;
  for (auto& [n, h] : headers) ptrs.emplace(n, &h);
  CHECK_NOTHROW(format::verify(ix, ptrs));
  for (const auto& t : plan.tensors) CHECK((t.name.starts_with("model.language_model.") || t.name == "lm_head.weight"));
}

TEST_CASE("a target size scales the checkpoint to about that many bytes", "[testing][generator]") {
  for (std::uint64_t target : {16ull << 20, 256ull << 20, 2ull << 30, 20ull << 30}) {
    const auto plan = gen::make_layout(gen::options_for_size(target));
    CAPTURE(target, plan.total_size);
    CHECK(plan.total_size <= target * 11 / 10);
    CHECK(plan.total_size >= target * 8 / 10);
    std::uint64_t engram = 0;
    for (const auto& t : plan.tensors)
      if (t.role == gen::tensor_role::engram_table) engram += t.size;
    CHECK(engram * 100 / plan.total_size >= 30);  // a large part is Engram tables, as in the design checkpoint
  }
  CHECK(gen::make_layout(gen::options_for_size(1024)).total_size > 0);  // tiny targets get the minimal model
}

TEST_CASE("a metadata-only plan of many thousand tensors is computed without writing anything", "[testing][generator]") {
  gen::generator_options o;
  o.layers = 8;
  o.experts = 64;
  o.max_shard_bytes = 1 << 20;
  const auto plan = gen::make_layout(o);
  CHECK(plan.tensors.size() > 8 * 64 * 6 - 64 * 6);
  CHECK(plan.shards.size() > 3);
  for (const auto& s : plan.shards) CHECK(s.header_json.front() == '{');
}

TEST_CASE("sha256 matches the FIPS 180-4 test vectors", "[testing][generator]") {
  auto of = [](std::string_view text) {
    gen::sha256 h;
    h.update({reinterpret_cast<const std::byte*>(text.data()), text.size()});
    return h.hex();
  };
  CHECK(of("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(of("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  gen::sha256 million;
  const std::string a(1000, 'a');
  for (int i = 0; i < 1000; ++i) million.update({reinterpret_cast<const std::byte*>(a.data()), a.size()});
  CHECK(million.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("expected tensors carry each tensor's name, dtype, shape and the sha256 of its bytes", "[testing][generator]") {
  const auto plan = gen::make_layout(gen::generator_options{});
  const auto expected = gen::expected_tensors(plan);
  REQUIRE(expected.size() == plan.tensors.size());
  for (std::size_t i = 0; i < expected.size(); i += 7) {
    const auto& t = plan.tensors[i];
    const auto bytes = gen::tensor_bytes(plan.options.seed, t.name, t.size);
    gen::sha256 h;
    h.update(bytes);
    CHECK(expected[i].name == t.name);
    CHECK(expected[i].sha256 == h.hex());
  }
  const auto* e = plan.find("model.odd.empty");
  REQUIRE(e);
  CHECK(gen::tensor_sha256(1, e->name, 0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(expected.front().line().find("\tBF16\t[") != std::string::npos);
}

TEST_CASE("every planned header validates with the parser, without writing any data", "[testing][generator]") {
  gen::generator_options o;
  o.layers = 6;
  o.experts = 32;
  o.max_shard_bytes = 256 << 10;
  const auto plan = gen::make_layout(o);
  REQUIRE(plan.tensors.size() > 5 * 32 * 6);
  std::size_t seen = 0;
  for (const auto& sh : plan.shards) {
    const auto h = format::parse_header(sh.header_json, sh.file_size(), sh.name);
    REQUIRE(h.tensors.size() == sh.tensors.size());
    CHECK(h.header_bytes() == sh.header_bytes());
    for (std::size_t k = 0; k < sh.tensors.size(); ++k) {
      const auto& p = plan.tensors[sh.tensors[k]];
      CHECK(h.tensors[k].name == p.name);
      CHECK(h.tensors[k].begin == p.begin);
      CHECK(h.tensors[k].size() == p.size);
      ++seen;
    }
  }
  CHECK(seen == plan.tensors.size());
  const auto ix = format::parse_index(plan.index_json, "index");
  CHECK(ix.weight_map.size() == plan.tensors.size());
  CHECK(ix.shards().size() == plan.shards.size());
}
