#pragma once
/// \file
/// What a distributed load is asked to do (distributed_options) and what one
/// rank did (distributed_stats).

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>

#include <nlohmann/json.hpp>

#include <sluice/core/cores.hpp>
#include <sluice/load.hpp>
#include <sluice/policy/classify.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/source/any_source.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/distributed/window.hpp>

namespace sluice::inline v0 {

/// Opens the source a distributed load reads through, on the driver's
/// io_context, for this rank's share of the node's I/O (called inside the
/// failure protocol: once for the windows, and once more, sized for a phase
/// in which fewer of the node's ranks read, for the shared tables of a rank
/// that is one of fewer table readers than local ranks).
using source_factory = std::function<std::unique_ptr<any_source>(asio::io_context&, const reader_sizing&)>;

/// Options of a distributed load.
struct distributed_options {
  load_options load;                 ///< per-rank pipeline knobs (staging budget, max_read, queue depth, io, stop)
  policy::plan_options plan;         ///< window size, local size, split threshold
  policy::classify_options classify = policy::classifier::deepseek().options();  ///< tensor classes
  bool placeholders = true;          ///< call the sink with a view_kind::placeholder view for tensors this rank does not own
  /// Whether window w+1 is read while window w's collective runs. Reading
  /// local files and the collective both use CPU (page-cache copies; TCP
  /// copies on loopback or a NIC without offload), so there overlapping pays
  /// only when each local rank has cores to spare: `automatic` overlaps when
  /// this process has at least two hardware threads per local rank (on 2
  /// cores, 8 ranks load twice as fast serially: see bench/README.md,
  /// bench-distributed), or when the storage is remote (a catalog that shares
  /// no page cache: S3), whose reads wait on the network rather than the
  /// cores (4 ranks on 2 cores from an S3 endpoint of 24 MB/s per connection:
  /// 1.3x faster overlapped; from an unthrottled one on the same cores, within
  /// noise).
  enum class overlap_mode : std::uint8_t { automatic, on, off } overlap = overlap_mode::automatic;
  /// Ranks of one node read the bytes they keep of a local file from the
  /// node's page cache themselves instead of receiving them from the rank
  /// that read them (policy::schedule::page_cache; the catalog's sources,
  /// not io_mode::direct). false: every byte travels over the communicator,
  /// within a node as across nodes. Every rank must pass the same.
  bool page_cache = true;
  /// Where the page cache does not carry them (S3, io_mode::direct, a
  /// caller's source, page_cache off), ranks of one node get the bytes they
  /// keep but did not read through the node window: a memory region (a
  /// sealed memfd) every local rank maps, which each reader reads into and
  /// each keeper copies from after the window's status exchange; the windows
  /// then run one at a time. false: over the communicator. Every rank must
  /// pass the same.
  bool node_window = true;
  /// The failure protocol's pace in windows that carry no message (all
  /// their bytes come through the page cache or stay with their readers):
  /// the ranks exchange their status after such windows only once this many
  /// bytes of windows went by without one (and after the last window);
  /// every window with a message, a relay or the node window exchanges it
  /// (policy::window_schedule::status). A rank's failure stops its peers
  /// within that many bytes; a dead peer, at their next window (the
  /// communicator's liveness signal). 0: after every window. Every rank must
  /// pass the same (the schedule's digest covers it).
  std::uint64_t status_every = policy::default_status_every;
  /// A tensor (or row part) of at least this many bytes that this rank keeps
  /// in host memory and gets whole through its own source (its reads, and
  /// its takes of the node's page cache: no message and no node window
  /// carries any of it) is read when the window delivers it, instead of
  /// into the window's buffer with the rest: into the sink's destination
  /// where the sink has one for it (`direct_destination`, a whole tensor:
  /// one `view_kind::placed` view), else in ordered pieces of 8 MiB
  /// (`load.max_read` if smaller), a queue depth at a time, each a view of a
  /// buffer the next pieces reuse once the sink lets go. A rank's window
  /// buffers then never hold such a tensor: without it, a table of 1.66 GB
  /// that every rank keeps (offload `none`) made each rank's window buffer
  /// 1.66 GB, faulted in by 8 ranks at once (bench/README.md, "Every rank its
  /// own tables"). A sink that wants whole tensors (`whole_tensors`) and
  /// views of the page cache (`load.map_above`, which come first) keep the
  /// window path. 0: never. A rank's own choice: ranks may differ.
  std::uint64_t pieces_above = std::uint64_t{64} << 20;
  /// S3 sources only: connections (pool size) of this rank's client. 0: the
  /// S3 config's `max_connections` counts for the node, and each of its
  /// `local_size` ranks gets max(1, max_connections / local_size): ranks on one
  /// node share its NIC (and the server's per-client limits).
  std::size_t connections_per_rank = 0;
  /// Window buffers to reuse (see window_buffers: successive loads, e.g.
  /// weight reloads, skip first touch); null: the load allocates its own.
  std::shared_ptr<window_buffers> buffers;
  /// The name of the node's shared segment: a memfd named
  /// "<segment_name>-rank<r>" (r: the local rank 0 that creates it), as it
  /// appears in /proc/<pid>/maps and descriptor links (never in /dev/shm).
  /// A program running several loads can give each its own, to tell their
  /// segments apart (the failure tests count a load's segments by it).
  std::string segment_name = "sluice-shared";

