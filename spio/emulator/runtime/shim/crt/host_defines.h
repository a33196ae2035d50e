#ifndef SPIO_EMU_SHIM_HOST_DEFINES_H_
#define SPIO_EMU_SHIM_HOST_DEFINES_H_

/// Stand-in for the CUDA toolkit's crt/host_defines.h, which NVIDIA's runtime wheel does not ship.
///
/// The CPU emulator compiles kernel sources with the host C++ compiler. cuda_fp16.h, cuda_bf16.h
/// and vector_types.h only need the execution-space and alignment keywords below; on the host they
/// carry no meaning beyond alignment and inlining.

#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
#ifndef __builtin_align__
#define __builtin_align__(n) __attribute__((aligned(n)))
#endif
#ifndef __device_builtin__
#define __device_builtin__
#endif
#ifndef __cudart_builtin__
#define __cudart_builtin__
#endif
#ifndef __thread__
#define __thread__ __thread
#endif
#ifndef CUDARTAPI
#define CUDARTAPI
#endif
#ifndef __specialization_static
#define __specialization_static
#endif

#endif  // SPIO_EMU_SHIM_HOST_DEFINES_H_
