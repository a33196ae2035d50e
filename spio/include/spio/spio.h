#ifndef SPIO_SPIO_H_
#define SPIO_SPIO_H_

/// spio's header library but spio/ablation.h (timing switches, included after a kernel's
/// generated header) and spio/thread/bulk_copy.h (sm_90 only); kernels may include just the
/// headers they need instead.

#include "spio/macros.h"
#include "spio/block/pipeline.h"
#include "spio/thread/async_copy.h"
#include "spio/warp/fragments.h"
#include "spio/warp/ldmatrix.h"
#include "spio/warp/mma.h"

#endif  // SPIO_SPIO_H_
