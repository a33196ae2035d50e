#ifndef SPIO_SPIO_H_
#define SPIO_SPIO_H_

/// The whole spio header library; kernels may include just the headers they need instead.

#include "spio/macros.h"
#include "spio/block/pipeline.h"
#include "spio/thread/async_copy.h"
#include "spio/warp/fragments.h"
#include "spio/warp/ldmatrix.h"
#include "spio/warp/mma.h"

#endif  // SPIO_SPIO_H_