  /// Whether ranks of one node take the bytes they keep from its page cache
  /// (policy::node_copy::page_cache) rather than receive them: `page_cache`
  /// on, not io_mode::direct, more than one rank per node, and storage whose
  /// reads one process can read again from memory (`storage_shares`: the
  /// catalog's own sources and catalog::shares_page_cache()).
  [[nodiscard]] bool takes_from_page_cache(bool storage_shares, std::size_t local_ranks) const noexcept {
    return page_cache && storage_shares && local_ranks > 1 && load.io != io_mode::direct;
  }
  /// Whether the node's shared tables are views of its page cache instead of
  /// a segment filled by copies: views asked for (`load.map_above`) where the
  /// page cache is the node's copy (takes_from_page_cache). A rank alone on
  /// its node takes nothing from the page cache (it reads all it keeps) but
  /// maps its tables all the same, as one process's views do.
  [[nodiscard]] bool table_views(bool storage_shares, std::size_t local_ranks) const noexcept {
    return load.map_above > 0 && takes_from_page_cache(storage_shares, std::max<std::size_t>(local_ranks, 2));
  }
  /// Whether `overlap` means overlapping with `local_ranks` ranks on this
  /// machine, reading from remote storage or not.
  [[nodiscard]] bool overlaps(std::size_t local_ranks, bool remote = false) const noexcept {
    if (overlap != overlap_mode::automatic) return overlap == overlap_mode::on;
    return remote || cores_to_spare(local_ranks);
  }
};

/// What one rank did (see to_json()).
struct distributed_stats {
  std::size_t rank = 0, world = 1, local_rank = 0;
  std::string topology, offload;
  std::uint64_t tensors = 0;              ///< sink calls (placeholders included)
  std::uint64_t accepted = 0;             ///< calls the sink accepted
  std::uint64_t owned = 0;                ///< tensors this rank owns
  std::uint64_t bytes_kept = 0;           ///< bytes of the tensors it owns, as delivered (its parts of split ones; shared tables not counted)
  std::uint64_t placeholders = 0;         ///< placeholder views delivered
  std::uint64_t shared_views = 0;         ///< shared-segment views delivered
  std::uint64_t bytes_read = 0;           ///< tensor bytes this rank read from storage
  std::uint64_t header_bytes_read = 0;    ///< bytes this rank read from storage to open the checkpoint (index, headers)
  std::uint64_t storage_bytes = 0;        ///< bytes the source delivered (incl. O_DIRECT alignment)
  std::uint64_t requests = 0;             ///< reads (files) or GETs (S3) issued, retries included
  /// The node-local cache (s3::config::cache), this rank's reads: bytes of
  /// blocks served from it, fetched from the remote, fetched again (bad).
  std::uint64_t cache_hit_bytes = 0, cache_fetched_bytes = 0, cache_refetched_bytes = 0;
  std::uint64_t planned_read_bytes = 0;   ///< what the plan gave this rank
  std::vector<std::string> kept_whole;    ///< TP > 1, uneven_tp_keep_whole: tensors kept whole (TP does not divide them)
  std::uint64_t bytes_sent = 0;           ///< bytes this rank contributed to collectives
  std::uint64_t bytes_received = 0;       ///< bytes this rank received by collectives
  /// Bytes of tensors it keeps that another rank of its node read from
  /// storage and this rank then read from the node's page cache itself,
  /// instead of receiving them (local files: policy::schedule::page_cache).
  /// Not in bytes_read or storage_bytes (its reads are in requests).
  std::uint64_t page_cache_bytes = 0;
  /// Of bytes_read: bytes of its share of the node's reads of shared tables
  /// mapped as views of the page cache (load_options::map_above) that it did
  /// not read because the page cache held them already. Not in storage_bytes.
  std::uint64_t resident_bytes = 0;
  /// Bytes of tensors it keeps that it handed out as views of the page
  /// cache, never copied (load_options::map_above; reads and takes alike).
  std::uint64_t mapped_bytes = 0;
  /// Bytes of tensors it keeps that it read as the windows delivered them,
  /// into the sink's destination or in pieces (distributed_options::pieces_above),
  /// not into a window buffer. Counted in bytes_read or page_cache_bytes too.
  std::uint64_t delivered_read_bytes = 0;
  /// Bytes of tensors it keeps that another rank of its node read into the
  /// node window and this rank copied from there (distributed_options::node_window).
  std::uint64_t node_copied_bytes = 0;
  std::uint64_t node_window_bytes = 0;    ///< size of the node window this rank mapped (every parity: two, three when overlapped)
  std::uint64_t messages = 0;             ///< point-to-point messages it posted (sends + receives, coalesced)
  std::uint64_t status_exchanges = 0;     ///< windows after which the ranks exchanged their status (distributed_options::status_every)
  std::uint64_t bytes_uploaded = 0;       ///< device lane: bytes it copied from host to lane memory (its reads, cut parts)
  std::uint64_t device_views = 0;         ///< device lane: tensors (parts) delivered in device memory
  std::uint64_t shared_bytes = 0;         ///< size of the node's shared segment
  std::uint64_t shared_bytes_written = 0; ///< bytes this rank wrote into it
  /// Bytes of it this rank gave back to the system at the end of the load
  /// (its share of the pieces, memory::shared_host::release): where no rank
  /// of the node held a view of the segment after its sink's finish().
  std::uint64_t shared_bytes_released = 0;
  std::uint32_t windows = 0;
  std::uint64_t connections = 0;          ///< S3: connections of this rank's client (0: local files)
  std::uint64_t table_readers = 0;        ///< ranks of this node that read shared-table bytes
  /// The shared tables' reader of this rank (0: it read no table bytes): S3
  /// connections (0: local files) and reads in flight. A rank among fewer
  /// table readers than local ranks gets the node's share of the others
  /// (reader_sizing); cooperative readers keep their own shares.
  std::uint64_t table_connections = 0, table_queue_depth = 0;
  /// Threads that wrote this rank's share of the tables from the page cache
  /// into the segment (one per piece, as far as its hardware threads go; 0:
  /// none written so).
  std::uint64_t table_writers = 0;
  bool overlapped = false;                ///< window reads overlapped the collectives (distributed_options::overlap)
  double seconds = 0, setup_seconds = 0, read_seconds = 0, exchange_seconds = 0, deliver_seconds = 0;
  double table_seconds = 0;  ///< reading shared tables into the segment (included in read_seconds), barrier included
  double release_seconds = 0;  ///< giving its share of the segment back (shared_bytes_released; in `seconds`)
  /// Start-up before `seconds` (the tool-level calls that join the world and
  /// open the checkpoint; 0 where the caller did): joining the world (the
  /// store's rendezvous, every connection), then opening and planning the
  /// checkpoint (rank 0 reads the metadata, the others take it from rank 0).
  double join_seconds = 0, open_seconds = 0;

