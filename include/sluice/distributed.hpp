#pragma once
/// \file
/// The distributed load: every rank reads only what the plan gives it, and
/// the window's collective delivers the rest.
///
/// 1. Every rank computes the same plan (policy/plan.hpp) from the
///    checkpoint's metadata and checks, with one small all-gather, that its
///    peers did too.
/// 2. Shared tables (offload shared-single / shared-cooperative): local rank 0
///    of each node creates the node's shared segment (memory/shared_host.hpp),
///    the others attach it; each rank reads its planned slices straight into it.
/// 3. Then the windows (plan order) flow through one pipeline,
///    read_window | exchange_window | deliver_window: each rank reads its
///    planned slices through coalesce | fetch | stage | place — the
///    bytes it keeps straight into its part of the window's buffer, what it
///    reads only for others into scratch; one exchange (point-to-point, over
///    the communicator's transport) carries each slice from its reader to the
///    ranks that keep it and to no other (a TP rank gets its part of a split
///    tensor; an expert travels only to its EP replicas; a stage's tensors
///    stay in the stage); finally every rank calls its sink for every tensor
///    of the window, in plan order. With a device lane (comm/device_lane.hpp:
///    comm::nccl_lane), tensors destined for the device are read into pinned
///    host memory, uploaded, exchanged by NCCL between device window buffers,
///    and delivered as `view_kind::device` views; host-destined ones still
///    travel over the host communicator. Double-buffered: window w+1 is read while
///    w's exchange runs on the exchange stage's own long-lived thread (never
///    on the io_context doing the I/O), where the machine has the cores for it
///    (distributed_options::overlap); two window credits bound the memory.
///
/// Every rank's sink sees the same sequence of calls (same names, same
/// order): owners get the bytes (`view_kind::bytes`; under TP > 1 a rank's
/// part of a split tensor, `tensor_view::part` saying which), non-owners a
/// `view_kind::placeholder` view (unless `placeholders` is off; never a probe's
/// `metadata` view, so a recorder does not mistake it for an application), and every
/// local rank a `view_kind::shared` view of a shared table in the segment.
///
/// Where the bytes come from is the catalog's: the driver opens the source of
/// the catalog `ck` was opened by (catalog::open_source: io_uring for local
/// files; with sluice::s3, range GETs at the ETags the catalog pinned,
/// through one connection pool per rank sized so that the ranks of a node
/// share the node's connections, `distributed_options::connections_per_rank`)
/// and reads each batch of planned slices through the core's
/// `slice_reader` (coalesce | fetch | stage | place into their
/// destinations). `load_distributed_with` takes a factory of a source of the
/// caller's instead. The source is opened inside the failure protocol: a
/// rank that cannot set up its I/O fails every rank.
///
/// Failure: after each phase the ranks exchange a status word; a rank that
/// failed (bad shard, S3 error, sink exception) makes every rank throw
/// `distributed_error` naming it and its error. A rank that dies makes the
/// others' next collective throw `comm::comm_error` within the communicator's
/// timeout. Collectives run between pipeline runs, never on the io_context.
///
/// The pieces, one per header under sluice/distributed/: options.hpp
/// (distributed_options, distributed_stats), slice_reader.hpp (the data path,
/// over any catalog's source), peers.hpp (the failure protocol),
/// driver.hpp (load_distributed_with, load_distributed over a communicator),
/// world.hpp (the tool-level calls that join a world), and the window
/// pipeline: window.hpp (layout, messages, buffers, each window's state,
/// status and stats), read_window.hpp | exchange_window.hpp |
/// deliver_window.hpp, stages that own their state and talk only through
/// their channels.

#include <sluice/distributed/driver.hpp>
#include <sluice/distributed/options.hpp>
#include <sluice/distributed/peers.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/world.hpp>
#include <sluice/load_file.hpp>  // the single-process load() beside the distributed one
