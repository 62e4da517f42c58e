// bench-gpu: file -> GPU with sluice (pinned staging, cudaMemcpyAsync on a few
// streams) against its two ceilings: pinned host -> device bandwidth
// (cudaMemcpy from pinned memory) and the storage read (sluice into a discard
// sink, and a pread loop), hot from the page cache and with O_DIRECT.
// Copies every tensor back and compares its SHA-256 with the generator's.
// Prints GiB/s, ratios (target: file->GPU >= 0.9 x min(storage, H2D)) and the
// peak pinned memory.
//
//   bench-gpu DIR [--size 8GiB] [--max-read 32MiB] [--qd 8] [--staging 1GiB] [--streams 4]
//                 [--repeat 3] [--threads 1] [--no-cold] [--no-verify]
//
// DIR is (re)generated with gen-checkpoint's generator unless it holds a
// checkpoint of --size. Without a CUDA device it prints "SKIPPED: ..." and
// exits 77. Benchmark traps (bench/README.md): page-aligned pre-faulted buffers,
// hot runs re-read the files right before timing, O_DIRECT runs drop the page
// cache first where allowed (root).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <openssl/evp.h>

#include <fmt/format.h>

#include <sluice/cuda/device.hpp>
#include <sluice/cuda/device_sink.hpp>
#include <sluice/cuda/staging.hpp>
#include <sluice/cuda/device_buffer.hpp>
#include <sluice/cuda/host_register.hpp>
#include <sluice/cuda/pinned.hpp>
#include <sluice/sluice.hpp>
#include <sluice/testing/generator.hpp>

#include "common.hpp"
#include "common/args.hpp"

namespace {
using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }
constexpr double gib = 1024.0 * 1024 * 1024;

double pread_loop(const std::vector<std::string>& paths, std::byte* buf, std::size_t bs, bool direct) {
  const auto t0 = clk::now();
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", p, std::strerror(errno)));
    for (off_t off = 0;;) {
      const auto n = ::pread(fd, buf, bs, off);
      if (n < 0) throw std::runtime_error(fmt::format("pread {}{}: {}", p, direct ? " (O_DIRECT)" : "", std::strerror(errno)));
      if (n == 0) break;
      off += n;
    }
    ::close(fd);
  }
  return since(t0);
}

std::string sha256_hex(std::span<const std::byte> b) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_Digest(b.data(), b.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

// Pinned H2D: best of `reps` cudaMemcpy of `n` bytes (GiB/s).
double h2d(const std::byte* src, void* dst, std::size_t n, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clk::now();
    sluice::cuda::check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy");
    best = std::min(best, since(t0));
  }
  return static_cast<double>(n) / gib / best;
}
}  // namespace

