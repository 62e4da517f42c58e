// bench-local: the same checkpoint read by sluice (O_DIRECT and buffered), fio,
// a pread loop and mmap+memcpy, with memcpy bandwidth as the ceiling for
// page-cache-hot loads. Prints GiB/s and ratios.
//
//   bench-local DIR [--size 2GiB] [--max-read 32MiB] [--qd 4] [--staging 1GiB] [--repeat 3] [--no-cold]
//
// DIR is created with gen-checkpoint's generator if it holds no checkpoint.
// Benchmark traps handled here (bench/README.md): every buffer is
// page-aligned and pre-faulted before timing; hot runs re-read the files right
// before timing; cold runs drop the page cache (needs root).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/sluice.hpp>
#include <sluice/testing/generator.hpp>

#include "common.hpp"
#include "common/args.hpp"

namespace {
using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }
constexpr double gib = 1024.0 * 1024 * 1024;

struct file_set {
  std::vector<std::string> paths;
  std::uint64_t bytes = 0;
};

// Where a contender's bytes go: `reuse` — one max_read buffer for every read
// (the classic loop; a max_read-sized buffer can stay in the last-level cache
// and outrun the memcpy ceiling);
// `into_place` — every byte of every file to its own place in a
// checkpoint-sized, pre-faulted arena (files back to back), as a loader fills
// host tensors: the destination cannot stay in the cache, so this is the
// comparison a loader lives by.
enum class dest { reuse, into_place };

double pread_loop(const file_set& fs, std::byte* buf, std::size_t bs, bool direct, dest d = dest::reuse) {
  const auto t0 = clk::now();
  std::byte* file_base = buf;
  for (const auto& p : fs.paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
    off_t off = 0;
    for (;;) {
      const auto n = ::pread(fd, d == dest::into_place ? file_base + off : buf, bs, off);
      if (n <= 0) break;
      off += n;
    }
    if (d == dest::into_place) file_base += off;
    ::close(fd);
  }
  return since(t0);
}

void warm(const file_set& fs, std::byte* buf, std::size_t bs) { (void)pread_loop(fs, buf, bs, false); }

double mmap_memcpy(const file_set& fs, std::byte* dst, std::size_t chunk, dest d = dest::reuse) {
  const auto t0 = clk::now();
  std::byte* file_base = dst;
  for (const auto& p : fs.paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    const auto size = static_cast<std::size_t>(::lseek(fd, 0, SEEK_END));
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::madvise(m, size, MADV_SEQUENTIAL);
    for (std::size_t off = 0; off < size; off += chunk)
      std::memcpy(d == dest::into_place ? file_base + off : dst, static_cast<const std::byte*>(m) + off,
                  std::min(chunk, size - off));
    if (d == dest::into_place) file_base += size;
    ::munmap(m, size);
    ::close(fd);
  }
  return since(t0);
}

double memcpy_ceiling(std::byte* a, std::byte* b, std::size_t n, int reps) {
  const auto t0 = clk::now();
  for (int i = 0; i < reps; ++i) std::memcpy(b, a, n);
  return since(t0) / reps;
}

// fio over the same files, same block size and depth; returns GiB/s. fio drops
// the files from the page cache before a job unless --invalidate=0: a hot run
// must say so, or fio measures the disk.
double fio(const file_set& fs, std::size_t bs, unsigned qd, bool direct, const char* engine) {
  std::string files;
  for (const auto& p : fs.paths) files += (files.empty() ? "" : ":") + p;
  const auto cmd = fmt::format(
      "fio --name=bench --readonly --rw=read --filename={} --bs={} --iodepth={} --ioengine={} --direct={} "
      "--iomem_align=4096 --file_service_type=sequential --invalidate={} --output-format=json 2>/dev/null",
      files, bs, qd, engine, direct ? 1 : 0, direct ? 1 : 0);
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) return 0;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  if (j.is_discarded()) return 0;
  const double bw_bytes = j["jobs"][0]["read"]["bw_bytes"].get<double>();
  return bw_bytes / gib;
}

