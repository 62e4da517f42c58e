#pragma once
/// \file
/// Umbrella header: core, format, checkpoint, stages, sinks and the io_uring
/// file source (no Beast, no CUDA). Link sluice::sluice.

#include <sluice/checkpoint.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/core/run.hpp>
#include <sluice/memory/staging_pool.hpp>
#include <sluice/core/task.hpp>
#include <sluice/core/uring.hpp>
#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>
#include <sluice/format/writer.hpp>
#include <sluice/load.hpp>
#include <sluice/load_file.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/sink/callback_sink.hpp>
#include <sluice/sink/digest_sink.hpp>
#include <sluice/sink/discard_sink.hpp>
#include <sluice/sink/forwarding_sink.hpp>
#include <sluice/sink/host_sink.hpp>
#include <sluice/source/file_source.hpp>
#include <sluice/stages/pipeline.hpp>
#include <sluice/version.hpp>
