// bench-tp-slices: how to get TP column parts of a row-parallel weight out of
// storage. A column part is strided in the file: TP rank k keeps
// columns [k C/TP, (k+1) C/TP) of every row. Two plans, both through the
// distributed loader's data path (slice_reader over the directory's
// source: coalesce | fetch | stage | place over io_uring) into pre-faulted part buffers:
//   per-row ranges  — R x TP planned reads of C/TP elements each, straight into
//                     the packed parts (no copy, many small reads);
//   rows then slice — blocks of whole rows (a few large reads) into a scratch
//                     buffer, then each part cut out with one memcpy per row
//                     (what sluice's plan does: policy::tp_split::columns).
// Hot: page cache warm. Cold: caches dropped before each run (root).
//
//   bench-tp-slices [--rows 7168] [--cols 18432] [--tp 8] [--repeat 5] [--block-rows 512] [--dir DIR]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/distributed.hpp>
#include <sluice/format/writer.hpp>

#include "common.hpp"
#include "common/args.hpp"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

}  // namespace

int main(int argc, char** argv) try {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  std::uint64_t rows = 7168, cols = 18432, tp = 8, repeat = 5, block_rows = 512;
  std::string dir_s = "/tmp/sluice-bench-tp";
  CLI::App app("bench-tp-slices: a column-split tensor's TP parts, per-row reads against rows then slices");
  app.add_option("--rows", rows, "rows of the BF16 tensor")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "columns (a multiple of --tp)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--tp", tp, "TP parts")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per row (best of)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--block-rows", block_rows, "rows per read when reading rows then slicing")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--dir", dir_s, "where the tensor's file is written")->capture_default_str();
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  if (cols % tp) return sluice_cli::fail("--cols must be a multiple of --tp");
  const fs::path dir = dir_s;
  fs::create_directories(dir);
  const auto file = dir / "model.safetensors";
  const std::uint64_t row = cols * 2, part = row / tp, size = rows * row;  // BF16
  format::writer w;
  w.add("model.layers.0.mlp.down_proj.weight", format::dtype::BF16, {rows, cols},
        [](std::uint64_t off, std::span<std::byte> out) {
          for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((off + i) * 2654435761u >> 13);
        });
  w.write(file);
  const auto ck = checkpoint::open(file);
  const tensor_ref& t = ck.tensors().at(0);

  load_options lo;
  lo.register_buffers = false;
  auto parts = sluice_bench::prefaulted(size), scratch = sluice_bench::prefaulted(block_rows * row);
  asio::io_context ioc{1};
  auto per_row = [&](slice_reader& rd) {
    planned_reads reads;
    reads.reserve(rows * tp);
    for (std::uint64_t k = 0; k < tp; ++k)
      for (std::uint64_t r = 0; r < rows; ++r)
        reads.push_back({&t, r * row + k * part, part, parts.subspan(k * rows * part + r * part, part)});
    run_blocking(ioc, rd.read(reads));
  };
  auto rows_then_slice = [&](slice_reader& rd) {
    for (std::uint64_t r0 = 0; r0 < rows; r0 += block_rows) {
      const auto n = std::min(block_rows, rows - r0);
      planned_reads reads;
      reads.push_back({&t, r0 * row, n * row, scratch.first(n * row)});
      run_blocking(ioc, rd.read(reads));
      for (std::uint64_t k = 0; k < tp; ++k)
        for (std::uint64_t r = 0; r < n; ++r)
          std::memcpy(parts.data() + k * rows * part + (r0 + r) * part, scratch.data() + r * row + k * part, part);
    }
  };
  // Checks every part against the file (the bytes must be the same either way).
  std::vector<std::byte> whole(size);
  {
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(t.offset));
    in.read(reinterpret_cast<char*>(whole.data()), static_cast<std::streamsize>(size));
  }
  auto verify = [&] {
    for (std::uint64_t k = 0; k < tp; ++k)
      for (std::uint64_t r = 0; r < rows; r += 97)
        if (std::memcmp(parts.data() + k * rows * part + r * part, whole.data() + r * row + k * part, part) != 0)
          throw std::runtime_error(fmt::format("part {} row {} differs", k, r));
  };
  fmt::print("# {}\n# one BF16 [{} x {}] weight ({:.0f} MiB), TP{}: each part {} B per row; best of {}\n\n", cmd, rows, cols,
             static_cast<double>(size) / (1 << 20), tp, part, repeat);
  fmt::print("| cache | plan | reads | requests | seconds | GiB/s (tensor bytes) |\n|---|---|---|---|---|---|\n");
  double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};
  for (int cold = 0; cold < 2; ++cold) {
    if (cold && !sluice_bench::drop_caches()) {
      fmt::print("| cold | (cannot drop caches: not root) | | | | |\n");
      break;
    }
    for (int plan = 0; plan < 2; ++plan) {
      std::uint64_t requests = 0;
      for (std::uint64_t i = 0; i < repeat; ++i) {
        if (cold) sluice_bench::drop_caches();
        else {  // warm
          std::ifstream in(file, std::ios::binary);
          std::vector<char> b(8u << 20);
          while (in.read(b.data(), static_cast<std::streamsize>(b.size())) || in.gcount() > 0) {}
        }
        slice_reader rd(ck.storage().open_source(ck, ioc, lo.source()), lo);
        const auto t0 = std::chrono::steady_clock::now();
        plan == 0 ? per_row(rd) : rows_then_slice(rd);
        best[cold][plan] = std::min(best[cold][plan], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        requests = rd.counters().requests.load();
        verify();
      }
      const auto nreads = plan == 0 ? rows * tp : (rows + block_rows - 1) / block_rows;
      fmt::print("| {} | {} | {} | {} | {:.3f} | {:.2f} |\n", cold ? "cold" : "hot", plan == 0 ? "per-row ranges" : "rows then slice",
                 nreads, requests, best[cold][plan], static_cast<double>(size) / best[cold][plan] / (1 << 30));
    }
  }
  fmt::print("\nrows then slice / per-row ranges (speed): hot {:.2f}x, cold {:.2f}x\n", best[0][0] / best[0][1],
             best[1][0] < 1e29 ? best[1][0] / best[1][1] : 0.0);
  fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench-tp-slices: {}\n", e.what());
  return 1;
}
