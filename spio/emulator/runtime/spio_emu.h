#ifndef SPIO_SPIO_EMU_H_
#define SPIO_SPIO_EMU_H_

/// The CPU emulator's runtime header, force-included (g++ -include) before every kernel source.
///
/// It includes cuda_fp16.h and cuda_bf16.h first (they compile on the host with the shims in
/// runtime/shim), then defines the CUDA keywords and built-ins for the host compiler and declares
/// namespace spio::emu: the PTX primitives of docs/primitives.md, most with the same names and
/// signatures (the tensor copies and bulk waits as docs/primitives.md lists them). One CUDA
/// thread runs as one user-level fiber; warp collectives meet at a warp barrier; __syncthreads
/// is a block barrier; static __shared__ variables are thread_local, so they all live in this
/// library's TLS block, which the runtime treats as the block's shared-memory arena. That arena
/// holds every kernel's static __shared__ variables together: a kernel's launch counts them all
/// against the shared-memory limit, and an index past one kernel's array that lands in
/// another's is not reported. `extern __shared__` arrays are rewritten by the Python build step
/// into references to the dynamic shared-memory buffer.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define SPIO_EMULATOR 1

/// Everything the runtime exports to the kernel translation unit stays inside the library.
#define SPIO_EMU_API __attribute__((visibility("hidden")))
/// Entry points Python looks up with dlsym.
#define SPIO_EMU_EXPORT extern "C" __attribute__((visibility("default")))

/// The build step preprocesses with SPIO_EMU_SCAN to find kernels declared through macros.
#if defined(SPIO_EMU_SCAN)
#define __global__ __spio_emu_global__
#else
#define __global__
#endif
#define __shared__ thread_local
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __grid_constant__

/// Launch configuration passed by Python (ctypes mirror in spio/emulator/module.py).
struct spio_emu_launch {
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t dynamic_shared_bytes;
    const uint64_t *ranges;  ///< [lo, hi) pairs of registered global-memory ranges
    uint32_t num_ranges;
    uint32_t check;  ///< 1: hazard checks on
    uint64_t seed;   ///< thread-order shuffle seed; used when shuffle != 0
    uint32_t shuffle;
    uint32_t dynamic_offset;  ///< bytes the dynamic shared buffer starts past a multiple of 1024
    const char *kernel_name;
};

