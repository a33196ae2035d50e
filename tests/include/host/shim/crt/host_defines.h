#ifndef SPIO_TESTS_SHIM_CRT_HOST_DEFINES_H_
#define SPIO_TESTS_SHIM_CRT_HOST_DEFINES_H_

/// Stand-in for CUDA's crt/host_defines.h, which the cuda-runtime pip wheel does not ship.
///
/// vector_types.h (pulled in by cuda_fp16.h / cuda_bf16.h) includes it for a few attribute
/// macros. Host tests add this folder with -idirafter, so a full toolkit's header wins.

#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
#ifndef __inline__
#define __inline__ inline
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
#ifndef __builtin_align__
#define __builtin_align__(a) __align__(a)
#endif
#ifndef __device_builtin__
#define __device_builtin__
#endif
#ifndef __cudart_builtin__
#define __cudart_builtin__
#endif
#ifndef CUDARTAPI
#define CUDARTAPI
#endif

#endif  // SPIO_TESTS_SHIM_CRT_HOST_DEFINES_H_