  [[nodiscard]] nlohmann::json to_json() const {
    return {{"rank", rank}, {"world_size", world}, {"local_rank", local_rank}, {"topology", topology},
            {"offload", offload}, {"tensors", tensors}, {"accepted", accepted}, {"owned", owned}, {"bytes_kept", bytes_kept},
            {"placeholders", placeholders}, {"shared_views", shared_views}, {"bytes_read", bytes_read}, {"header_bytes_read", header_bytes_read},
            {"storage_bytes", storage_bytes}, {"requests", requests}, {"cache", {{"hit_bytes", cache_hit_bytes}, {"fetched_bytes", cache_fetched_bytes}, {"refetched_bytes", cache_refetched_bytes}}}, {"planned_read_bytes", planned_read_bytes}, {"kept_whole", kept_whole}, {"bytes_sent", bytes_sent},
            {"bytes_received", bytes_received}, {"page_cache_bytes", page_cache_bytes}, {"resident_bytes", resident_bytes}, {"mapped_bytes", mapped_bytes}, {"delivered_read_bytes", delivered_read_bytes}, {"node_copied_bytes", node_copied_bytes}, {"node_window_bytes", node_window_bytes}, {"messages", messages}, {"status_exchanges", status_exchanges}, {"bytes_uploaded", bytes_uploaded}, {"device_views", device_views}, {"shared_bytes", shared_bytes},
            {"shared_bytes_written", shared_bytes_written}, {"shared_bytes_released", shared_bytes_released}, {"windows", windows}, {"connections", connections},
            {"table_readers", table_readers}, {"table_connections", table_connections}, {"table_queue_depth", table_queue_depth}, {"table_writers", table_writers},
            {"overlapped", overlapped},
            {"seconds", {{"total", seconds}, {"setup", setup_seconds}, {"read", read_seconds},
                         {"exchange", exchange_seconds}, {"deliver", deliver_seconds}, {"tables", table_seconds}, {"release", release_seconds},
                         {"join", join_seconds}, {"open", open_seconds}}}};
  }
};

}  // namespace sluice::inline v0