// fio allocates its buffers without MADV_HUGEPAGE; with transparent hugepages
// in `madvise` mode (Debian's default) its 32 MiB O_DIRECT reads then pin 8192
// small pages each and run well below a hugepage buffer's speed cold (figures
// in bench/README.md). Every other contender uses hugepage-backed
// buffers, so for fio's runs THP is set to `always` when this process may
// (root) and restored afterwards; otherwise the output says fio ran without.
class thp_always {
 public:
  thp_always() {
    std::ifstream in(path_);
    std::string line;
    std::getline(in, line);
    const auto a = line.find('['), b = line.find(']');
    if (a == std::string::npos || b == std::string::npos) return;
    previous_ = line.substr(a + 1, b - a - 1);
    active_ = previous_ == "always" || write("always");
  }
  ~thp_always() {
    if (active_ && previous_ != "always") (void)write(previous_);
  }
  thp_always(const thp_always&) = delete;
  thp_always& operator=(const thp_always&) = delete;
  [[nodiscard]] bool active() const noexcept { return active_; }

 private:
  bool write(const std::string& mode) const {
    std::ofstream out(path_);
    out << mode << "\n";
    out.flush();
    return static_cast<bool>(out);
  }
  static constexpr const char* path_ = "/sys/kernel/mm/transparent_hugepage/enabled";
  std::string previous_;
  bool active_ = false;
};

struct sluice_run {
  double seconds = 0, cpu = 0;
};
template <class Sink>
sluice_run run_sluice(const sluice::checkpoint& ck, Sink& s, sluice::staging_pool& pool, const sluice::load_options& o) {
  const double c0 = sluice_cli::cpu_seconds();
  const auto t0 = clk::now();
  const auto st = sluice::load(ck, s, pool, o);
  const sluice_run r{since(t0), sluice_cli::cpu_seconds() - c0};
  if (st.accepted != ck.tensors().size()) throw std::runtime_error("bench: the sink declined tensors");
  return r;
}
sluice_run run_sluice(const sluice::checkpoint& ck, sluice::staging_pool& pool, const sluice::load_options& o) {
  sluice::discard_sink s;
  return run_sluice(ck, s, pool, o);
}
// sluice into the arena of dest::into_place: each tensor's caller destination
// is where its bytes sit in the back-to-back files (tensors of >= 1 MiB are
// read straight into it, smaller ones go through staging).
sluice_run run_sluice_into(const sluice::checkpoint& ck, std::byte* arena, sluice::staging_pool& pool,
                           const sluice::load_options& o) {
  sluice::host_sink s({.allocate = false});
  std::vector<std::uint64_t> base;
  std::uint64_t b = 0;
  for (const auto& sh : ck.shards()) {
    base.push_back(b);
    b += sh.header.file_size;
  }
  for (const auto& t : ck.tensors()) s.set_destination(t.name, {arena + base[t.shard] + t.offset, t.size});
  return run_sluice(ck, s, pool, o);
}
}  // namespace

