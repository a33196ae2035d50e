#ifndef SPIO_BLOCK_PIPELINE_H_
#define SPIO_BLOCK_PIPELINE_H_

/// Stage bookkeeping for a multi-buffered cp.async pipeline (double buffering with 2 stages).
///
/// A block cycles its tiles through NumStages shared-memory buffers. Every thread runs the same
/// loop and commits exactly one cp.async group per step (an empty one when it has nothing left
/// to load), so the group counts, and hence the wait counts, are the same everywhere:
///
///     spio::AsyncPipeline<2> pipe;
///     for (int s = 0; s < pipe.prefetch; ++s) {           // prologue: tiles 0 .. S-2
///         if (s < num_tiles) load_tile(s, buffer[pipe.write_stage()]);
///         pipe.commit();
///     }
///     for (int i = 0; i < num_tiles; ++i) {
///         const int next = i + pipe.prefetch;
///         if (next < num_tiles) load_tile(next, buffer[pipe.write_stage()]);
///         pipe.commit();
///         pipe.wait_prior();                                // this thread's copies of tile i landed
///         __syncthreads();                                  // ... and every other thread's
///         compute(buffer[pipe.read_stage()]);
///         __syncthreads();                                  // buffer free before it is refilled
///         pipe.advance();
///     }
///
/// load_tile issues cp_async_16 copies. The refill at step i writes the buffer that step i - 1
/// read, which the second __syncthreads() released.

#include "spio/macros.h"
#include "spio/thread/async_copy.h"

namespace spio {

/// The cp.async group operations of a pipeline; a policy so host tests can substitute a model.
struct CpAsyncGroups {
    /// Closes the copies issued since the last commit into a group.
    SPIO_DEVICE static void commit() { cp_async_commit_group(); }

    /// Waits until at most N of the newest groups are pending.
    ///
    /// Parameters:
    ///   N: the number of newest groups that may remain pending.
    template <int N>
    SPIO_DEVICE static void wait() {
        cp_async_wait_group<N>();
    }
};

/// Tracks which buffer a pipeline fills next and which it reads next.
///
/// Parameters:
///   NumStages: number of buffers, at least 2; the pipeline keeps NumStages - 1 tiles in flight.
///   Groups: the group operations (CpAsyncGroups on the GPU and in the emulator).
template <int NumStages, typename Groups = CpAsyncGroups>
class AsyncPipeline {
    static_assert(NumStages >= 2, "AsyncPipeline needs at least 2 stages");

public:
    /// Number of buffers.
    static constexpr int num_stages = NumStages;

    /// Number of tiles loaded before the main loop, and kept in flight during it.
    static constexpr int prefetch = NumStages - 1;

    SPIO_HOST_DEVICE AsyncPipeline() : read_stage_(0), write_stage_(0) {}

    /// Buffer index that the next compute step reads.
    SPIO_HOST_DEVICE int read_stage() const { return read_stage_; }

    /// Buffer index that the next load fills.
    SPIO_HOST_DEVICE int write_stage() const { return write_stage_; }

    /// Commits the copies issued into write_stage() as one group, then moves to the next buffer.
    SPIO_DEVICE void commit() {
        Groups::commit();
        write_stage_ = next_stage(write_stage_);
    }

    /// Waits until this thread's copies into read_stage() have landed.
    ///
    /// Assumes:
    ///   the loop of the file comment, so that the prologue's commits and one commit per step put
    ///   the group of read_stage() exactly NumStages - 1 groups behind the newest one.
    SPIO_DEVICE void wait_prior() { Groups::template wait<NumStages - 1>(); }

    /// Moves read_stage() to the next buffer, after the compute step that read it.
    SPIO_HOST_DEVICE void advance() { read_stage_ = next_stage(read_stage_); }

    /// Returns the buffer after `stage`, cyclically.
    ///
    /// Parameters:
    ///   stage: a buffer index, 0 <= stage < NumStages.
    /// Returns:
    ///   stage + 1, or 0 after the last buffer.
    SPIO_HOST_DEVICE static constexpr int next_stage(int stage) {
        return stage + 1 == NumStages ? 0 : stage + 1;
    }

private:
    int read_stage_;
    int write_stage_;
};

}  // namespace spio

#endif  // SPIO_BLOCK_PIPELINE_H_