namespace spio {
namespace emu {
namespace detail {

extern SPIO_EMU_API uint3 g_thread_idx;
extern SPIO_EMU_API uint3 g_block_idx;
extern SPIO_EMU_API dim3 g_block_dim;
extern SPIO_EMU_API dim3 g_grid_dim;

/// Runs every block of a launch; thunk() runs the kernel body for the current fiber.
SPIO_EMU_API int run_launch(const spio_emu_launch *cfg, void (*thunk)());
/// Base of the dynamic shared-memory buffer (extern __shared__).
SPIO_EMU_API char *dynamic_shared_base();

SPIO_EMU_API void syncthreads();
SPIO_EMU_API void syncwarp(unsigned mask);
SPIO_EMU_API uint64_t shfl(unsigned mask, uint64_t value, int mode, int lane_or_delta, int width);
SPIO_EMU_API unsigned ballot(unsigned mask, int predicate);
SPIO_EMU_API unsigned active_mask();
SPIO_EMU_API void atomic_rmw(void *addr, const void *value, void *old, int kind);
SPIO_EMU_API void cp_async_wait(int n);  ///< n < 0: wait_all

enum ShuffleMode { kShflIdx = 0, kShflUp = 1, kShflDown = 2, kShflXor = 3 };
enum AtomicKind { kAddF32, kAddF64, kAddI32, kAddU32, kAddU64, kMaxI32, kMinI32, kExchU32, kCasU32 };

/// The kind code "s<N>" of a struct passed by value: "s" and N (its sizeof) in decimal.
struct KindText {
    char c[24];
};
template <std::size_t N>
constexpr KindText struct_kind_text() {
    KindText t{};
    char digits[21] = {};
    int n = 0;
    std::size_t v = N;
    do {
        digits[n++] = static_cast<char>('0' + v % 10);
        v /= 10;
    } while (v);
    t.c[0] = 's';
    for (int i = 0; i < n; ++i) t.c[1 + i] = digits[n - 1 - i];
    return t;
}
/// One static text per size, built at compile time, so that param_kind can return a pointer to it.
template <std::size_t N>
inline constexpr KindText kStructKind = struct_kind_text<N>();

/// Whether kernel parameter type U is a struct Python passes as bytes: a trivially copyable class
/// (its bytes are all there is to it, as for a GPU's by-value parameters, e.g. spio::TensorMap).
/// It must also be default-constructible, as every parameter type must (Entry::args holds one).
template <class U>
constexpr bool is_byte_struct_v = std::is_class_v<U> && std::is_trivially_copyable_v<U> &&
                                  std::is_default_constructible_v<U>;

/// The kind code of a kernel parameter type, as reported to Python ("p", "i4", "u8", "f4", ...;
/// "s<N>" for a struct of N bytes passed by value, "x" for a type the emulator cannot pass).
template <class T>
constexpr const char *param_kind() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        return "p";
    } else if constexpr (std::is_same_v<U, bool>) {
        return "b";
    } else if constexpr (std::is_enum_v<U>) {
        return param_kind<std::underlying_type_t<U>>();
    } else if constexpr (std::is_integral_v<U>) {
        if constexpr (std::is_signed_v<U>) {
            return sizeof(U) == 1 ? "i1" : sizeof(U) == 2 ? "i2" : sizeof(U) == 4 ? "i4" : "i8";
        } else {
            return sizeof(U) == 1 ? "u1" : sizeof(U) == 2 ? "u2" : sizeof(U) == 4 ? "u4" : "u8";
        }
    } else if constexpr (std::is_same_v<U, float>) {
        return "f4";
    } else if constexpr (std::is_same_v<U, double>) {
        return "f8";
    } else if constexpr (is_byte_struct_v<U>) {
        return kStructKind<sizeof(U)>.c;
    } else {
        return "x";
    }
}

/// Converts one 8-byte argument slot to the parameter type T. For a struct passed by value ("s<N>")
/// the slot is the host address of its N bytes, which Python keeps alive until the launch returns.
template <class T>
T from_slot(uint64_t slot) {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        return reinterpret_cast<U>(static_cast<uintptr_t>(slot));
    } else if constexpr (std::is_same_v<U, float> || std::is_same_v<U, double>) {
        double d;
        std::memcpy(&d, &slot, sizeof d);
        return static_cast<U>(d);
    } else if constexpr (std::is_integral_v<U> || std::is_enum_v<U>) {
        return static_cast<U>(static_cast<int64_t>(slot));
    } else if constexpr (is_byte_struct_v<U>) {
        U value{};
        std::memcpy(static_cast<void *>(&value),
                    reinterpret_cast<const void *>(static_cast<uintptr_t>(slot)), sizeof(U));
        return value;
    } else {
        return U{};
    }
}

template <class F, F kernel>
struct Entry;

/// Launch glue for `extern "C" __global__ void kernel(P...)`: the arguments live in a static of
/// the library (module data, which the hazard checks allow), and every fiber calls the kernel.
template <class... P, void (*kernel)(P...)>
struct Entry<void (*)(P...), kernel> {
    static inline std::tuple<std::decay_t<P>...> args;
    static inline char signature_text[16 * sizeof...(P) + 1];

    static void thunk() { std::apply(kernel, args); }

    template <std::size_t... I>
    static void store(const uint64_t *slots, std::index_sequence<I...>) {
        ((std::get<I>(args) = from_slot<std::decay_t<P>>(slots[I])), ...);
    }

    static int launch(const spio_emu_launch *cfg, const uint64_t *slots, int num_slots) {
        if (num_slots != static_cast<int>(sizeof...(P))) return -2;
        store(slots, std::index_sequence_for<P...>{});
        return run_launch(cfg, &thunk);
    }