int main(int argc, char** argv) try {
  using namespace sluice;
  std::string dir, size_s = "8GiB", max_read_s = "32MiB", staging_s = "1GiB";
  unsigned qd = 8, streams = 4, threads = 1;
  int repeat = 3;
  bool no_cold = false, no_verify = false;
  CLI::App app("bench-gpu: file to GPU memory, sluice against pread + cudaMemcpy");
  app.add_option("DIR", dir, "a checkpoint directory (generated there when it has no index)")->required();
  app.add_option("--size", size_s, "size of the generated checkpoint")->capture_default_str();
  app.add_option("--max-read", max_read_s, "bytes per read")->capture_default_str();
  app.add_option("--staging", staging_s, "pinned staging budget")->capture_default_str();
  app.add_option("--qd", qd, "reads in flight")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--streams", streams, "copy streams")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "io_context threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per row (best of)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--no-cold", no_cold, "skip the cold-cache rows");
  app.add_flag("--no-verify", no_verify, "skip copying back and hashing");
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  const std::uint64_t size = sluice_cli::parse_size(size_s), max_read = sluice_cli::parse_size(max_read_s),
                      staging = sluice_cli::parse_size(staging_s);
  const bool cold = !no_cold, verify = !no_verify;
  const auto q = cuda::query_devices();
  if (!q) {
    std::printf("SKIPPED: no CUDA device (%s)\n", q.reason().c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  std::printf("bench-gpu: %s, %.0f GiB, driver %d, runtime %d, %u CPUs\n", prop.name,
              static_cast<double>(prop.totalGlobalMem) / gib, drv, rt, std::thread::hardware_concurrency());
  std::printf("command: %s", argv[0]);
  for (int i = 1; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");

  // ---- the checkpoint and its ground truth
  const auto gen = testing::options_for_size(size);
  auto plan = testing::make_layout(gen);
  const auto index = std::filesystem::path(dir) / "model.safetensors.index.json";
  bool fresh = !std::filesystem::exists(index);
  if (!fresh && checkpoint::open(dir).tensor_bytes() != plan.total_size) {
    std::printf("%s holds another checkpoint: regenerating\n", dir.c_str());
    std::filesystem::remove_all(dir);
    fresh = true;
  }
  if (fresh) {
    const auto t0 = clk::now();
    testing::write_checkpoint(dir, plan);
    std::printf("generated %s in %s (%.1f s)\n", sluice_cli::human_bytes(static_cast<double>(plan.total_size)).c_str(),
                dir.c_str(), since(t0));
  }
  auto ck = checkpoint::open(dir);
  std::vector<std::string> paths;
  std::uint64_t file_bytes = 0;
  for (const auto& s : ck.shards()) {
    paths.push_back(s.uri);
    file_bytes += s.header.file_size;
  }
  const double data = static_cast<double>(ck.tensor_bytes()) / gib;
  std::printf("checkpoint: %zu shards, %zu tensors, %.2f GiB of tensors (%.2f GiB of files)\n", paths.size(),
              ck.tensors().size(), data, static_cast<double>(file_bytes) / gib);
  std::printf("sluice: max-read %s, qd %u, staging %s pinned, %u copy streams, %u io threads\n",
              sluice_cli::human_bytes(static_cast<double>(max_read)).c_str(), qd,
              sluice_cli::human_bytes(static_cast<double>(staging)).c_str(), streams, threads);

  // ---- ceiling 1: pinned H2D
  constexpr std::size_t probe = std::size_t{1} << 30;
  double h2d_alloc = 0, h2d_reg = 0, h2d_pageable = 0, host_register_gibs = 0;
  {
    auto dev = memory::device_buffer::allocate(probe, 0, "h2d probe");
    {
      auto p = memory::pinned::allocate(probe, memory::pin_mode::host_alloc);
      std::memset(p.data(), 1, probe);
      (void)h2d(p.data(), dev.data(), probe, 1);  // warm-up
      h2d_alloc = h2d(p.data(), dev.data(), probe, 5);
    }
    {
      auto p = memory::pinned::allocate(probe, memory::pin_mode::host_register);
      std::memset(p.data(), 1, probe);
      h2d_reg = h2d(p.data(), dev.data(), probe, 5);
    }
    auto pageable = sluice::lease::allocate(probe);
    std::memset(pageable.bytes().data(), 1, probe);
    h2d_pageable = h2d(pageable.bytes().data(), dev.data(), probe, 3);
    // What pinning costs: cudaHostRegister (mapped, as the node's shared
    // segment is registered) of 1 GiB already faulted in, once.
    const auto t0 = clk::now();
    auto reg = cuda::host_registration::register_mapped(pageable.bytes());
    host_register_gibs = static_cast<double>(probe) / gib / since(t0);
  }
  const double h2d_best = std::max(h2d_alloc, h2d_reg);

  // ---- the loads
  memory::pinned::reset_peak();
  const auto pinned_before = memory::pinned::bytes_pinned();
  auto pool = cuda::make_pinned_pool(
      {.budget = staging, .slot_size = slot_size_for(max_read), .poison = false, .prefault = true});
  load_options o;
  o.max_read = max_read;
  o.queue_depth = qd;
  o.threads = threads;
  o.poison = false;
  o.register_buffers = true;
  auto pread_buf = memory::pinned::allocate(max_read, memory::pin_mode::host_register);
  cuda::device_sink gpu({.streams = streams});
  gpu.reserve(ck);

  auto warm = [&] { (void)pread_loop(paths, pread_buf.data(), max_read, false); };
  struct best_of {
    double seconds = 1e30;
    void add(double s) { seconds = std::min(seconds, s); }
    [[nodiscard]] double gibs(double d) const { return d / seconds; }
  };
  best_of disc_hot, gpu_hot, pread_hot, disc_direct, gpu_direct, pread_direct;
  std::size_t slots_used = 0;
  auto timed_load = [&](auto& sink, sluice::io_mode io) {
    o.io = io;
    const auto t0 = clk::now();
    const auto st = load(ck, sink, pool, o);
    const double t = since(t0);
    slots_used = std::max(slots_used, st.slots_used);
    if (st.tensors != ck.tensors().size()) throw error("a load delivered fewer tensors than the checkpoint holds");
    return t;
  };
  bool dropped = true;
  auto before_direct = [&] {
    if (cold) dropped = sluice_bench::drop_caches() && dropped;
  };
  for (int r = 0; r < repeat; ++r) {
    discard_sink d;
    warm();
    disc_hot.add(timed_load(d, sluice::io_mode::buffered));
    warm();
    gpu_hot.add(timed_load(gpu, sluice::io_mode::buffered));
    warm();
    pread_hot.add(pread_loop(paths, pread_buf.data(), max_read, false));
    before_direct();
    disc_direct.add(timed_load(d, sluice::io_mode::direct));
    before_direct();
    gpu_direct.add(timed_load(gpu, sluice::io_mode::direct));
    before_direct();
    pread_direct.add(pread_loop(paths, pread_buf.data(), max_read, true));
  }
  const auto peak_pinned = memory::pinned::peak_bytes_pinned() - pinned_before;
  const auto sst = gpu.stats();

  // ---- verify: every tensor back from the device, SHA-256 against the generator's
  std::size_t bad = 0, checked = 0;
  double verify_s = 0;
  if (verify) {
    const auto t0 = clk::now();
    std::vector<std::size_t> order(plan.tensors.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::atomic<std::size_t> next{0}, mismatches{0};
    std::mutex print_mu;
    auto worker = [&] {
      cudaSetDevice(0);
      std::vector<std::byte> host;
      for (std::size_t i; (i = next.fetch_add(1)) < order.size();) {
        const auto& t = plan.tensors[i];
        host.resize(t.size);
        gpu.download(t.name, host);
        const auto want = testing::tensor_sha256(plan.options.seed, t.name, t.size);
        if (sha256_hex(host) != want) {
          mismatches.fetch_add(1);
          std::lock_guard g(print_mu);
          std::printf("MISMATCH %s\n", t.name.c_str());
        }
      }
    };
    std::vector<std::thread> ws;
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) ws.emplace_back(worker);
    for (auto& w : ws) w.join();
    bad = mismatches.load();
    checked = order.size();
    verify_s = since(t0);
  }

  // ---- figures
  const double st_hot = std::max(disc_hot.gibs(data), pread_hot.gibs(data));
  const double st_direct = std::max(disc_direct.gibs(data), pread_direct.gibs(data));
  const double ceil_hot = std::min(st_hot, h2d_best), ceil_direct = std::min(st_direct, h2d_best);
  std::printf("\nhost -> device (1 GiB cudaMemcpy, best of 5)     GiB/s\n");
  std::printf("  pinned (cudaHostAlloc)                       %7.2f\n", h2d_alloc);
  std::printf("  pinned (mmap + cudaHostRegister, the pool's) %7.2f\n", h2d_reg);
  std::printf("  pageable (reference)                         %7.2f\n", h2d_pageable);
  std::printf("cudaHostRegister, 1 GiB pre-faulted (mapped)   %7.2f GiB/s\n", host_register_gibs);
  std::printf("\nstorage read (best of %d)                        GiB/s\n", repeat);
  std::printf("  page cache: sluice -> discard (pinned pool)  %7.2f\n", disc_hot.gibs(data));
  std::printf("  page cache: pread loop                       %7.2f\n", pread_hot.gibs(data));
  std::printf("  O_DIRECT:   sluice -> discard (pinned pool)  %7.2f%s\n", disc_direct.gibs(data),
              cold && !dropped ? "   (page cache not dropped: not root?)" : "");
  std::printf("  O_DIRECT:   pread loop                       %7.2f\n", pread_direct.gibs(data));
  std::printf("\nfile -> GPU (sluice, device_sink)                GiB/s   vs min(storage, H2D)\n");
  std::printf("  page cache                                   %7.2f   %.2fx  (ceiling %.2f)\n", gpu_hot.gibs(data),
              gpu_hot.gibs(data) / ceil_hot, ceil_hot);
  std::printf("  O_DIRECT                                     %7.2f   %.2fx  (ceiling %.2f)\n", gpu_direct.gibs(data),
              gpu_direct.gibs(data) / ceil_direct, ceil_direct);
  std::printf("\npeak pinned memory %s (pool %s, %zu of %zu slots used at most, + %s pread buffer); "
              "%llu copies, most views held for a copy at once %llu\n",
              sluice_cli::human_bytes(static_cast<double>(peak_pinned)).c_str(),
              sluice_cli::human_bytes(static_cast<double>(pool.region().size())).c_str(), slots_used, pool.slot_count(),
              sluice_cli::human_bytes(static_cast<double>(max_read)).c_str(),
              static_cast<unsigned long long>(sst.copies), static_cast<unsigned long long>(sst.max_pending));
  if (verify)
    std::printf("verify: %zu tensors copied back, %zu mismatched (%.1f s)\n", checked, bad, verify_s);
  const bool ok = gpu_hot.gibs(data) >= 0.9 * ceil_hot && gpu_direct.gibs(data) >= 0.9 * ceil_direct;
  std::printf("target file->GPU >= 0.9x min(storage, H2D): %s\n", ok ? "met" : "NOT met");
  return bad ? 1 : 0;
} catch (const std::exception& e) {
  return sluice_cli::fail(e.what());
}
