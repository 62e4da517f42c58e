// sluice-load's command line (see load_tool.hpp): CLI11, in a unit of its own.

#include "load_tool.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <sluice/core/size.hpp>

#include "common/args.hpp"
#include "common/cli.hpp"

namespace sluice_load {

using namespace sluice;

// Fills `o` from the command line; an exit code when the tool stops there
// (--help, or a usage error already reported on stderr).
std::optional<int> parse(options& o, int argc, char** argv) {
  CLI::App app("sluice-load: load a checkpoint (a directory or one .safetensors file) with a live progress\n"
               "display and a summary.",
               "sluice-load");
  app.get_formatter()->column_width(28);
  std::string staging, max_read, map_above;
  bool direct = false, buffered = false;
  const auto index = [](std::optional<std::size_t>& into) { return [&into](std::size_t v) { into = v; }; };
  app.add_option("SOURCE", o.source,
                 "checkpoint directory, .safetensors file, or s3://bucket/prefix/\n"
                 "(credentials, region and endpoint from AWS_* variables and ~/.aws)");
  app.add_option("--staging", staging, "staging budget (default 4GiB); sizes take KiB/MiB/GiB suffixes")->type_name("SIZE");
  app.add_option("--max-read", max_read, "bytes per read request (default 32MiB)")->type_name("SIZE");
  app.add_option("--map-above", map_above,
                 "hand out tensors of SIZE or more whose bytes are in the page cache (or all, with\n"
                 "--buffered) as views of it instead of copies (default: never); local files")
      ->type_name("SIZE");
  std::string populate;
  app.add_option("--populate-views", populate,
                 "with --map-above: map a view's pages in before it is handed out, where every\n"
                 "one is cached (off: the consumer's first touches map them, less CPU time in\n"
                 "all; default auto: on with at least two hardware threads per local rank)")
      ->type_name("auto|on|off");
  app.add_option("--queue-depth", o.load.queue_depth, "reads in flight (default 4)")->type_name("N");
  app.add_option("--threads", o.load.threads, "io_context threads (default 1)")->type_name("N");
  app.add_flag("--direct", direct, "require O_DIRECT (default: O_DIRECT when aligned)");
  app.add_flag("--buffered", buffered, "always use the page cache");
  app.add_flag_callback("--inline-copies", [&] { o.load.punt_buffered = false; },
                        "copy page-cache hits in the submitting thread, not in io_uring's\n"
                        "io-wq workers (default: workers, so cached reads copy on several cores)");
  app.add_option("--select", o.select, "load only tensors whose name matches (RE2 syntax, searched)")->type_name("REGEX");
  app.add_option("--index", o.index_file,
                 "open SOURCE through this local index instead of its own; the shards it names are\n"
                 "verified against what SOURCE lists (presence, size, ETag) before any tensor is read")
      ->type_name("FILE");
  app.add_flag("--digest", o.digest, "print name, dtype, shape, sha256 per tensor (sorted by name)");
  app.add_flag("--json", o.json, "print the summary as JSON on stdout");
  app.add_option("--json-out", o.json_out, "write the JSON summary to FILE")->type_name("FILE");
  app.add_flag_callback("--no-progress", [&] { o.progress = false; }, "no progress display");
  app.add_option("--topology", o.topology,
                 "act as one rank of a distributed load (rank from --rank/--world-size or\n"
                 "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, SLUICE_STORE_DIR; see sluice-launch)")
      ->type_name("tp1,dp8,ep8");
  app.add_option("--uneven", o.uneven,
                 "error | keep-whole: with --topology, a tensor TP should split but does not divide is\n"
                 "an error naming it (default), or kept whole on every owner and listed in the summary")
      ->type_name("MODE");
  app.add_option("--offload", o.offload, "none | per-rank | shared-single | shared-cooperative (default none)")
      ->type_name("MODE");
  app.add_option("--expert-placement", o.experts,
                 "linear | round_robin: with --topology, which EP rank holds routed expert e: blocks\n"
                 "(e * EP / E, the default) or interleaved (e % EP), as vLLM's --expert-placement-strategy")
      ->type_name("MODE");
  app.add_option("--overlap", o.overlap,
                 "read the next window while this one's collective runs (default auto:\n"
                 "on from S3, or with at least two hardware threads per local rank)")
      ->type_name("auto|on|off");
  app.add_flag("--exchange-all", o.exchange_all,
               "with --topology: send every byte a rank keeps but did not read over the\n"
               "communicator, also between ranks of one node (default: they read local files'\n"
               "bytes from the node's page cache themselves, and copy other bytes from the node\n"
               "window their readers read into)");
  std::string status_every;
  app.add_option("--status-every", status_every,
                 "with --topology: in windows that carry no message (one node's ranks reading\n"
                 "through its page cache), exchange the ranks' status only after this many bytes\n"
                 "of windows (and after the last); a rank's failure stops its peers within them\n"
                 "(default 2GiB; 0: after every window)")
      ->type_name("SIZE");
  std::string window;
  app.add_option("--window", window,
                 "with --topology: bytes of tensors per exchange window (default 256MiB); each\n"
                 "rank's window buffers are sized by its share of the largest window")
      ->type_name("SIZE");
  std::string pieces_above;
  app.add_option("--pieces-above", pieces_above,
                 "with --topology: a tensor of SIZE or more that a rank gets whole through its own\n"
                 "reads (no message carries it) is read as it is delivered, in pieces of 8MiB\n"
                 "(--max-read if smaller), not into a window buffer (default 64MiB; 0: never)")
      ->type_name("SIZE");
  app.add_flag("--keep", o.keep,
               "with --topology: hold every tensor the rank owns until the load ends (its view,\n"
               "or a copy), as an engine holding its weights would: for measuring node memory");
  app.add_option_function<std::size_t>("--rank", index(o.rank), "override RANK")->type_name("N");
  app.add_option_function<std::size_t>("--world-size", index(o.world), "override WORLD_SIZE")->type_name("N");
  app.add_option_function<std::size_t>("--local-rank", index(o.local_rank), "override LOCAL_RANK")->type_name("N");
  app.add_option_function<std::size_t>("--local-world-size", index(o.local_world), "override LOCAL_WORLD_SIZE")
      ->type_name("N");
  app.add_flag("--device", o.device,
               "with --topology: one GPU per rank (device = local rank % visible GPUs, so a\n"
               "rank that sees only its own GPU through CUDA_VISIBLE_DEVICES uses device 0):\n"
               "tensors for the device travel by NCCL (unique id through the store:\n"
               "SLUICE_STORE_DIR or SLUICE_STORE=redis://...) into device memory; offloaded\n"
               "tables stay in host memory; --digest copies everything back (needs the nccl\n"
               "component and a GPU)");
  app.add_option("--connections", o.connections, "s3://: S3 connections (concurrent range GETs) of the node (default 16)")
      ->type_name("N");
  app.add_option("--connections-per-rank", o.connections_per_rank,
                 "s3:// with --topology: connections of each rank's S3 client (default: the\n"
                 "per-node pool size, 16, divided among the node's ranks, LOCAL_WORLD_SIZE)")
      ->type_name("N");
  std::string cache_max;
  app.add_option("--cache", o.cache_dir,
                 "s3://: read through the node-local cache in DIR (made 0700 if missing; one that\n"
                 "is not yours or has group/other bits is refused): blocks it has are read from\n"
                 "local disk and verified, the others fetched once and written (default:\n"
                 "SLUICE_CACHE_DIR, else no cache)")
      ->type_name("DIR");
  app.add_option("--cache-max", cache_max, "with --cache: cap on its size, least recently used blocks evicted (default:\n"
                                           "SLUICE_CACHE_MAX, else none)")
      ->type_name("SIZE");
  app.add_flag("--probe", o.probe, "read headers only: print the per-layer plan (keys, tensors, bytes)");
  app.add_option("--contract-out", o.contract_out, "with --probe: write the load contract (JSON) to FILE")
      ->type_name("FILE");
  if (auto rc = sluice_cli::parse_args(app, argc, argv, 1)) return rc;
  if (!staging.empty()) o.load.staging_budget = sluice_cli::parse_size(staging);
  if (!max_read.empty()) o.load.max_read = sluice_cli::parse_size(max_read);
  if (!cache_max.empty()) o.cache_max = sluice_cli::parse_size(cache_max);
  if (!window.empty()) o.window_bytes = sluice_cli::parse_size(window);
  if (!pieces_above.empty()) o.pieces_above = pieces_above == "0" ? 0 : sluice_cli::parse_size(pieces_above);
  if (!status_every.empty()) o.status_every = status_every == "0" ? 0 : sluice_cli::parse_size(status_every);
  if (!map_above.empty()) o.load.map_above = std::max<std::uint64_t>(1, sluice_cli::parse_size(map_above));
  if (!populate.empty()) o.load.populate_views = sluice_cli::auto_on_off<populate_mode>("--populate-views", populate);
  if (direct && buffered) throw config_error("--direct and --buffered exclude each other");
  if (direct) o.load.io = io_mode::direct;
  if (buffered) o.load.io = io_mode::buffered;
  if (app.count("--connections") && o.connections == 0) throw config_error("--connections must be at least 1");
  if (o.source.empty()) throw config_error("no SOURCE given (see --help)");
  if (!o.contract_out.empty() && !o.probe) throw config_error("--contract-out needs --probe");
  if (o.device && o.topology.empty()) throw config_error("--device needs --topology (it places one rank's tensors on its GPU)");
  return std::nullopt;
}

}  // namespace sluice_load