    static const char *signature() {
        const char *kinds[] = {param_kind<std::decay_t<P>>()..., ""};
        char *out = signature_text;
        for (std::size_t i = 0; i < sizeof...(P); ++i) {
            if (i) *out++ = ',';
            for (const char *k = kinds[i]; *k;) *out++ = *k++;
        }
        *out = 0;
        return signature_text;
    }
};

}  // namespace detail

/// PTX primitives (docs/primitives.md): same names and signatures as namespace spio, but for the
/// tensor copies and the bulk-group waits (rank and coordinates, a read flag: see there).
SPIO_EMU_API void mma_m16n8k8_f16(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                  const float (&c)[4]);
SPIO_EMU_API void mma_m16n8k8_bf16(float (&d)[4], const unsigned (&a)[2], unsigned b,
                                   const float (&c)[4]);
SPIO_EMU_API void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                   const float (&c)[4]);
SPIO_EMU_API void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4],
                                    const unsigned (&b)[2], const float (&c)[4]);
SPIO_EMU_API void ldmatrix_x1(unsigned (&d)[1], const void *row_ptr);
SPIO_EMU_API void ldmatrix_x2(unsigned (&d)[2], const void *row_ptr);
SPIO_EMU_API void ldmatrix_x4(unsigned (&d)[4], const void *row_ptr);
SPIO_EMU_API void ldmatrix_x1_trans(unsigned (&d)[1], const void *row_ptr);
SPIO_EMU_API void ldmatrix_x2_trans(unsigned (&d)[2], const void *row_ptr);
SPIO_EMU_API void ldmatrix_x4_trans(unsigned (&d)[4], const void *row_ptr);
SPIO_EMU_API void cp_async_16(void *smem_dst, const void *gmem_src, int src_bytes);
SPIO_EMU_API void cp_async_commit_group();
SPIO_EMU_API void cp_async_wait_all();
SPIO_EMU_API void mbarrier_init(unsigned long long *bar, unsigned count);
SPIO_EMU_API void fence_mbarrier_init();
SPIO_EMU_API void fence_proxy_async_shared();
SPIO_EMU_API void mbarrier_arrive_expect_tx(unsigned long long *bar, unsigned bytes);
SPIO_EMU_API void cp_async_bulk_g2s(void *dst, const void *src, unsigned bytes,
                                    unsigned long long *bar);
/// cp.async.bulk.tensor.<rank>d...tile: the box of the tensor map at `map` (the emulator's layout,
/// spio.cuda.tensor_map.TensorMap.emulator_bytes) at element coordinates coords[0..rank), innermost
/// first, to shared `dst`; zeros outside the tensor, all the box's bytes on `bar`'s current phase.
SPIO_EMU_API void cp_async_bulk_tensor_g2s(void *dst, const void *map, int rank, const int *coords,
                                           unsigned long long *bar);
/// cp.async.bulk.tensor.<rank>d.global.shared::cta.tile.bulk_group: the box of the tensor map at
/// `map` at coords[0..rank), innermost first, from shared `src` (laid out as
/// cp_async_bulk_tensor_g2s lands the box, swizzle included) to the tensor, leaving out what lies
/// outside it; joins the calling thread's open bulk group and is copied when a
/// cp_async_bulk_wait_group of that thread retires the group.
SPIO_EMU_API void cp_async_bulk_tensor_s2g(const void *map, int rank, const int *coords,
                                           const void *src);
/// cp.async.bulk.commit_group: closes the calling thread's open bulk group (empty or not).
SPIO_EMU_API void cp_async_bulk_commit_group();
/// cp.async.bulk.wait_group[.read] n: at most n of the calling thread's newest committed bulk
/// groups stay pending; the older ones are copied now (`read` or not: the emulator completes a
/// group's reads and writes together).
SPIO_EMU_API void cp_async_bulk_wait_group(int n, bool read);
SPIO_EMU_API bool mbarrier_try_wait_parity(unsigned long long *bar, unsigned parity);