int main(int argc, char** argv) try {
  std::string dir, size_s = "2GiB", max_read_s = "32MiB", staging_s = "1GiB";
  unsigned qd = 4;
  int repeat = 3;
  bool no_cold = false;
  CLI::App app("bench-local: sluice against fio, pread and mmap+memcpy on local files");
  app.add_option("DIR", dir, "a checkpoint directory (generated there when it has no index)")->required();
  app.add_option("--size", size_s, "size of the generated checkpoint")->capture_default_str();
  app.add_option("--max-read", max_read_s, "bytes per read")->capture_default_str();
  app.add_option("--staging", staging_s, "staging budget")->capture_default_str();
  app.add_option("--qd", qd, "reads in flight")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per row (best of)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--no-cold", no_cold, "skip the cold-cache rows");
  if (const auto code = sluice_cli::parse_args(app, argc, argv, 2)) return *code;
  const std::uint64_t size = sluice_cli::parse_size(size_s), max_read = sluice_cli::parse_size(max_read_s),
                      staging = sluice_cli::parse_size(staging_s);
  const bool cold = !no_cold;
  if (!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors.index.json")) {
    std::printf("generating a %s checkpoint in %s\n", sluice_cli::human_bytes(static_cast<double>(size)).c_str(), dir.c_str());
    sluice::testing::write_checkpoint(dir, sluice::testing::options_for_size(size));
  }
  auto ck = sluice::checkpoint::open(dir);
  file_set fs;
  for (const auto& s : ck.shards()) {
    fs.paths.push_back(s.uri);
    fs.bytes += s.header.file_size;
  }
  const double data = static_cast<double>(fs.bytes) / gib;
  auto* buf = sluice_bench::prefaulted(max_read).data();
  auto* big_a = sluice_bench::prefaulted(256 << 20).data();
  auto* big_b = sluice_bench::prefaulted(256 << 20).data();
  sluice::load_options o;
  o.staging_budget = staging;
  o.max_read = max_read;
  o.queue_depth = qd;
  o.poison = false;
  o.register_buffers = true;
  // One pre-faulted pool reused by every run, as the pread contender reuses its buffer.
  sluice::staging_pool pool({.budget = staging, .slot_size = sluice::slot_size_for(max_read), .poison = false, .prefault = true});
  std::printf("bench-local: %zu files, %.2f GiB, max-read %s, qd %u, staging %s\n", fs.paths.size(), data,
              sluice_cli::human_bytes(static_cast<double>(max_read)).c_str(), qd,
              sluice_cli::human_bytes(static_cast<double>(staging)).c_str());
  auto best = [&](auto f) {
    double t = 1e30;
    for (int r = 0; r < repeat; ++r) t = std::min(t, f());
    return t;
  };

  // Page-cache hot: re-read right before each timed run.
  const double t_memcpy = memcpy_ceiling(big_a, big_b, 256 << 20, 8);
  o.io = sluice::io_mode::buffered;
  auto best_sluice = [&](auto f) {
    sluice_run b{1e30, 0};
    for (int r = 0; r < repeat; ++r) {
      warm(fs, buf, max_read);
      auto s = f();
      if (s.seconds < b.seconds) b = s;
    }
    return b;
  };
  const sluice_run hot = best_sluice([&] { return run_sluice(ck, pool, o); });
  auto inline_copies = o;
  inline_copies.punt_buffered = false;
  const sluice_run hot_inline = best_sluice([&] { return run_sluice(ck, pool, inline_copies); });
  const double t_pread = best([&] { warm(fs, buf, max_read); return pread_loop(fs, buf, max_read, false); });
  const double t_mmap = best([&] { warm(fs, buf, max_read); return mmap_memcpy(fs, buf, max_read); });
  double fio_hot = 0;
  bool fio_thp = false;
  {
    thp_always thp;
    fio_thp = thp.active();
    warm(fs, buf, max_read);
    fio_hot = fio(fs, max_read, 1, false, "psync");
  }
  const double best_alt = std::max(data / t_pread, data / t_mmap);
  auto* arena = sluice_bench::prefaulted(fs.bytes).data();
  const sluice_run into = best_sluice([&] { return run_sluice_into(ck, arena, pool, o); });
  const sluice_run into_inline = best_sluice([&] { return run_sluice_into(ck, arena, pool, inline_copies); });
  const double t_pread_into = best([&] { warm(fs, buf, max_read); return pread_loop(fs, arena, max_read, false, dest::into_place); });
  const double t_mmap_into = best([&] { warm(fs, buf, max_read); return mmap_memcpy(fs, arena, max_read, dest::into_place); });
  const double best_into = std::max(data / t_pread_into, data / t_mmap_into);
  // Into fresh memory: a new arena per run (as an engine's just-allocated
  // parameters: no huge pages, never touched), first touch included; the
  // contenders take turns within each repeat, so that the VM's slow and fast
  // spells of fresh memory fall on all of them.
  auto no_prefault = o;
  no_prefault.prefault_above = 0;
  struct fresh_row {
    const char* name;
    std::function<double(std::byte*)> run;
    double best = 1e30, cpu = 0;
  };
  std::vector<fresh_row> fresh{
      {"sluice (host sink, prefault)", [&](std::byte* a) { return run_sluice_into(ck, a, pool, o).seconds; }},
      {"sluice, prefault off", [&](std::byte* a) { return run_sluice_into(ck, a, pool, no_prefault).seconds; }},
      {"pread loop", [&](std::byte* a) { return pread_loop(fs, a, max_read, false, dest::into_place); }},
      {"mmap + memcpy (safetensors)", [&](std::byte* a) { return mmap_memcpy(fs, a, max_read, dest::into_place); }}};
  for (int r = 0; r < repeat; ++r)
    for (auto& row : fresh) {
      void* m = ::mmap(nullptr, fs.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::runtime_error("bench: mmap of a fresh arena failed");
      warm(fs, buf, max_read);
      const double c0 = sluice_cli::cpu_seconds();
      const double t = row.run(static_cast<std::byte*>(m));
      const double cpu = sluice_cli::cpu_seconds() - c0;
      ::munmap(m, fs.bytes);
      if (t < row.best) row.best = t, row.cpu = cpu;
    }
  const double best_fresh = std::max(data / fresh[2].best, data / fresh[3].best);
  std::printf("\npage-cache hot, into one reused buffer   GiB/s   vs best of pread/mmap\n");
  std::printf("  memcpy ceiling (1 thread)        %7.2f\n", 0.25 / t_memcpy);
  std::printf("  sluice (buffered, io_uring)      %7.2f   %.2fx   CPU %.2f s/GiB\n", data / hot.seconds, data / hot.seconds / best_alt, hot.cpu / data);
  std::printf("  sluice, inline copies (no punt)  %7.2f   %.2fx   CPU %.2f s/GiB\n", data / hot_inline.seconds, data / hot_inline.seconds / best_alt, hot_inline.cpu / data);
  std::printf("  pread loop                       %7.2f   %.2fx\n", data / t_pread, data / t_pread / best_alt);
  std::printf("  mmap + memcpy (safetensors)      %7.2f   %.2fx\n", data / t_mmap, data / t_mmap / best_alt);
  if (fio_hot > 0) std::printf("  fio psync                        %7.2f   %.2fx\n", fio_hot, fio_hot / best_alt);
  std::printf("\npage-cache hot, into place (%.2f GiB arena)  GiB/s   vs best of pread/mmap\n", data);
  std::printf("  sluice (host sink, caller buffers) %5.2f   %.2fx   CPU %.2f s/GiB\n", data / into.seconds, data / into.seconds / best_into, into.cpu / data);
  std::printf("  sluice, inline copies (no punt)  %7.2f   %.2fx   CPU %.2f s/GiB\n", data / into_inline.seconds, data / into_inline.seconds / best_into, into_inline.cpu / data);
  std::printf("  pread loop                       %7.2f   %.2fx\n", data / t_pread_into, data / t_pread_into / best_into);
  std::printf("  mmap + memcpy (safetensors)      %7.2f   %.2fx\n", data / t_mmap_into, data / t_mmap_into / best_into);
  std::printf("\npage-cache hot, into fresh memory (first touch)  GiB/s   vs best of pread/mmap\n");
  for (const auto& row : fresh)
    std::printf("  %-31s %7.2f   %.2fx   CPU %.2f s/GiB\n", row.name, data / row.best, data / row.best / best_fresh, row.cpu / data);

  if (cold) {
    o.io = sluice::io_mode::direct;
    sluice_run c{1e30, 0};
    for (int r = 0; r < repeat; ++r) {
      sluice_bench::require_drop_caches();
      auto s = run_sluice(ck, pool, o);
      if (s.seconds < c.seconds) c = s;
    }
    double fio_best = 0;
    {
      thp_always thp;
      for (const char* engine : {"io_uring", "libaio", "psync"}) {
        sluice_bench::require_drop_caches();
        fio_best = std::max(fio_best, fio(fs, max_read, std::string(engine) == "psync" ? 1 : qd, true, engine));
      }
    }
    sluice_bench::require_drop_caches();
    const double t_pread_direct = pread_loop(fs, buf, max_read, true);
    std::printf("\ncold, O_DIRECT                       GiB/s   vs fio's best\n");
    std::printf("  sluice (O_DIRECT, io_uring)      %7.2f   %.2fx   CPU %.2f s/GiB\n", data / c.seconds, fio_best > 0 ? data / c.seconds / fio_best : 0.0, c.cpu / data);
    std::printf("  fio best (io_uring/libaio/psync) %7.2f   %s\n", fio_best,
                fio_thp ? "(transparent hugepages: always)" : "(fio's buffers without hugepages: see the comment on thp_always)");
    std::printf("  pread loop O_DIRECT              %7.2f\n", data / t_pread_direct);
  }
  std::printf("\ncommand: bench-local %s --max-read %llu --qd %u --staging %llu --repeat %d%s\n", dir.c_str(),
              static_cast<unsigned long long>(max_read), qd, static_cast<unsigned long long>(staging), repeat,
              cold ? "" : " --no-cold");
  return 0;
} catch (const std::exception& e) {
  return sluice_cli::fail(e.what());
}
