#ifndef SPIO_MACROS_H_
#define SPIO_MACROS_H_

/// Compiler-dependent macros shared by every spio header.
///
/// Three compilers read these headers:
/// - NVRTC (and nvcc): __CUDACC__ is defined; __CUDA_ARCH__ is defined while compiling device code.
/// - The host C++ compiler under the CPU emulator: SPIO_EMULATOR is defined, and the emulator has
///   already defined __device__, __forceinline__, __global__, __shared__ and declared the
///   spio::emu:: primitives before any spio header is included.
/// - A plain host C++ compiler (host-side tests of layouts and index arithmetic).
/// No host standard header is included anywhere: NVRTC has none (no <cstdint>, <cstring>, ...).
/// SPIO_DEVICE, SPIO_HOST_DEVICE, SPIO_UNROLL and SPIO_RESTRICT are only defined when not defined
/// already, so the emulator may predefine them.

/// True (1) while compiling device code for a GPU, 0 on the host and in the emulator.
#if defined(__CUDA_ARCH__)
#define SPIO_DEVICE_CODE 1
#else
#define SPIO_DEVICE_CODE 0
#endif

/// True (1) under NVRTC.
#if defined(__CUDACC_RTC__)
#define SPIO_NVRTC 1
#else
#define SPIO_NVRTC 0
#endif

#if defined(__CUDACC__)

/// A device function that is always inlined.
#ifndef SPIO_DEVICE
#define SPIO_DEVICE __device__ __forceinline__
#endif

/// A function callable from host and device code, always inlined.
#ifndef SPIO_HOST_DEVICE
#define SPIO_HOST_DEVICE __host__ __device__ __forceinline__
#endif

#else  // the emulator's host build, or a plain host compiler

// Device functions become ordinary inline host functions. Plain `inline` (not __device__
// __forceinline__) keeps them independent of how the CUDA keywords are defined on the host, and
// lets the emulator's debug builds step into them.
#ifndef SPIO_DEVICE
#define SPIO_DEVICE inline
#endif
#ifndef SPIO_HOST_DEVICE
#define SPIO_HOST_DEVICE inline
#endif

#endif

/// Ask the compiler to unroll the loop that follows completely.
#ifndef SPIO_UNROLL
#if defined(__CUDACC__)
#define SPIO_UNROLL _Pragma("unroll")
#else
#define SPIO_UNROLL
#endif
#endif

/// A pointer qualifier promising no aliasing.
#ifndef SPIO_RESTRICT
#define SPIO_RESTRICT __restrict__
#endif

/// spio's kernels use cp.async and bf16 mma.sync, which need compute capability 8.0 or newer.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 800)
#error "spio kernels need sm_80 or newer (cp.async, bf16 mma.sync); compile for sm_80/86/89/90"
#endif

#endif  // SPIO_MACROS_H_