/// cp.async.wait_group N: at most N of the calling thread's newest committed groups stay pending.
template <int N>
inline void cp_async_wait_group() {
    static_assert(N >= 0, "cp_async_wait_group needs N >= 0");
    detail::cp_async_wait(N);
}

}  // namespace emu
}  // namespace spio

/// CUDA built-in variables (read-only views of the running fiber's coordinates).
#define threadIdx (static_cast<const uint3 &>(::spio::emu::detail::g_thread_idx))
#define blockIdx (static_cast<const uint3 &>(::spio::emu::detail::g_block_idx))
#define blockDim (static_cast<const dim3 &>(::spio::emu::detail::g_block_dim))
#define gridDim (static_cast<const dim3 &>(::spio::emu::detail::g_grid_dim))
#define warpSize 32

/// `extern __shared__ T name[];` after the build step's rewrite.
#define SPIO_EMU_EXTERN_SHARED(T, name)                                                           \
    T(&name)[] = *reinterpret_cast<T(*)[]>(::spio::emu::detail::dynamic_shared_base())

inline void __syncthreads() { ::spio::emu::detail::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::spio::emu::detail::syncwarp(mask); }
inline void __threadfence() {}
inline void __nanosleep(unsigned) {}  // timing only: nothing to emulate
inline unsigned __float_as_uint(float x) {
    unsigned bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits;
}
inline unsigned __activemask() { return ::spio::emu::detail::active_mask(); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return ::spio::emu::detail::ballot(mask, predicate);
}

namespace spio {
namespace emu {
namespace detail {
template <class T>
inline T shfl_as(unsigned mask, T var, int mode, int arg, int width) {
    static_assert(sizeof(T) <= 8, "the emulator's shuffles move at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, static_cast<const void *>(&var), sizeof(T));
    bits = shfl(mask, bits, mode, arg, width);
    T out;
    std::memcpy(static_cast<void *>(&out), &bits, sizeof(T));
    return out;
}
}  // namespace detail
}  // namespace emu
}  // namespace spio

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return ::spio::emu::detail::shfl_as(mask, var, ::spio::emu::detail::kShflIdx, src_lane, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::spio::emu::detail::shfl_as(mask, var, ::spio::emu::detail::kShflUp,
                                        static_cast<int>(delta), width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return ::spio::emu::detail::shfl_as(mask, var, ::spio::emu::detail::kShflDown,
                                        static_cast<int>(delta), width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return ::spio::emu::detail::shfl_as(mask, var, ::spio::emu::detail::kShflXor, lane_mask,
                                        width);
}

/// Atomics run inside the runtime (not instrumented), so they never count as shared-memory races.
#define SPIO_EMU_ATOMIC(name, T, kind)                                                             \
    inline T name(T *address, T value) {                                                          \
        T old;                                                                                     \
        ::spio::emu::detail::atomic_rmw(address, &value, &old, ::spio::emu::detail::kind);        \
        return old;                                                                                \
    }
SPIO_EMU_ATOMIC(atomicAdd, float, kAddF32)
SPIO_EMU_ATOMIC(atomicAdd, double, kAddF64)
SPIO_EMU_ATOMIC(atomicAdd, int, kAddI32)
SPIO_EMU_ATOMIC(atomicAdd, unsigned, kAddU32)
SPIO_EMU_ATOMIC(atomicAdd, unsigned long long, kAddU64)
SPIO_EMU_ATOMIC(atomicMax, int, kMaxI32)
SPIO_EMU_ATOMIC(atomicMin, int, kMinI32)
SPIO_EMU_ATOMIC(atomicExch, unsigned, kExchU32)
#undef SPIO_EMU_ATOMIC
inline unsigned atomicCAS(unsigned *address, unsigned compare, unsigned value) {
    unsigned pair[2] = {compare, value};
    unsigned old;
    ::spio::emu::detail::atomic_rmw(address, pair, &old, ::spio::emu::detail::kCasU32);
    return old;
}

#endif  // SPIO_SPIO_EMU_H_
