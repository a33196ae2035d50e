/// The CPU emulator's runtime: fibers, block and warp barriers, warp collectives (mma.sync,
/// ldmatrix, shuffles), deferred cp.async copies, mbarriers with bulk copies (1-D and tensor),
/// bulk tensor stores completed by bulk groups, and the hazard checks.
///
/// This file is compiled without instrumentation and linked first into every emulator library.
/// In checked libraries the kernel object is compiled with -fsanitize=thread (GCC's or clang's)
/// and calls __tsan_{read,write}* before every memory access; those callbacks (at the end of this
/// file) classify the address (fiber stack, shared arena, registered tensor, library data) and
/// run the race and cp.async checks on shared memory and the race checks on global memory.
///
/// Blocks run one at a time on the calling host thread. Python serialises launches process-wide,
/// whichever library they run (spio/emulator/module.py): this runtime's state is global, and so
/// is the SIGSEGV handler a launch installs (SignalLease).

#include "spio_emu.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

/// The assembly context switch on x86-64; glibc's ucontext elsewhere (or with SPIO_EMU_UCONTEXT).
/// build.py assembles fiber_switch_x86_64.S under the same condition.
#if defined(__x86_64__) && !defined(SPIO_EMU_UCONTEXT)
#define SPIO_EMU_ASM_SWITCH 1
#else
#define SPIO_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

extern "C" {
__attribute__((visibility("hidden"))) void spio_emu_switch(void **save_sp, void *resume_sp);
__attribute__((visibility("hidden"))) void spio_emu_fiber_start();
}

namespace spio {
namespace emu {
namespace detail {

uint3 g_thread_idx;
uint3 g_block_idx;
dim3 g_block_dim;
dim3 g_grid_dim;

/// Opening guard of the static shared-memory arena (see emu_tls_end.cc). The guards are
/// `__thread`, not `thread_local`: clang reaches an `extern thread_local` through a TLS wrapper
/// function, which the link of a shared library cannot resolve for a hidden symbol.
__attribute__((visibility("hidden"), aligned(16))) __thread char g_tls_arena_begin[64];
extern __attribute__((visibility("hidden"))) __thread char g_tls_arena_end[64];

namespace {

constexpr int kMaxThreads = 1024;
/// A fiber stack holds 512 KiB of local memory, the most a GPU thread has, and the runtime's
/// frames. The guard below it is as large (it costs only address space): a frame that overflows
/// the stack by less than a stack faults in the guard rather than writing into another fiber's.
constexpr std::size_t kStackBytes = 640 * 1024;
constexpr std::size_t kGuardBytes = kStackBytes;
constexpr std::size_t kMaxDynamicShared = 227 * 1024;
/// The dynamic shared-memory buffer's alignment: 1024 bytes, the largest swizzle repeat (8 spans
/// of 128 bytes), so that kernels that align a buffer to it get the GPU's tensor-copy swizzle
/// pattern. A GPU promises the buffer only 16-byte alignment: a launch's dynamic_offset (a
/// multiple of 16 below kDynAlign) starts it that far past the boundary, to test kernels that
/// align their buffers themselves.
constexpr std::size_t kDynAlign = 1024;
/// The guard zones on either side of the dynamic buffer, whatever its offset: an access into
/// them is reported as out of bounds of shared memory (they cost only address space).
constexpr std::size_t kDynGuard = 64 * 1024;
constexpr uint16_t kMany = 0xffff;
/// Shadow::bulk of the bytes of an initialised mbarrier, which only the mbarrier operations may
/// touch (on a GPU a plain store or a copy landing there corrupts the barrier's state).
constexpr uint16_t kBarrierBytes = 0xffff;
constexpr uint16_t kTidMask = 0x7ff;
constexpr uint16_t kGlobalMany = 0x7ff;
constexpr uint16_t kWarpMany = 0x400;
constexpr uint16_t kOtherBlocks = 0x8000;
constexpr unsigned kGChunkBits = 16;

enum class State { kRunnable, kBlockWait, kWarpWait, kDone };
enum class Op { kNone, kSyncwarp, kShfl, kBallot, kMma, kLdmatrix };

struct PendingCopy {
    char *dst;
    const char *src;
    int bytes;
    uint64_t group;
};

/// A bulk copy (cp.async.bulk), or one contiguous piece of a tensor copy, waiting to land: it lands
/// when a thread waits on its mbarrier after the phase's last arrival, the latest moment the
/// hardware may complete it. A null `src` lands `bytes` zeros (a tensor copy's box outside the
/// tensor); `via` names the copy's instruction for messages.
struct BulkCopy {
    char *dst;
    const char *src;
    unsigned bytes;
    const char *via;
};

/// A bulk tensor store (cp_async_bulk_tensor_s2g) waiting for a bulk wait_group of its thread:
/// the box it reads, `bytes` at shared `src`; its pieces (global `dst`, shared `src`: the runs of
/// the box inside the tensor, at most a 16-byte chunk each when swizzled), whose global bytes lie
/// in [lo, hi); its bulk group (Fiber::bulk_committed when it was issued). It copies when a wait
/// retires its group, the latest moment the hardware may read its source and write the tensor.
struct BulkStore {
    const char *src;
    std::size_t bytes;
    std::vector<BulkCopy> pieces;
    uintptr_t lo, hi;
    uint64_t group;
    const char *via;
};

/// The shared box [lo, hi) that a bulk tensor store in flight, issued by thread `tid`, reads.
struct StoreSource {
    uintptr_t lo, hi;
    int tid;
    const char *via;
};

/// An mbarrier: arrivals still expected in the current phase, bytes announced and not yet
/// landed (tx), the current phase's parity, and the phase's bulk copies. `completed` counts the
/// phases completed since mbarrier_init; seen[tid] is how many of them thread tid has seen
/// complete (a wait that returned true), which decides whether it may touch their data.
/// init_tid: the thread whose mbarrier_init made it; fenced: whether that thread has since run
/// a fence that makes the init visible to the copy engine (the async proxy): fence_mbarrier_init
/// or fence_proxy_async_shared (the CUDA Programming Guide's TMA examples use the latter).
/// init_epoch, init_wep: the barrier interval and warp sync generation of the init (checked
/// runs): another thread's use must be ordered after it (a __syncthreads, or a __syncwarp of
/// its warp), as any read of what one thread wrote.
struct MBarrier {
    unsigned expected = 0;
    unsigned pending = 0;
    long long tx = 0;
    unsigned phase = 0;
    std::vector<BulkCopy> copies;
    uint32_t completed = 0;
    std::vector<uint32_t> seen;
    int init_tid = -1;
    bool fenced = false;
    uint32_t init_epoch = 0, init_wep = 0;
};

/// Bulk copies that landed in the running block: the mbarrier, and how many of its phases had
/// completed before the one they completed with (MBarrier::completed then; phase numbers count
/// from 0 since mbarrier_init, unlike MBarrier::phase, the current phase's parity). Shadow::bulk
/// names one of these while the landed bytes are the last write of their epoch.
struct Landing {
    const MBarrier *bar;
    uintptr_t bar_addr;
    uint32_t completed;
};

struct Fiber {
    void *sp = nullptr;
#if !SPIO_EMU_ASM_SWITCH
    ucontext_t uc;
#endif
    char *stack_lo = nullptr;
    char *stack_hi = nullptr;
    uint3 idx{};
    int tid = 0;
    int warp = 0;
    int lane = 0;
    State state = State::kDone;
    uint64_t committed = 0;
    std::vector<PendingCopy> pending;
    uint64_t bulk_committed = 0;    ///< bulk groups committed (cp_async_bulk_commit_group)
    std::vector<BulkStore> stores;  ///< in issue order, so in group order
    uint32_t proxy_fences = 0;      ///< fence_proxy_async_shared calls in this block (checked)
    uint32_t fence_epoch = 0;       ///< the epoch of its last one (0: none in this block)
};

/// One warp collective in progress: the lanes it waits for (its mask), those that have arrived.
/// Lanes of a diverged warp may run collectives on disjoint masks at the same time.
struct Group {
    uint32_t expected = 0;
    uint32_t arrived = 0;
    Op op = Op::kNone;
    int sub = 0;  ///< op detail: mma kind, ldmatrix count/trans, shuffle mode
};

/// A warp: its lanes, its collectives in progress, the lanes' deposits and results (indexed by
/// lane: a lane is in one collective at a time, and reads its result before it joins the next),
/// and which lanes each __syncwarp ordered: synced[a][b] is the sync generation (sync_gen) of
/// the last __syncwarp that lanes a and b both took part in.
struct Warp {
    uint32_t existing = 0;  ///< lanes that exist (the last warp may be partial)
    uint32_t exited = 0;
    uint32_t active = 0;  ///< groups[i] is in progress when bit i is set
    Group groups[32];
    uint32_t sync_gen = 0;
    uint32_t synced[32][32] = {};
    uint32_t in[32][10];
    int arg[32];
    int arg2[32];
    const void *ptr[32];
    uint64_t val[32];
    uint32_t out[32][4];
};

/// Accesses to a shared-memory byte that need no order among themselves (plain reads, or
/// atomics), in the last epoch with such accesses: the epoch, their threads (kMany for several,
/// with warp and lanes when they were all in one warp) and the latest one's warp sync generation.
struct Accesses {
    uint32_t epoch, wep, lanes;
    uint16_t tid, warp;
};

/// Race-detection state of one shared-memory byte: the last write (epoch, thread, its warp's
/// sync generation, and the writer's count of async-proxy fences then) and the reads. `bulk` is
/// 1 + an index into Runtime::landings when the last write is a bulk copy landing (of this
/// epoch: earlier ones are not looked up), async_tid 1 + the thread whose async copy to the byte
/// is still in flight. The atomics' records live apart (Runtime::atomics): every checked access
/// reads and writes this record, and few kernels make shared-memory atomics (32 bytes, not 48;
/// with the global records' split, checked launches of FProp went from ~12% slower than before
/// atomics were checked to ~6%).
struct Shadow {
    uint32_t w_epoch, w_wep;
    uint16_t bulk;      ///< or kBarrierBytes: one of the 8 bytes of an initialised mbarrier
    uint16_t w_fences;  ///< the writer's Fiber::proxy_fences at the write (its low 16 bits)
    uint16_t w_tid, async_tid;
    Accesses r;
};

/// One access to a byte of global memory: the epoch (0: none), the thread (kMany: several
/// threads of the block in that epoch; kWarpMany | w: several lanes of warp w), and the low 16
/// bits of the thread's warp sync generation. kOtherBlocks: blocks other than the epoch's block
/// made such accesses too.
struct GAccess {
    uint32_t epoch;
    uint16_t tid;
    uint16_t wep;
};

/// Loads or atomics, which several threads may make in one epoch: their record and, when it
/// stands for several lanes of one warp (kWarpMany | w), which lanes (a __syncwarp may order some
/// lanes of a warp and not others).
struct GAccesses {
    GAccess x;
    uint32_t lanes;
};

/// Race-detection state of one byte of global memory (a registered tensor) in a checked launch:
/// the last plain store and the plain loads since it. The atomics since it are recorded apart
/// (GRange::atomic_chunks), in the chunks a kernel makes atomics in: 20 bytes a byte rather
/// than 32, read and written at every checked access (see Shadow).
struct GShadow {
    GAccess store;
    GAccesses load;
};

/// Shadow of a merged run of registered global ranges, in chunks allocated on first touch: the
/// GShadow records, and the atomics' records of the chunks that atomics touched. `reading`
/// counts the async copies in flight (issued, not completed) whose source lies in it, `writing`
/// the pieces of bulk tensor stores in flight whose destination does.
struct GRange {
    uintptr_t lo, hi;
    std::vector<std::vector<GShadow>> chunks;
    std::vector<std::vector<GAccesses>> atomic_chunks;
    uint32_t reading = 0;
    uint32_t writing = 0;
};

struct Runtime {
    // Launch
    const spio_emu_launch *cfg = nullptr;
    void (*thunk)() = nullptr;
    bool check = false;
    int nthreads = 0;
    int nwarps = 0;
    // Fibers
    char *stacks = nullptr;
    int mapped_stacks = 0;
    Fiber fibers[kMaxThreads];
    Warp warps[kMaxThreads / 32];
    Fiber *cur = nullptr;
    uintptr_t overflow = 0;  ///< where the running fiber faulted in its stack's guard (on_segv)
    void *sched_sp = nullptr;
#if !SPIO_EMU_ASM_SWITCH
    ucontext_t sched_uc;
#endif
    int done = 0;
    int block_arrived = 0;
    bool failed = false;
    std::string error;
    std::mt19937_64 rng;
    // Arena
    char *s_lo = nullptr, *s_hi = nullptr;  ///< static shared variables (TLS between the guards)
    char *s_guard_lo = nullptr, *s_guard_hi = nullptr;
    char *d_lo = nullptr;  ///< dynamic shared memory
    std::size_t d_size = 0;
    std::vector<Shadow> shadow;
    uint32_t epoch = 0;
    // Shared-memory atomics: their records, per byte of the arena as `shadow` (sized at a launch's
    // first shared atomic), and the last epoch that made one (0: none yet in this launch). Only
    // the running epoch's atomics can race with a plain access (a __syncthreads orders the
    // others), so plain accesses look here only in an epoch that made atomics.
    std::vector<Accesses> atomics;
    uint32_t atomic_epoch = 0;
    // Global memory: first epoch of the running block; first epoch and index of every block so far
    uint32_t block_epoch0 = 0;
    std::vector<std::pair<uint32_t, uint3>> block_starts;
    std::vector<GRange> granges;
    std::vector<Landing> landings;
    // mbarriers of the running block, by shared address; failed waits in a row with no fiber
    // doing anything else in between (a fiber that yields elsewhere, or an mbarrier operation,
    // resets the count); whether the running fiber yielded at a failed wait
    std::map<uintptr_t, MBarrier> mbarriers;
    uint64_t mbarrier_spins = 0;
    bool spun = false;
    // Checked: the shared boxes of the running block's bulk tensor stores in flight. A write to
    // them fails; shadow_access looks here only while there are some (the per-byte Shadow stays
    // as small as it is).
    std::vector<StoreSource> store_sources;
    // Library segments (constants, statics)
    std::vector<std::pair<uintptr_t, uintptr_t>> segments;
};

Runtime g_rt;
/// The dynamic shared-memory buffer between its guard zones: a mapping of its own, made at the
/// first launch (page-aligned, so kDynAlign-aligned), outside the library's segments, so that an
/// access past its guards is not taken for one of the library's data (a static array beside the
/// runtime's objects left their alignment padding unreported).
constexpr std::size_t kDynBytes = kDynGuard + kDynAlign + kMaxDynamicShared + kDynGuard;
char *g_dynamic = nullptr;
/// The alternate signal stack of on_segv: a fiber that overflows its stack has none left to run
/// a handler on. (Launches are serialised, so one per library will do.)
alignas(16) char g_signal_stack[64 * 1024];
/// The SIGSEGV action the running launch found (and puts back at its end); never on_segv itself.
struct sigaction g_old_segv;

std::string format(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

std::string who(const Fiber *f) {
    std::string s = format("kernel %s, block (%u,%u,%u)",
                           g_rt.cfg && g_rt.cfg->kernel_name ? g_rt.cfg->kernel_name : "?",
                           g_block_idx.x, g_block_idx.y, g_block_idx.z);
    if (f) s += format(", thread (%u,%u,%u)", f->idx.x, f->idx.y, f->idx.z);
    return s;
}

void switch_to_scheduler(Fiber *f) {
#if SPIO_EMU_ASM_SWITCH
    spio_emu_switch(&f->sp, g_rt.sched_sp);
#else
    swapcontext(&f->uc, &g_rt.sched_uc);
#endif
}

/// Reports a hazard for fiber `f` and abandons the launch (never returns inside a fiber).
[[noreturn]] void fail(const Fiber *f, const std::string &what) {
    if (!g_rt.failed) {
        g_rt.failed = true;
        g_rt.error = who(f) + ": " + what;
    }
    Fiber *self = g_rt.cur;
    if (self) {
        self->state = State::kDone;
        switch_to_scheduler(self);
    }
    std::fprintf(stderr, "spio emulator: %s\n", g_rt.error.c_str());
    std::abort();
}

/// Parks the running fiber until the scheduler resumes it.
void block_current(State st) {
    Fiber *f = g_rt.cur;
    f->state = st;
    switch_to_scheduler(f);
    g_thread_idx = f->idx;
}

// ---------------------------------------------------------------------------------------------
// Address classification
// ---------------------------------------------------------------------------------------------

int find_segments(struct dl_phdr_info *info, size_t, void *data) {
    auto *base = static_cast<uintptr_t *>(data);
    if (info->dlpi_addr != base[0]) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const auto &ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD) {
            uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
            g_rt.segments.push_back({lo, lo + ph.p_memsz});
        }
    }
    return 1;
}

void init_segments() {
    if (!g_rt.segments.empty()) return;
    Dl_info info;
    if (dladdr(reinterpret_cast<void *>(&init_segments), &info) && info.dli_fbase) {
        uintptr_t base[1] = {reinterpret_cast<uintptr_t>(info.dli_fbase)};
        dl_iterate_phdr(find_segments, base);
    }
}

/// 0: static arena, 1: dynamic arena, -1: inside an arena's guard (out of bounds), -2: not shared.
int shared_region(uintptr_t a, std::size_t n, std::size_t *offset) {
    auto lo = reinterpret_cast<uintptr_t>(g_rt.s_lo), hi = reinterpret_cast<uintptr_t>(g_rt.s_hi);
    if (a >= lo && a + n <= hi) {
        *offset = a - lo;
        return 0;
    }
    auto dlo = reinterpret_cast<uintptr_t>(g_rt.d_lo);
    if (a >= dlo && a + n <= dlo + g_rt.d_size) {
        *offset = (hi - lo) + (a - dlo);
        return 1;
    }
    auto glo = reinterpret_cast<uintptr_t>(g_rt.s_guard_lo);
    auto ghi = reinterpret_cast<uintptr_t>(g_rt.s_guard_hi);
    if (a + n > glo && a < ghi) return -1;
    auto dg = reinterpret_cast<uintptr_t>(g_dynamic);
    if (a + n > dg && a < dg + kDynBytes) return -1;
    return -2;
}

bool in_global(uintptr_t a, std::size_t n) {
    const spio_emu_launch *cfg = g_rt.cfg;
    for (uint32_t i = 0; i < cfg->num_ranges; ++i) {
        if (a >= cfg->ranges[2 * i] && a + n <= cfg->ranges[2 * i + 1]) return true;
    }
    return false;
}

/// The name of the runtime's own object that [a, a + n) touches, or null. Those lie in the
/// library's segments beside the kernel's constants and __device__ variables, which kernels may
/// touch: a kernel's access landing in one is an index far out of bounds (it would corrupt the
/// runtime: a write into g_rt had ended the process with SIGSEGV).
const char *runtime_object(uintptr_t a, std::size_t n) {
    struct Object {
        const void *p;
        std::size_t size;
        const char *name;
    };
    const Object objects[] = {
        {&g_rt, sizeof g_rt, "state"},
        {g_signal_stack, sizeof g_signal_stack, "signal stack"},
        {&g_old_segv, sizeof g_old_segv, "signal handler record"},
    };  // (not g_thread_idx and its kin: kernels read them as threadIdx, blockIdx, ...)
    for (const Object &o : objects) {
        auto lo = reinterpret_cast<uintptr_t>(o.p);
        if (a + n > lo && a < lo + o.size) return o.name;
    }
    return nullptr;
}

bool in_library(uintptr_t a, std::size_t n) {
    for (const auto &seg : g_rt.segments) {
        if (a >= seg.first && a + n <= seg.second) return true;
    }
    return false;
}

const char *verb(bool write) { return write ? "writes" : "reads"; }

std::string thread_name(int tid) {
    const Fiber &f = g_rt.fibers[tid];
    return format("thread (%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z);
}

/// True when lanes `lane` and `other` of warp `w` have both taken part in a __syncwarp since the
/// warp's sync generation `gen`.
bool lanes_synced(const Warp &w, int lane, int other, uint32_t gen) {
    return w.synced[lane][other] > gen;
}

/// The action of an access for messages: "reads", "writes", or "<via> writes" for an async copy.
std::string action(bool write, const char *via) {
    return via ? format("%s writes", via) : std::string(verb(write));
}

/// Whether accesses `x` (in the current epoch) are ordered before an access by fiber `f`: they
/// are its own, or all by lanes of its warp that have since taken part in a __syncwarp with it.
bool ordered(const Accesses &x, const Fiber *f) {
    if (x.tid == f->tid) return true;
    if (x.warp != f->warp) return false;
    const Warp &w = g_rt.warps[f->warp];
    for (uint32_t m = x.lanes & ~(1u << f->lane); m; m &= m - 1) {
        if (!lanes_synced(w, f->lane, __builtin_ctz(m), x.wep)) return false;
    }
    return true;
}

/// Adds an access by fiber `f` (in epoch `e`, at its warp's sync generation `gen`) to `x`.
void add_access(Accesses &x, const Fiber *f, uint32_t e, uint32_t gen) {
    const auto tid = static_cast<uint16_t>(f->tid), warp = static_cast<uint16_t>(f->warp);
    if (x.epoch != e || ordered(x, f)) {
        // A new epoch, or every access recorded is ordered before this one (by program order or
        // a __syncwarp): this one stands for them, so a later conflicting access need only be
        // ordered after it. (Merging would date the earlier accesses at this one's sync
        // generation, and a lane that re-reads after a __syncwarp would fail its writer.)
        x = Accesses{e, gen, 1u << f->lane, tid, warp};
        return;
    }
    if (x.tid != tid) x.tid = kMany;
    if (x.warp != warp) {
        x.warp = kMany;
    } else {
        x.lanes |= 1u << f->lane;
    }
    x.wep = gen;
}

/// Who made accesses `x`, for messages.
std::string accessors(const Accesses &x) {
    return x.tid == kMany ? std::string("other threads") : thread_name(x.tid);
}

/// Fails unless fiber `f` has seen complete the mbarrier phase whose bulk copy wrote the shared
/// byte at `addr` in the current epoch (data a bulk copy lands is visible to the threads that
/// waited on its phase, and to the others after a __syncthreads).
void check_landed(const Fiber *f, const Shadow &s, uintptr_t addr, bool write, const char *via) {
    const Landing &l = g_rt.landings[s.bulk - 1];
    const std::vector<uint32_t> &seen = l.bar->seen;
    if (static_cast<std::size_t>(f->tid) < seen.size() && seen[f->tid] > l.completed) return;
    fail(f, format("%s shared address %#lx, which a bulk copy completing phase %u of the mbarrier "
                   "at %#lx wrote, without a wait of its own on that phase (or a __syncthreads() "
                   "after a thread that waited)",
                   action(write, via).c_str(), static_cast<unsigned long>(addr), l.completed,
                   static_cast<unsigned long>(l.bar_addr)));
}

/// Race, cp.async and bulk-copy checks for `n` shared bytes at arena offset `off`, accessed by
/// fiber `f`. `via` names an async copy being issued: its write is checked against the epoch's
/// accesses by other threads now, and entered in the shadow when the copy completes. `atomic`:
/// an atomic read-modify-write (write is true), which needs no order with other atomics but
/// races with unordered plain accesses, as in global memory. A read of a byte of dynamic shared
/// memory no thread of the block has written (nor a copy landed in) fails, unless `unset_ok` (a
/// bulk store's box, whose bytes past the tensor's edge the copy leaves out). Not of the static
/// arena: it is the library's TLS block, which also holds the compiler's guard bytes of
/// thread_local variables with constructors (an `__half` array's), read and never written here.
void shadow_access(const Fiber *f, uintptr_t addr, std::size_t off, std::size_t n, bool write,
                   const char *via = nullptr, bool atomic = false, bool unset_ok = false) {
    const uint16_t tid = static_cast<uint16_t>(f->tid);
    const uint16_t warp = static_cast<uint16_t>(f->warp);
    const Warp &w = g_rt.warps[f->warp];
    const uint32_t gen = w.sync_gen;
    const uint32_t e = g_rt.epoch;
    if (atomic) {
        if (g_rt.atomics.empty()) g_rt.atomics.assign(g_rt.shadow.size(), Accesses{});
        g_rt.atomic_epoch = e;
    }
    // Whether this epoch made shared atomics, which a plain access must be ordered after.
    const bool after_atomics = !atomic && g_rt.atomic_epoch == e;
    // Arena offsets from here on are dynamic shared memory's (shared_region).
    const std::size_t static_bytes = static_cast<std::size_t>(g_rt.s_hi - g_rt.s_lo);
    // The access, for messages (built only when one fails).
    const auto act = [&] { return atomic ? std::string("atomically updates") : action(write, via); };
    if (write && !g_rt.store_sources.empty()) {
        for (const StoreSource &src : g_rt.store_sources) {
            if (src.lo < addr + n && addr < src.hi) {
                fail(f, format("%s shared address %#lx, which a bulk tensor store (%s) issued by "
                               "%s still reads: that thread must cp_async_bulk_wait_group_read "
                               "for the store first (then a __syncthreads() before other threads "
                               "write)",
                               act().c_str(), static_cast<unsigned long>(std::max(src.lo, addr)),
                               src.via, thread_name(src.tid).c_str()));
            }
        }
    }
    for (std::size_t i = 0; i < n; ++i) {
        Shadow &s = g_rt.shadow[off + i];
        if (s.bulk == kBarrierBytes) {
            fail(f, format("%s shared address %#lx, a byte of an mbarrier (mbarrier_init made it "
                           "one): only the mbarrier operations may touch its 8 bytes",
                           act().c_str(), static_cast<unsigned long>(addr + i)));
        }
        if (s.async_tid) {
            fail(f, format("%s shared address %#lx, the destination of an async copy (cp.async "
                           "or bulk) issued by %s, before a cp_async_wait_group/cp_async_wait_all "
                           "or mbarrier wait covering it (stale data)",
                           atomic ? "atomically updates" : verb(write),
                           static_cast<unsigned long>(addr + i),
                           thread_name(s.async_tid - 1).c_str()));
        }
        if (s.w_epoch == e) {
            if (s.bulk) {
                check_landed(f, s, addr + i, write, via);
            } else if (s.w_tid != tid &&
                       !(s.w_tid / 32 == warp && lanes_synced(w, f->lane, s.w_tid % 32, s.w_wep))) {
                fail(f, format("shared-memory race: %s address %#lx, which %s wrote with no "
                               "__syncthreads() in between",
                               act().c_str(), static_cast<unsigned long>(addr + i),
                               thread_name(s.w_tid).c_str()));
            }
        }
        if (after_atomics) {
            const Accesses &a = g_rt.atomics[off + i];
            if (a.epoch == e && !ordered(a, f)) {
                fail(f, format("shared-memory race: %s address %#lx, which %s updated "
                               "atomically with no __syncthreads() in between (atomics may "
                               "share bytes only with atomics)",
                               act().c_str(), static_cast<unsigned long>(addr + i),
                               accessors(a).c_str()));
            }
        }
        if (write) {
            if (s.r.epoch == e && !ordered(s.r, f)) {
                fail(f, format("shared-memory race: %s address %#lx, which %s read with no "
                               "__syncthreads() in between",
                               act().c_str(), static_cast<unsigned long>(addr + i),
                               accessors(s.r).c_str()));
            }
            if (via) continue;
            if (atomic) {
                add_access(g_rt.atomics[off + i], f, e, gen);
                continue;
            }
            s.w_epoch = e;
            s.w_tid = tid;
            s.w_wep = gen;
            s.w_fences = static_cast<uint16_t>(f->proxy_fences);
            s.bulk = 0;
        } else {
            // Shared memory starts each block as 0xff bytes: a read of one never written (a
            // halo not zero-filled, a buffer read before its first fill) reads that poison, which
            // a max() or an integer use can hide from a comparison of the results.
            if (!unset_ok && s.w_epoch < g_rt.block_epoch0 && s.bulk != kBarrierBytes &&
                off + i >= static_bytes) {
                fail(f, format("%s shared address %#lx (offset %zu of the block's shared memory), "
                               "which no thread of this block has written nor a copy filled "
                               "(uninitialised shared memory; or a write still to come, with no "
                               "__syncthreads() before this read)",
                               act().c_str(), static_cast<unsigned long>(addr + i), off + i));
            }
            add_access(s.r, f, e, gen);
        }
    }
}

/// Whether shared byte record `s` holds a write by a thread of this block through the generic
/// proxy (a plain store, or its cp.async landing; not a bulk landing) that its writer has not
/// called fence_proxy_async_shared() since.
bool unfenced_write(const Shadow &s) {
    return s.w_epoch >= g_rt.block_epoch0 && !s.bulk &&
           s.w_fences == static_cast<uint16_t>(g_rt.fibers[s.w_tid].proxy_fences);
}

/// Fails where a byte of the `n` shared bytes at arena offset `off` that a bulk store issued by
/// `f` reads holds an unfenced_write: the copy reads through the async proxy, which may not see
/// that write.
void check_fenced(const Fiber *f, uintptr_t addr, std::size_t off, std::size_t n,
                  const char *via) {
    for (std::size_t i = 0; i < n; ++i) {
        const Shadow &s = g_rt.shadow[off + i];
        if (unfenced_write(s)) {
            fail(f, format("%s issued by %s reads shared address %#lx, which %s wrote with no "
                           "fence_proxy_async_shared() after: the copy reads through the async "
                           "proxy, which may not see the write (each writer fences its writes, "
                           "then a __syncthreads() before the copy)",
                           via, thread_name(f->tid).c_str(), static_cast<unsigned long>(addr + i),
                           thread_name(s.w_tid).c_str()));
        }
    }
}

/// Fails where a byte of the `n` shared bytes at arena offset `off` that an async copy issued
/// by `f` will write (`via`) was last accessed by this block's threads through the generic proxy
/// with no fence_proxy_async_shared() after, as spio/thread/bulk_copy.h has it: a plain write
/// whose writer has not fenced since, unless `f` fenced in a later epoch; plain reads, unless
/// `f` fenced in a later epoch (after the barrier that ends theirs) or, the only reader, in
/// theirs. The copy writes through the async proxy, which such accesses are not ordered with.
void check_refill_fenced(const Fiber *f, uintptr_t addr, std::size_t off, std::size_t n,
                         const char *via) {
    const uint32_t first = g_rt.block_epoch0, fenced = f->fence_epoch;
    for (std::size_t i = 0; i < n; ++i) {
        const Shadow &s = g_rt.shadow[off + i];
        const char *what = nullptr;
        int tid = 0;
        if (unfenced_write(s) && fenced <= s.w_epoch) {
            what = "wrote", tid = s.w_tid;
        } else if (s.r.epoch >= first && fenced <= s.r.epoch &&
                   !(fenced == s.r.epoch && s.r.tid == f->tid)) {
            what = "read", tid = s.r.tid;
        }
        if (what) {
            fail(f, format("%s issued by %s writes shared address %#lx, which %s %s with no "
                           "fence_proxy_async_shared() after: the copy writes through the async "
                           "proxy, unordered with that access (the issuing thread fences after the "
                           "barrier that follows the reads; a writer may fence its own writes)",
                           via, thread_name(f->tid).c_str(), static_cast<unsigned long>(addr + i),
                           tid == kMany ? "threads" : thread_name(tid).c_str(), what));
        }
    }
}

// Global memory. Blocks run one after another, so every epoch of a block comes after those of
// the blocks before it: an access recorded with an epoch below block_epoch0 is another block's.
// Two blocks' accesses to a byte race unless both are loads or both are atomics; two threads of
// a block race as in shared memory.

enum class GKind { kLoad, kStore, kAtomic };

/// The merged global range holding address `a`, or null.
GRange *grange_of(uintptr_t a) {
    for (GRange &r : g_rt.granges) {
        if (a >= r.lo && a < r.hi) return &r;
    }
    return nullptr;
}

/// The shadow of global byte `a` of range `r` (its chunk allocated, zeroed, on first touch).
GShadow &gshadow(GRange &r, uintptr_t a) {
    const uintptr_t i = a - r.lo;
    std::vector<GShadow> &chunk = r.chunks[i >> kGChunkBits];
    if (chunk.empty()) chunk.resize(std::size_t(1) << kGChunkBits, GShadow{});
    return chunk[i & ((uintptr_t(1) << kGChunkBits) - 1)];
}

/// The atomics' record of global byte `a` of range `r`, or null where no atomic of the launch
/// has touched its chunk (no atomics to check against); `make` allocates the chunk, zeroed.
GAccesses *gatomics(GRange &r, uintptr_t a, bool make) {
    const uintptr_t i = a - r.lo;
    std::vector<GAccesses> &chunk = r.atomic_chunks[i >> kGChunkBits];
    if (chunk.empty()) {
        if (!make) return nullptr;
        chunk.resize(std::size_t(1) << kGChunkBits, GAccesses{});
    }
    return &chunk[i & ((uintptr_t(1) << kGChunkBits) - 1)];
}

/// The block whose epochs include `epoch`.
uint3 block_of_epoch(uint32_t epoch) {
    auto it = std::upper_bound(
        g_rt.block_starts.begin(), g_rt.block_starts.end(), epoch,
        [](uint32_t e, const std::pair<uint32_t, uint3> &b) { return e < b.first; });
    return it == g_rt.block_starts.begin() ? uint3{0, 0, 0} : std::prev(it)->second;
}

/// The full sync generation of warp `w` when it was `wep` in its low 16 bits (at most 65535
/// __syncwarps ago).
uint32_t full_gen(const Warp &w, uint16_t wep) {
    return w.sync_gen - static_cast<uint16_t>(static_cast<uint16_t>(w.sync_gen) - wep);
}

/// Whether access `x` is ordered before an access by fiber `f`: none recorded, or by the same
/// block and in an earlier epoch, by the same thread, or by lanes of its warp that have since
/// taken part in a __syncwarp with it (`lanes`, when x stands for several lanes of a warp).
bool g_ordered(const GAccess &x, const Fiber *f, uint32_t lanes = 0) {
    if (x.epoch == 0) return true;
    if (x.epoch < g_rt.block_epoch0 || (x.tid & kOtherBlocks)) return false;
    if (x.epoch != g_rt.epoch) return true;
    const uint16_t who = x.tid & kTidMask;
    if (who == f->tid) return true;
    const Warp &w = g_rt.warps[f->warp];
    const uint32_t gen = full_gen(w, x.wep);
    if (who < kWarpMany) return who / 32 == f->warp && lanes_synced(w, f->lane, who % 32, gen);
    if (who != (kWarpMany | f->warp)) return false;
    for (uint32_t m = lanes & ~(1u << f->lane); m; m &= m - 1) {
        if (!lanes_synced(w, f->lane, __builtin_ctz(m), gen)) return false;
    }
    return true;
}

/// Adds an access by fiber `f` to record `r` (loads or atomics: several threads and blocks).
void g_record(GAccesses &r, const Fiber *f) {
    GAccess &x = r.x;
    const bool other = (x.tid & kOtherBlocks) || (x.epoch != 0 && x.epoch < g_rt.block_epoch0);
    const auto flag = static_cast<uint16_t>(other ? kOtherBlocks : 0);
    const auto wep = static_cast<uint16_t>(g_rt.warps[f->warp].sync_gen);
    if (x.epoch != g_rt.epoch || (!other && g_ordered(x, f, r.lanes))) {
        // A new epoch, or every access recorded is ordered before this one: it stands for them
        // (as in add_access).
        x = GAccess{g_rt.epoch, static_cast<uint16_t>(f->tid | flag), wep};
        r.lanes = 1u << f->lane;
        return;
    }
    r.lanes |= 1u << f->lane;  // used when the record stands for lanes of one warp
    uint16_t who = x.tid & kTidMask;
    if (who != f->tid) {
        const bool same_warp = who < kWarpMany ? who / 32 == f->warp : who == (kWarpMany | f->warp);
        who = same_warp ? static_cast<uint16_t>(kWarpMany | f->warp) : kGlobalMany;
    }
    x.tid = static_cast<uint16_t>(who | flag);
    x.wep = wep;
}

/// Who made access `x`, for messages.
std::string g_who(const GAccess &x) {
    const uint16_t who = x.tid & kTidMask;
    if (x.tid & kOtherBlocks) return "more than one block";
    if (x.epoch < g_rt.block_epoch0) {
        const uint3 b = block_of_epoch(x.epoch);
        const std::string s = format("block (%u,%u,%u)", b.x, b.y, b.z);
        return who < kWarpMany ? thread_name(who) + " of " + s : "threads of " + s;
    }
    if (who < kWarpMany) return thread_name(who);
    if (who == kGlobalMany) return "other threads";
    return format("lanes of warp %d", who & 31);
}

/// Counts an async copy reading `bytes` bytes at `src` into (delta 1) or out of (delta -1) the
/// copies in flight of its global range, in a checked launch.
void count_source(const char *src, std::size_t bytes, int delta) {
    if (!g_rt.check || bytes == 0 || src == nullptr) return;  // null: zeros, nothing read
    if (GRange *r = grange_of(reinterpret_cast<uintptr_t>(src))) r->reading += delta;
}

/// Fails if fiber `f` writes (or updates atomically) `n` global bytes at `addr` that an async
/// copy in flight reads: the copy may read its source any time until it completes (a cp.async at
/// its thread's wait, a bulk copy when its mbarrier phase completes), so on the GPU it may copy
/// the old bytes or the new.
void check_copy_sources(const Fiber *f, uintptr_t addr, std::size_t n, GKind kind) {
    const char *act = kind == GKind::kStore ? "writes" : "atomically updates";
    // The first byte of [addr, addr + n) in [src, src + bytes), or 0.
    const auto overlap = [&](const char *src, std::size_t bytes) -> uintptr_t {
        const auto lo = reinterpret_cast<uintptr_t>(src);
        return lo < addr + n && addr < lo + bytes ? std::max(lo, addr) : 0;
    };
    for (int t = 0; t < g_rt.nthreads; ++t) {
        for (const PendingCopy &pc : g_rt.fibers[t].pending) {
            if (const uintptr_t a = overlap(pc.src, static_cast<std::size_t>(pc.bytes))) {
                fail(f, format("global-memory race: %s address %#lx, which a cp_async_16 that %s "
                               "issued to shared address %#lx reads, before that thread's "
                               "cp_async_wait_group/cp_async_wait_all covering the copy (the "
                               "copy may read its source any time until then)",
                               act, static_cast<unsigned long>(a), thread_name(t).c_str(),
                               reinterpret_cast<unsigned long>(pc.dst)));
            }
        }
    }
    for (const auto &[bar, b] : g_rt.mbarriers) {
        for (const BulkCopy &c : b.copies) {
            if (c.src == nullptr) continue;  // zeros: nothing read
            if (const uintptr_t a = overlap(c.src, c.bytes)) {
                fail(f, format("global-memory race: %s address %#lx, which a %s to shared address "
                               "%#lx reads, before the phase of the mbarrier at %#lx that the "
                               "copy belongs to completes (the copy may read its source any "
                               "time until then)",
                               act, static_cast<unsigned long>(a), c.via,
                               reinterpret_cast<unsigned long>(c.dst),
                               static_cast<unsigned long>(bar)));
            }
        }
    }
}

/// Counts the pieces of a bulk tensor store writing `bytes` bytes at `dst` into (delta 1) or out of
/// (delta -1) the stores in flight of its global range, in a checked launch.
void count_dest(const char *dst, std::size_t bytes, int delta) {
    if (!g_rt.check || bytes == 0) return;
    if (GRange *r = grange_of(reinterpret_cast<uintptr_t>(dst))) r->writing += delta;
}

/// Fails if fiber `f` accesses `n` global bytes at `addr` that a bulk tensor store in flight
/// writes: the store may write them any time until its thread's wait retires it (the emulator
/// writes them then), so on the GPU the access may meet the old bytes or the new.
void check_store_dests(const Fiber *f, uintptr_t addr, std::size_t n, GKind kind,
                       const char *via) {
    for (int t = 0; t < g_rt.nthreads; ++t) {
        for (const BulkStore &s : g_rt.fibers[t].stores) {
            if (!(s.lo < addr + n && addr < s.hi)) continue;
            for (const BulkCopy &c : s.pieces) {
                const auto lo = reinterpret_cast<uintptr_t>(c.dst);
                if (!(lo < addr + n && addr < lo + c.bytes)) continue;
                const std::string act =
                    via                     ? format("%s %s", via, verb(kind != GKind::kLoad))
                    : kind == GKind::kAtomic ? std::string("atomically updates")
                                             : std::string(verb(kind == GKind::kStore));
                fail(f, format("global-memory race: %s address %#lx, which a bulk tensor store "
                               "(%s) from shared address %#lx issued by %s writes, before that "
                               "thread's cp_async_bulk_wait_group covering the store (the store "
                               "may write any time until then)",
                               act.c_str(), static_cast<unsigned long>(std::max(lo, addr)), s.via,
                               reinterpret_cast<unsigned long>(s.src), thread_name(t).c_str()));
            }
        }
    }
}

/// Race checks for `n` bytes of global memory at `addr` (inside a registered range) accessed by
/// fiber `f`; `via` names an async copy reading them (a load) or a bulk store writing them.
void global_access(const Fiber *f, uintptr_t addr, std::size_t n, GKind kind,
                   const char *via = nullptr) {
    GRange *r = grange_of(addr);
    if (r == nullptr) return;
    if (kind != GKind::kLoad && r->reading) check_copy_sources(f, addr, n, kind);
    if (r->writing) check_store_dests(f, addr, n, kind, via);
    for (std::size_t i = 0; i < n; ++i) {
        GShadow &s = gshadow(*r, addr + i);
        GAccesses *atomics = gatomics(*r, addr + i, kind == GKind::kAtomic);
        const GAccess *clash = nullptr;
        const char *did = "";
        if (!g_ordered(s.store, f)) {
            clash = &s.store;
            did = "wrote";
        } else if (kind != GKind::kAtomic && atomics && !g_ordered(atomics->x, f, atomics->lanes)) {
            clash = &atomics->x;
            did = "updated atomically";
        } else if (kind != GKind::kLoad && !g_ordered(s.load.x, f, s.load.lanes)) {
            clash = &s.load.x;
            did = "read";
        }
        if (clash) {
            const std::string act = via                      ? format("%s %s", via,
                                                                      verb(kind != GKind::kLoad))
                                    : kind == GKind::kLoad   ? std::string("reads")
                                    : kind == GKind::kStore  ? std::string("writes")
                                                             : std::string("atomically updates");
            const bool other_block =
                clash->epoch < g_rt.block_epoch0 || (clash->tid & kOtherBlocks);
            fail(f, format("global-memory race: %s address %#lx, which %s %s %s", act.c_str(),
                           static_cast<unsigned long>(addr + i), g_who(*clash).c_str(), did,
                           other_block ? "earlier in this launch (blocks run in no set order, "
                                         "and only loads or only atomics may share bytes)"
                                       : "with no __syncthreads() in between"));
        }
        switch (kind) {
        case GKind::kLoad: g_record(s.load, f); break;
        case GKind::kAtomic: g_record(*atomics, f); break;
        case GKind::kStore:
            // Ordered after every access recorded so far (else reported): it stands for them.
            s.store = GAccess{g_rt.epoch, static_cast<uint16_t>(f->tid),
                              static_cast<uint16_t>(g_rt.warps[f->warp].sync_gen)};
            if (atomics) *atomics = GAccesses{};
            s.load = GAccesses{};
            break;
        }
    }
}

/// The error for a fiber that touched `a`, in the guard below its stack.
std::string overflow_message(uintptr_t a) {
    return format("stack overflow of the emulated thread at %#lx (%zu-byte fiber stacks: more "
                  "local memory than the 512 KiB a GPU thread has, or deep recursion)",
                  static_cast<unsigned long>(a), kStackBytes);
}

/// Full check of one access by fiber `f` (used by the callbacks and by the runtime's own reads).
void check_access(const Fiber *f, uintptr_t a, std::size_t n, bool write) {
    if (a >= reinterpret_cast<uintptr_t>(f->stack_lo) &&
        a + n <= reinterpret_cast<uintptr_t>(f->stack_hi)) {
        return;
    }
    std::size_t off;
    int region = shared_region(a, n, &off);
    if (region >= 0) {
        shadow_access(f, a, off, n, write);
        return;
    }
    if (region == -1) {
        fail(f, format("out-of-bounds shared-memory access: %s %zu bytes at %#lx, outside the "
                       "block's shared memory (%zu static bytes, the __shared__ variables of "
                       "every kernel in this module together, + %zu dynamic bytes)",
                       verb(write), n, static_cast<unsigned long>(a),
                       static_cast<std::size_t>(g_rt.s_hi - g_rt.s_lo), g_rt.d_size));
    }
    if (in_global(a, n)) {
        global_access(f, a, n, write ? GKind::kStore : GKind::kLoad);
        return;
    }
    if (const char *object = runtime_object(a, n)) {
        fail(f, format("out-of-bounds access: %s %zu bytes at %#lx, inside the emulator's own %s, "
                       "outside every tensor and the block's shared memory (an index far past "
                       "a buffer's bounds)",
                       verb(write), n, static_cast<unsigned long>(a), object));
    }
    // The library's own data: constants, and __device__ variables, which are neither race- nor
    // bounds-checked (an index past one lands in whatever the linker put next).
    if (in_library(a, n)) return;
    if (a < reinterpret_cast<uintptr_t>(f->stack_lo) &&
        a + kGuardBytes >= reinterpret_cast<uintptr_t>(f->stack_lo)) {
        fail(f, overflow_message(a));
    }
    fail(f, format("out-of-bounds global-memory access: %s %zu bytes at %#lx, outside every "
                   "tensor passed to the kernel",
                   verb(write), n, static_cast<unsigned long>(a)));
}

/// The shared-arena offset of a pointer the runtime itself dereferences (ldmatrix, cp.async).
void require_shared(const Fiber *f, const void *p, std::size_t n, std::size_t align,
                    const char *what) {
    auto a = reinterpret_cast<uintptr_t>(p);
    std::size_t off;
    if (shared_region(a, n, &off) < 0) {
        fail(f, format("%s: address %#lx is not inside the block's shared memory (%zu static "
                       "bytes, the __shared__ variables of every kernel in this module together, "
                       "+ %zu dynamic bytes)",
                       what, static_cast<unsigned long>(a),
                       static_cast<std::size_t>(g_rt.s_hi - g_rt.s_lo), g_rt.d_size));
    }
    if (a % align) {
        fail(f, format("%s: shared address %#lx is not %zu-byte aligned", what,
                       static_cast<unsigned long>(a), align));
    }
}

// ---------------------------------------------------------------------------------------------
// Fibers and scheduling
// ---------------------------------------------------------------------------------------------

void fiber_main(Fiber *f);

#if !SPIO_EMU_ASM_SWITCH
void fiber_main_uc(int hi, int lo) {
    auto p = (static_cast<uintptr_t>(static_cast<unsigned>(hi)) << 32) | static_cast<unsigned>(lo);
    fiber_main(reinterpret_cast<Fiber *>(p));
}
#endif

/// Maps `n` fiber stacks, each above its PROT_NONE guard (the stack grows down into it), for one
/// launch (MAP_NORESERVE: only the pages a fiber touches take memory).
///
/// Stacks live only for the launch (release_stacks unmaps them): every library links its own
/// runtime, and each guard page splits the mapping, so stacks kept per library would exhaust the
/// process's mapping limit (vm.max_map_count) after a few dozen kernels.
bool map_stacks(int n) {
    const std::size_t per = kStackBytes + kGuardBytes;
    void *mem = mmap(nullptr, per * n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return false;
    g_rt.stacks = static_cast<char *>(mem);
    g_rt.mapped_stacks = n;
    for (int i = 0; i < n; ++i) {
        char *base = g_rt.stacks + i * per;
        mprotect(base, kGuardBytes, PROT_NONE);
        g_rt.fibers[i].stack_lo = base + kGuardBytes;
        g_rt.fibers[i].stack_hi = base + per;
    }
    return true;
}

/// Unmaps the stacks of the finished launch.
void release_stacks() {
    if (g_rt.stacks) {
        munmap(g_rt.stacks, (kStackBytes + kGuardBytes) * g_rt.mapped_stacks);
        g_rt.stacks = nullptr;
        g_rt.mapped_stacks = 0;
    }
}

/// Releases the stacks when a launch returns, whichever way it returns.
struct StackLease {
    ~StackLease() { release_stacks(); }
};

/// SIGSEGV handler of a launch. A fault in the running fiber's guard is its stack overflowing:
/// the fiber is abandoned, as fail() abandons it, and run_block reports the overflow (nothing
/// here allocates: the fault may have come anywhere). Any other fault goes on to the handler
/// that was there before (Python's faulthandler, or the default action: the process ends).
///
/// The handler is the process's, and every library has its own on_segv and g_old_segv: each
/// launch installs its library's and puts back what it found when it ends, which is right only
/// while launches do not overlap. Python serialises them process-wide. Launches of two libraries
/// in two threads had left a stale on_segv installed, and a later launch saved it as g_old_segv,
/// so that a fault chained to itself without end instead of reaching faulthandler.
void on_segv(int sig, siginfo_t *info, void *context) {
    Fiber *f = g_rt.cur;
    const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
    const auto lo = f ? reinterpret_cast<uintptr_t>(f->stack_lo) : 0;
    if (f && a < lo && a + kGuardBytes >= lo) {
        g_rt.overflow = a;
        f->state = State::kDone;
        switch_to_scheduler(f);  // never resumed; SA_NODEFER left SIGSEGV unblocked
    }
    if ((g_old_segv.sa_flags & SA_SIGINFO) && g_old_segv.sa_sigaction) {
        g_old_segv.sa_sigaction(sig, info, context);
    } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
        g_old_segv.sa_handler(sig);
    } else {
        sigaction(SIGSEGV, &g_old_segv, nullptr);  // the access faults again, with no handler
    }
}

/// Installs on_segv, on its own stack, for the launch; puts back what was there when it ends.
struct SignalLease {
    stack_t old_stack{};
    SignalLease() {
        stack_t ss{};
        ss.ss_sp = g_signal_stack;
        ss.ss_size = sizeof g_signal_stack;
        sigaltstack(&ss, &old_stack);
        struct sigaction sa {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_old_segv);
        if ((g_old_segv.sa_flags & SA_SIGINFO) && g_old_segv.sa_sigaction == on_segv) {
            // This library's own handler, left behind (see on_segv): chaining to it would call
            // on_segv again without end. What it stood for is lost; the default action ends the
            // process as a fault should.
            g_old_segv = {};
            g_old_segv.sa_handler = SIG_DFL;
        }
    }
    ~SignalLease() {
        sigaction(SIGSEGV, &g_old_segv, nullptr);
        sigaltstack(&old_stack, nullptr);
    }
};

/// Sets up the global-memory shadow of a checked launch: the registered ranges, overlapping ones
/// merged (aliased tensors share one record per byte), each with its chunk table.
void init_global_shadow(const spio_emu_launch *cfg) {
    std::vector<std::pair<uintptr_t, uintptr_t>> spans;
    for (uint32_t i = 0; i < cfg->num_ranges; ++i) {
        if (cfg->ranges[2 * i] < cfg->ranges[2 * i + 1]) {
            spans.push_back({cfg->ranges[2 * i], cfg->ranges[2 * i + 1]});
        }
    }
    std::sort(spans.begin(), spans.end());
    g_rt.granges.clear();
    for (const auto &[lo, hi] : spans) {
        if (!g_rt.granges.empty() && lo <= g_rt.granges.back().hi) {
            g_rt.granges.back().hi = std::max(g_rt.granges.back().hi, hi);
        } else {
            g_rt.granges.push_back(GRange{lo, hi, {}, {}, 0});
        }
    }
    for (GRange &r : g_rt.granges) {
        r.chunks.resize(((r.hi - r.lo) >> kGChunkBits) + 1);
        r.atomic_chunks.resize(r.chunks.size());
    }
    g_rt.block_starts.clear();
}

/// Frees the global-memory shadow when a launch returns (it may be hundreds of MB).
struct GlobalShadowLease {
    ~GlobalShadowLease() {
        g_rt.granges.clear();
        g_rt.granges.shrink_to_fit();
        g_rt.block_starts.clear();
    }
};

void init_fiber(Fiber &f) {
#if SPIO_EMU_ASM_SWITCH
    auto top = reinterpret_cast<uintptr_t>(f.stack_hi) & ~uintptr_t(15);
    auto *slot = reinterpret_cast<uint64_t *>(top - 24);  // return address; 8 mod 16
    auto *sp = slot - 8;
    uint32_t mxcsr;
    uint16_t fcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
    sp[0] = fcw;
    sp[1] = mxcsr;
    sp[2] = 0;                                                // r15
    sp[3] = 0;                                                // r14
    sp[4] = reinterpret_cast<uint64_t>(&fiber_main);          // r13: function
    sp[5] = reinterpret_cast<uint64_t>(&f);                   // r12: argument
    sp[6] = 0;                                                // rbx
    sp[7] = 0;                                                // rbp
    slot[0] = reinterpret_cast<uint64_t>(&spio_emu_fiber_start);
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack_lo;
    f.uc.uc_stack.ss_size = static_cast<std::size_t>(f.stack_hi - f.stack_lo);
    f.uc.uc_link = nullptr;
    auto p = reinterpret_cast<uintptr_t>(&f);
    makecontext(&f.uc, reinterpret_cast<void (*)()>(&fiber_main_uc), 2,
                static_cast<int>(p >> 32), static_cast<int>(p & 0xffffffffu));
#endif
}

void resume(Fiber &f) {
    g_rt.cur = &f;
    g_thread_idx = f.idx;
#if SPIO_EMU_ASM_SWITCH
    spio_emu_switch(&g_rt.sched_sp, f.sp);
#else
    swapcontext(&g_rt.sched_uc, &f.uc);
#endif
    g_rt.cur = nullptr;
}

void release_block_barrier() {
    for (int i = 0; i < g_rt.nthreads; ++i) {
        if (g_rt.fibers[i].state == State::kBlockWait) g_rt.fibers[i].state = State::kRunnable;
    }
    g_rt.block_arrived = 0;
    ++g_rt.epoch;
    g_rt.landings.clear();  // (a landing is looked up only in its epoch: check_landed)
}

const char *op_name(Op op) {
    switch (op) {
    case Op::kSyncwarp: return "__syncwarp";
    case Op::kShfl: return "__shfl_*_sync";
    case Op::kBallot: return "__ballot_sync";
    case Op::kMma: return "mma.sync";
    case Op::kLdmatrix: return "ldmatrix";
    default: return "nothing";
    }
}

/// The collective in progress that waits for lane `lane` of warp `w`, or null.
const Group *group_waiting_for(const Warp &w, int lane) {
    for (uint32_t m = w.active; m; m &= m - 1) {
        const Group &g = w.groups[__builtin_ctz(m)];
        if (g.expected & (1u << lane)) return &g;
    }
    return nullptr;
}

void drop_pending(Fiber &f) {
    if (g_rt.check) {
        for (const auto &pc : f.pending) {
            std::size_t off;
            if (shared_region(reinterpret_cast<uintptr_t>(pc.dst), 16, &off) >= 0) {
                for (int i = 0; i < 16; ++i) g_rt.shadow[off + i].async_tid = 0;
            }
            count_source(pc.src, static_cast<std::size_t>(pc.bytes), -1);
        }
    }
    f.pending.clear();
}

/// Forgets the previous block's mbarriers, their bytes' marks and the shadow marks of bulk copies
/// that never landed.
void drop_mbarriers() {
    if (g_rt.check) {
        for (const auto &entry : g_rt.mbarriers) {
            std::size_t off;
            if (shared_region(entry.first, 8, &off) >= 0) {
                for (int i = 0; i < 8; ++i) g_rt.shadow[off + i].bulk = 0;
            }
            for (const BulkCopy &c : entry.second.copies) {
                std::size_t off;
                if (shared_region(reinterpret_cast<uintptr_t>(c.dst), c.bytes, &off) >= 0) {
                    for (unsigned i = 0; i < c.bytes; ++i) g_rt.shadow[off + i].async_tid = 0;
                }
                count_source(c.src, c.bytes, -1);
            }
        }
    }
    g_rt.mbarriers.clear();
    g_rt.landings.clear();
    g_rt.mbarrier_spins = 0;
}

void fiber_main(Fiber *f) {
    g_rt.thunk();
    f->state = State::kDone;
    ++g_rt.done;
    Warp &w = g_rt.warps[f->warp];
    w.exited |= 1u << f->lane;
    if (const Group *g = group_waiting_for(w, f->lane)) {
        fail(f, format("exits while lanes of its warp wait for it in %s", op_name(g->op)));
    }
    if (g_rt.check && !f->pending.empty()) {
        // The hardware may land them after the block has exited and its shared memory has gone
        // to another block: every copy a thread issues is waited for before it exits.
        const PendingCopy &pc = f->pending.front();
        const std::size_t n = f->pending.size();
        fail(f, format("exits with %zu cp.async %s still in flight (the first to shared address "
                       "%#lx); a cp_async_wait_all (or a wait_group covering them) must come "
                       "before the thread exits",
                       n, n == 1 ? "copy" : "copies", reinterpret_cast<unsigned long>(pc.dst)));
    }
    drop_pending(*f);  // unchecked: copies still in flight never land
    if (g_rt.block_arrived && g_rt.block_arrived + g_rt.done == g_rt.nthreads) {
        release_block_barrier();
    }
    switch_to_scheduler(f);
    std::abort();  // a finished fiber is never resumed
}

std::string deadlock_report() {
    std::string at_block, at_warp;
    int nb = 0, nw = 0;
    for (int i = 0; i < g_rt.nthreads; ++i) {
        const Fiber &f = g_rt.fibers[i];
        if (f.state == State::kBlockWait && nb++ < 4) at_block += " " + thread_name(i);
        if (f.state == State::kWarpWait && nw++ < 4) {
            const Group *g = group_waiting_for(g_rt.warps[f.warp], f.lane);
            at_warp += " " + thread_name(i) + " in " + op_name(g ? g->op : Op::kNone);
        }
    }
    return format("deadlock: %d threads wait at __syncthreads() (%s ...), %d at a warp "
                  "collective (%s ...), %d exited; a barrier is not reached by every thread",
                  nb, at_block.c_str(), nw, at_warp.c_str(), g_rt.done);
}

int run_block() {
    const int n = g_rt.nthreads;
    const dim3 bd = g_block_dim;
    for (int t = 0; t < n; ++t) {
        Fiber &f = g_rt.fibers[t];
        f.tid = t;
        f.warp = t / 32;
        f.lane = t % 32;
        f.idx = uint3{static_cast<unsigned>(t % bd.x), static_cast<unsigned>((t / bd.x) % bd.y),
                      static_cast<unsigned>(t / (bd.x * bd.y))};
        f.state = State::kRunnable;
        f.committed = 0;
        f.pending.clear();
        f.bulk_committed = 0;
        f.stores.clear();
        f.proxy_fences = 0;
        f.fence_epoch = 0;
        init_fiber(f);
    }
    for (int w = 0; w < g_rt.nwarps; ++w) {
        Warp &wp = g_rt.warps[w];
        int lanes = std::min(32, n - 32 * w);
        wp.existing = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
        wp.exited = 0;
        wp.active = 0;
        for (Group &g : wp.groups) g = Group{};
    }
    g_rt.done = 0;
    g_rt.block_arrived = 0;
    ++g_rt.epoch;
    g_rt.block_epoch0 = g_rt.epoch;
    if (g_rt.check) g_rt.block_starts.push_back({g_rt.epoch, g_block_idx});
    std::memset(g_rt.s_lo, 0xff, static_cast<std::size_t>(g_rt.s_hi - g_rt.s_lo));
    std::memset(g_rt.d_lo, 0xff, g_rt.d_size);
    drop_mbarriers();
    g_rt.store_sources.clear();

    std::vector<int> order(n);
    for (int t = 0; t < n; ++t) order[t] = t;
    while (g_rt.done < n) {
        if (g_rt.cfg->shuffle) std::shuffle(order.begin(), order.end(), g_rt.rng);
        bool progress = false;
        for (int t : order) {
            Fiber &f = g_rt.fibers[t];
            if (f.state != State::kRunnable) continue;
            progress = true;
            g_rt.spun = false;
            resume(f);
            if (g_rt.overflow) {
                g_rt.failed = true;
                g_rt.error = who(&f) + ": " + overflow_message(g_rt.overflow);
                g_rt.overflow = 0;
                return -1;
            }
            if (g_rt.failed) return -1;
            // It reached a barrier, a collective or its end: a failed mbarrier wait may end yet.
            if (!g_rt.spun) g_rt.mbarrier_spins = 0;
        }
        if (!progress) {
            g_rt.failed = true;
            g_rt.error = who(nullptr) + ": " + deadlock_report();
            return -1;
        }
    }
    for (const auto &[addr, bar] : g_rt.mbarriers) {
        if (!bar.copies.empty()) {
            g_rt.failed = true;
            g_rt.error = who(nullptr) + ": " +
                         format("the block ends with %zu bulk copies on the mbarrier at %#lx that "
                                "no thread waited for",
                                bar.copies.size(), static_cast<unsigned long>(addr));
            return -1;
        }
    }
    for (int t = 0; t < n; ++t) {
        // The copy engine may read a store's source after the block's shared memory has gone to
        // another block: every thread waits for its stores before the block ends.
        const std::size_t stores = g_rt.fibers[t].stores.size();
        if (stores) {
            g_rt.failed = true;
            g_rt.error = who(nullptr) + ": " +
                         format("the block ends with %zu bulk tensor %s issued by %s not waited "
                                "for (cp_async_bulk_wait_group)",
                                stores, stores == 1 ? "store" : "stores", thread_name(t).c_str());
            return -1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Warp collectives: deposit, warp barrier, the last lane to arrive computes every lane's result.
// ---------------------------------------------------------------------------------------------

void complete(Warp &w, const Group &g, int warp_index);

/// Joins the running lane to its warp's collective on `mask` (starting it if no lane has yet);
/// returns the collective's index in Warp::groups.
int begin_collective(Op op, int sub, uint32_t mask, bool full_warp) {
    Fiber *f = g_rt.cur;
    Warp &w = g_rt.warps[f->warp];
    const uint32_t bit = 1u << f->lane;
    if (full_warp) {
        if (w.existing != 0xffffffffu) {
            fail(f, format("%s needs all 32 lanes of a warp; this warp has only %d threads "
                           "(blockDim is not a multiple of 32)",
                           op_name(op), __builtin_popcount(w.existing)));
        }
        mask = 0xffffffffu;
    }
    if (!(mask & bit)) {
        fail(f, format("calls %s with mask %#x, which does not include its own lane %d",
                       op_name(op), mask, f->lane));
    }
    mask &= w.existing;
    if (mask & w.exited) {
        fail(f, format("%s with mask %#x waits for lanes that have exited (%#x)", op_name(op),
                       mask, mask & w.exited));
    }
    // Collectives in progress on lanes of this mask: the same one (join it), or none.
    for (uint32_t m = w.active; m; m &= m - 1) {
        const int i = __builtin_ctz(m);
        const Group &g = w.groups[i];
        if (!(g.expected & mask)) continue;
        if (g.op != op || g.sub != sub || g.expected != mask) {
            fail(f, format("lane %d reaches %s (mask %#x) while other lanes of its warp wait in "
                           "%s (mask %#x): divergent warp collectives",
                           f->lane, op_name(op), mask, op_name(g.op), g.expected));
        }
        return i;
    }
    const int i = __builtin_ctz(~w.active);  // at most 32 disjoint masks: a free slot remains
    w.groups[i] = Group{mask, 0, op, sub};
    w.active |= 1u << i;
    return i;
}

/// Arrives at collective `gi`; returns when every expected lane has deposited and results exist.
void finish_collective(int gi) {
    Fiber *f = g_rt.cur;
    Warp &w = g_rt.warps[f->warp];
    Group &g = w.groups[gi];
    g.arrived |= 1u << f->lane;
    if (g.arrived == g.expected) {
        complete(w, g, f->warp);
        for (uint32_t m = g.expected & ~(1u << f->lane); m; m &= m - 1) {
            g_rt.fibers[f->warp * 32 + __builtin_ctz(m)].state = State::kRunnable;
        }
        g.arrived = 0;
        w.active &= ~(1u << gi);
        return;
    }
    block_current(State::kWarpWait);
}

float half_to_float(uint16_t h) {
    const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 31u, man = h & 1023u;
    float v;
    if (exp == 0) {
        v = std::ldexp(static_cast<float>(man), -24);
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(man | 1024u), static_cast<int>(exp) - 25);
    }
    return sign ? -v : v;
}

float bf16_to_float(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

/// Element `half` (0: low, 1: high) of a register holding two 16-bit values.
inline float elem(uint32_t reg, int half, bool bf16) {
    const uint16_t h = static_cast<uint16_t>(half ? reg >> 16 : reg);
    return bf16 ? bf16_to_float(h) : half_to_float(h);
}

/// mma.sync m16n8k{8,16} with fp32 accumulate, from the PTX ISA fragment layouts
/// (g = lane >> 2, t = lane % 4). Deposit: in[0..3] A registers, in[4..5] B, in[6..9] C bits.
void complete_mma(Warp &w, const Group &g) {
    const bool k16 = (g.sub & 1) != 0;
    const bool bf16 = (g.sub & 2) != 0;
    const int kdim = k16 ? 16 : 8;
    double a[16][16], b[16][8];
    for (int r = 0; r < 16; ++r) {
        for (int k = 0; k < kdim; ++k) {
            const int lane = (r % 8) * 4 + (k % 8) / 2;
            const int reg = (r / 8) + 2 * (k / 8);
            a[r][k] = elem(w.in[lane][reg], k % 2, bf16);
        }
    }
    for (int k = 0; k < kdim; ++k) {
        for (int n = 0; n < 8; ++n) {
            const int lane = n * 4 + (k % 8) / 2;
            b[k][n] = elem(w.in[lane][4 + k / 8], k % 2, bf16);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; ++i) {
            const int r = g + 8 * (i / 2), n = 2 * t + (i % 2);
            float c;
            std::memcpy(&c, &w.in[lane][6 + i], 4);
            double acc = c;
            for (int k = 0; k < kdim; ++k) acc += a[r][k] * b[k][n];
            const float d = static_cast<float>(acc);
            std::memcpy(&w.out[lane][i], &d, 4);
        }
    }
}

/// ldmatrix .x{1,2,4}[.trans]: lanes 8j..8j+7 give the row addresses of matrix j.
void complete_ldmatrix(Warp &w, const Group &g, int warp_index) {
    const int nmat = g.sub & 7;
    const bool trans = (g.sub & 8) != 0;
    for (int j = 0; j < nmat; ++j) {
        for (int r = 0; r < 8; ++r) {
            const int src = 8 * j + r;
            const Fiber *owner = &g_rt.fibers[warp_index * 32 + src];
            require_shared(owner, w.ptr[src], 16, 16, "ldmatrix row address");
            if (g_rt.check) {
                auto a = reinterpret_cast<uintptr_t>(w.ptr[src]);
                std::size_t off;
                shared_region(a, 16, &off);
                shadow_access(owner, a, off, 16, false);
            }
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < nmat; ++j) {
            const auto *rows = &w.ptr[8 * j];
            uint32_t v;
            if (!trans) {
                std::memcpy(&v, static_cast<const char *>(rows[lane >> 2]) + 4 * (lane & 3), 4);
            } else {
                const int col = lane >> 2, r0 = 2 * (lane & 3);
                uint16_t lo, hi;
                std::memcpy(&lo, static_cast<const char *>(rows[r0]) + 2 * col, 2);
                std::memcpy(&hi, static_cast<const char *>(rows[r0 + 1]) + 2 * col, 2);
                v = lo | (static_cast<uint32_t>(hi) << 16);
            }
            w.out[lane][j] = v;
        }
    }
}

void complete_shfl(Warp &w, const Group &g, int warp_index) {
    const int mode = g.sub;
    for (uint32_t m = g.expected; m; m &= m - 1) {
        const int lane = __builtin_ctz(m);
        const int b = w.arg[lane] & 31;  // PTX: the source lane or offset is b[4:0]
        const int width = w.arg2[lane];
        // PTX shfl.sync: c = ((32 - width) << 8) | clamp, clamp 0 for .up and 31 otherwise.
        const int seg = (32 - width) & 31;
        const int clamp = mode == kShflUp ? 0 : 31;
        const int min_lane = lane & seg;
        const int max_lane = min_lane | (clamp & ~seg);
        int j;
        bool ok;
        switch (mode) {
        case kShflUp: j = lane - b; ok = j >= max_lane; break;
        case kShflDown: j = lane + b; ok = j <= max_lane; break;
        case kShflXor: j = lane ^ b; ok = j <= max_lane; break;
        default: j = min_lane | (b & ~seg & 31); ok = j <= max_lane; break;
        }
        if (!ok || j < 0 || j > 31) j = lane;
        // PTX: a source lane outside membermask (or inactive) gives an undefined value.
        if (!((g.expected >> j) & 1u)) {
            fail(&g_rt.fibers[warp_index * 32 + lane],
                 format("__shfl_*_sync with mask %#x reads lane %d, outside the mask: its value "
                        "is undefined (PTX shfl.sync)",
                        g.expected, j));
        }
        std::memcpy(&w.out[lane][0], &w.val[j], 8);
    }
}

/// Computes the results of collective `g`, writing only its own lanes' results (lanes of other
/// collectives in progress may not have read theirs yet).
void complete(Warp &w, const Group &g, int warp_index) {
    switch (g.op) {
    case Op::kMma: complete_mma(w, g); break;
    case Op::kLdmatrix: complete_ldmatrix(w, g, warp_index); break;
    case Op::kShfl: complete_shfl(w, g, warp_index); break;
    case Op::kBallot: {
        uint32_t ballot = 0;
        for (uint32_t m = g.expected; m; m &= m - 1) {
            const int lane = __builtin_ctz(m);
            if (w.arg[lane]) ballot |= 1u << lane;
        }
        for (uint32_t m = g.expected; m; m &= m - 1) w.out[__builtin_ctz(m)][0] = ballot;
        break;
    }
    case Op::kSyncwarp:
        // Orders memory among the mask's lanes only.
        ++w.sync_gen;
        for (uint32_t a = g.expected; a; a &= a - 1) {
            for (uint32_t b = g.expected; b; b &= b - 1) {
                w.synced[__builtin_ctz(a)][__builtin_ctz(b)] = w.sync_gen;
            }
        }
        break;
    default: break;
    }
}

template <int A, int B>
void mma_common(float (&d)[4], const unsigned *a, const unsigned *b, const float (&c)[4],
                int sub) {
    const int gi = begin_collective(Op::kMma, sub, 0xffffffffu, true);
    Fiber *f = g_rt.cur;
    Warp &w = g_rt.warps[f->warp];
    uint32_t *in = w.in[f->lane];
    for (int i = 0; i < A; ++i) in[i] = a[i];
    for (int i = 0; i < B; ++i) in[4 + i] = b[i];
    std::memcpy(in + 6, c, 16);
    finish_collective(gi);
    std::memcpy(d, w.out[f->lane], 16);
}

template <int N>
void ldmatrix_common(unsigned *d, const void *row_ptr, bool trans) {
    const int gi = begin_collective(Op::kLdmatrix, N | (trans ? 8 : 0), 0xffffffffu, true);
    Fiber *f = g_rt.cur;
    Warp &w = g_rt.warps[f->warp];
    w.ptr[f->lane] = row_ptr;
    finish_collective(gi);
    for (int i = 0; i < N; ++i) d[i] = w.out[f->lane][i];
}

void complete_copy(Fiber *f, const PendingCopy &pc) {
    if (g_rt.check) {
        std::size_t off;
        shared_region(reinterpret_cast<uintptr_t>(pc.dst), 16, &off);
        for (int i = 0; i < 16; ++i) g_rt.shadow[off + i].async_tid = 0;
        shadow_access(f, reinterpret_cast<uintptr_t>(pc.dst), off, 16, true);
        count_source(pc.src, static_cast<std::size_t>(pc.bytes), -1);
    }
    if (pc.bytes) std::memcpy(pc.dst, pc.src, pc.bytes);
    std::memset(pc.dst + pc.bytes, 0, 16 - pc.bytes);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Interface used by the kernel translation unit
// ---------------------------------------------------------------------------------------------

char *dynamic_shared_base() {
    return g_dynamic + kDynGuard + (g_rt.cfg ? g_rt.cfg->dynamic_offset : 0);
}

int run_launch(const spio_emu_launch *cfg, void (*thunk)()) {
    g_rt.cfg = cfg;
    g_rt.thunk = thunk;
    g_rt.check = cfg->check != 0;
    g_rt.failed = false;
    g_rt.error.clear();
    g_rt.rng.seed(cfg->seed);
    init_segments();
    g_rt.s_guard_lo = g_tls_arena_begin;
    g_rt.s_lo = g_tls_arena_begin + sizeof g_tls_arena_begin;
    g_rt.s_hi = g_tls_arena_end;
    g_rt.s_guard_hi = g_tls_arena_end + sizeof g_tls_arena_end;
    if (!g_dynamic) {  // (launches are serialised: no other thread is here)
        void *mem = mmap(nullptr, kDynBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
        if (mem == MAP_FAILED) {
            g_rt.error = "cannot map the dynamic shared-memory buffer";
            return -1;
        }
        g_dynamic = static_cast<char *>(mem);
    }
    g_rt.d_lo = dynamic_shared_base();
    g_rt.d_size = cfg->dynamic_shared_bytes;
    if (g_rt.s_hi < g_rt.s_lo || g_rt.d_size > kMaxDynamicShared) {
        g_rt.error = "bad shared-memory layout";
        return -1;
    }
    if (cfg->dynamic_offset % 16 || cfg->dynamic_offset >= kDynAlign) {
        g_rt.error = format("the dynamic shared buffer's offset must be a multiple of 16 below %zu, "
                            "got %u",
                            kDynAlign, cfg->dynamic_offset);
        return -1;
    }
    GlobalShadowLease global_lease;
    if (g_rt.check) {
        const std::size_t need = static_cast<std::size_t>(g_rt.s_hi - g_rt.s_lo) + g_rt.d_size;
        if (g_rt.shadow.size() < need) g_rt.shadow.resize(need);
        for (auto &s : g_rt.shadow) s = Shadow{};
        g_rt.atomics.clear();  // epochs start again: the records of the last launch would match
        g_rt.atomic_epoch = 0;
        g_rt.epoch = 0;
        init_global_shadow(cfg);
    }
    g_block_dim = dim3(cfg->block[0], cfg->block[1], cfg->block[2]);
    g_grid_dim = dim3(cfg->grid[0], cfg->grid[1], cfg->grid[2]);
    g_rt.nthreads = static_cast<int>(cfg->block[0] * cfg->block[1] * cfg->block[2]);
    g_rt.nwarps = (g_rt.nthreads + 31) / 32;
    StackLease lease;
    SignalLease signals;
    if (!map_stacks(g_rt.nthreads)) {
        g_rt.error = "cannot map fiber stacks";
        return -1;
    }
    const uint64_t nblocks = uint64_t(cfg->grid[0]) * cfg->grid[1] * cfg->grid[2];
    std::vector<uint64_t> blocks;
    if (cfg->shuffle) {
        blocks.resize(nblocks);
        for (uint64_t i = 0; i < nblocks; ++i) blocks[i] = i;
        std::shuffle(blocks.begin(), blocks.end(), g_rt.rng);
    }
    for (uint64_t i = 0; i < nblocks; ++i) {
        const uint64_t b = cfg->shuffle ? blocks[i] : i;
        g_block_idx = uint3{static_cast<unsigned>(b % cfg->grid[0]),
                            static_cast<unsigned>((b / cfg->grid[0]) % cfg->grid[1]),
                            static_cast<unsigned>(b / (uint64_t(cfg->grid[0]) * cfg->grid[1]))};
        if (run_block() != 0) {
            for (int t = 0; t < g_rt.nthreads; ++t) {
                drop_pending(g_rt.fibers[t]);
                g_rt.fibers[t].stores.clear();  // never copied; the global shadow goes with them
            }
            g_rt.store_sources.clear();
            return -1;
        }
    }
    return 0;
}

void syncthreads() {
    Fiber *f = g_rt.cur;
    if (const Group *g = group_waiting_for(g_rt.warps[f->warp], f->lane)) {
        fail(f, format("reaches __syncthreads() while lanes of its warp wait for it in %s",
                       op_name(g->op)));
    }
    ++g_rt.block_arrived;
    if (g_rt.block_arrived + g_rt.done == g_rt.nthreads) {
        release_block_barrier();
        f->state = State::kRunnable;
        switch_to_scheduler(f);  // let the others run first: more interleavings
        g_thread_idx = f->idx;
        return;
    }
    block_current(State::kBlockWait);
}

void syncwarp(unsigned mask) {
    finish_collective(begin_collective(Op::kSyncwarp, 0, mask, false));
}

uint64_t shfl(unsigned mask, uint64_t value, int mode, int lane_or_delta, int width) {
    Fiber *f = g_rt.cur;
    if (width <= 0 || width > 32 || (width & (width - 1))) {
        fail(f, format("shuffle width must be a power of two in 1..32, got %d", width));
    }
    const int gi = begin_collective(Op::kShfl, mode, mask, false);
    Warp &w = g_rt.warps[f->warp];
    w.val[f->lane] = value;
    w.arg[f->lane] = lane_or_delta;
    w.arg2[f->lane] = width;
    finish_collective(gi);
    uint64_t out;
    std::memcpy(&out, &w.out[f->lane][0], 8);
    return out;
}

unsigned ballot(unsigned mask, int predicate) {
    Fiber *f = g_rt.cur;
    const int gi = begin_collective(Op::kBallot, 0, mask, false);
    Warp &w = g_rt.warps[f->warp];
    w.arg[f->lane] = predicate != 0;
    finish_collective(gi);
    return w.out[f->lane][0];
}

unsigned active_mask() {
    const Warp &w = g_rt.warps[g_rt.cur->warp];
    return w.existing & ~w.exited;
}

void atomic_rmw(void *addr, const void *value, void *old, int kind) {
    Fiber *f = g_rt.cur;
    const std::size_t n = (kind == kAddF64 || kind == kAddU64) ? 8 : 4;
    auto a = reinterpret_cast<uintptr_t>(addr);
    if (a % n) fail(f, format("atomic on a misaligned address %#lx", static_cast<unsigned long>(a)));
    if (g_rt.check) {
        std::size_t off;
        int region = shared_region(a, n, &off);
        if (region == -1 || (region == -2 && !in_global(a, n))) {
            fail(f, format("out-of-bounds atomic at %#lx", static_cast<unsigned long>(a)));
        }
        if (region == -2) {
            global_access(f, a, n, GKind::kAtomic);
        } else {
            shadow_access(f, a, off, n, true, nullptr, true);
        }
    }
    std::memcpy(old, addr, n);
    switch (kind) {
    case kAddF32: *static_cast<float *>(addr) += *static_cast<const float *>(value); break;
    case kAddF64: *static_cast<double *>(addr) += *static_cast<const double *>(value); break;
    case kAddI32:
        *static_cast<int *>(addr) = static_cast<int>(static_cast<unsigned>(*static_cast<int *>(addr)) +
                                                     static_cast<unsigned>(*static_cast<const int *>(value)));
        break;
    case kAddU32: *static_cast<unsigned *>(addr) += *static_cast<const unsigned *>(value); break;
    case kAddU64:
        *static_cast<unsigned long long *>(addr) += *static_cast<const unsigned long long *>(value);
        break;
    case kMaxI32:
        *static_cast<int *>(addr) = std::max(*static_cast<int *>(addr), *static_cast<const int *>(value));
        break;
    case kMinI32:
        *static_cast<int *>(addr) = std::min(*static_cast<int *>(addr), *static_cast<const int *>(value));
        break;
    case kExchU32: *static_cast<unsigned *>(addr) = *static_cast<const unsigned *>(value); break;
    case kCasU32: {
        const auto *pair = static_cast<const unsigned *>(value);
        if (*static_cast<unsigned *>(addr) == pair[0]) *static_cast<unsigned *>(addr) = pair[1];
        break;
    }
    default: break;
    }
}

void cp_async_wait(int n) {
    Fiber *f = g_rt.cur;
    if (n < 0) ++f->committed;  // wait_all = commit_group + wait_group 0
    const uint64_t keep = n < 0 ? 0 : static_cast<uint64_t>(n);
    const uint64_t limit = f->committed > keep ? f->committed - keep : 0;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < f->pending.size(); ++i) {
        const PendingCopy pc = f->pending[i];
        if (pc.group < limit) {
            complete_copy(f, pc);
        } else {
            f->pending[kept++] = pc;
        }
    }
    f->pending.resize(kept);
}

}  // namespace detail

using detail::g_rt;
using detail::Fiber;

void mma_m16n8k8_f16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    detail::mma_common<2, 1>(d, a, &b, c, 0);
}
void mma_m16n8k8_bf16(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    detail::mma_common<2, 1>(d, a, &b, c, 2);
}
void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                      const float (&c)[4]) {
    detail::mma_common<4, 2>(d, a, b, c, 1);
}
void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                       const float (&c)[4]) {
    detail::mma_common<4, 2>(d, a, b, c, 3);
}
void ldmatrix_x1(unsigned (&d)[1], const void *p) { detail::ldmatrix_common<1>(d, p, false); }
void ldmatrix_x2(unsigned (&d)[2], const void *p) { detail::ldmatrix_common<2>(d, p, false); }
void ldmatrix_x4(unsigned (&d)[4], const void *p) { detail::ldmatrix_common<4>(d, p, false); }
void ldmatrix_x1_trans(unsigned (&d)[1], const void *p) { detail::ldmatrix_common<1>(d, p, true); }
void ldmatrix_x2_trans(unsigned (&d)[2], const void *p) { detail::ldmatrix_common<2>(d, p, true); }
void ldmatrix_x4_trans(unsigned (&d)[4], const void *p) { detail::ldmatrix_common<4>(d, p, true); }

void cp_async_16(void *smem_dst, const void *gmem_src, int src_bytes) {
    Fiber *f = g_rt.cur;
    if (src_bytes < 0 || src_bytes > 16) {
        detail::fail(f, detail::format("cp_async_16 src_bytes must be in 0..16, got %d", src_bytes));
    }
    detail::require_shared(f, smem_dst, 16, 16, "cp_async_16 destination");
    auto src = reinterpret_cast<uintptr_t>(gmem_src);
    if (src_bytes == 0 && g_rt.check && !detail::in_global(src, 1)) {
        // Nothing is read, but the kernels' contract is that a zero-filling copy still names an
        // address inside a tensor (the in-bounds fallback of cp_async_row_16 and the weights).
        detail::fail(f, detail::format("cp_async_16 zero-fills from %#lx, outside every tensor "
                                       "passed to the kernel: give a zero-byte copy an in-bounds "
                                       "fallback address",
                                       static_cast<unsigned long>(src)));
    }
    if (src_bytes > 0) {
        if (src % 16) {
            detail::fail(f, detail::format("cp_async_16 source %#lx is not 16-byte aligned",
                                           static_cast<unsigned long>(src)));
        }
        if (g_rt.check && !detail::in_global(src, static_cast<std::size_t>(src_bytes))) {
            detail::fail(f, detail::format("out-of-bounds global-memory access: cp_async_16 reads "
                                           "%d bytes at %#lx, outside every tensor passed to the "
                                           "kernel",
                                           src_bytes, static_cast<unsigned long>(src)));
        }
        if (g_rt.check) {
            detail::global_access(f, src, static_cast<std::size_t>(src_bytes),
                                  detail::GKind::kLoad, "cp_async_16");
        }
    }
    auto *dst = static_cast<char *>(smem_dst);
    if (g_rt.check) {
        std::size_t off;
        detail::shared_region(reinterpret_cast<uintptr_t>(dst), 16, &off);
        for (int i = 0; i < 16; ++i) {
            if (g_rt.shadow[off + i].async_tid) {
                detail::fail(f, detail::format("cp_async_16 to %#lx overlaps a cp.async that has "
                                               "not been waited for",
                                               reinterpret_cast<unsigned long>(dst)));
            }
        }
        // The copy may land any time from now: a write racing with this epoch's accesses.
        detail::shadow_access(f, reinterpret_cast<uintptr_t>(dst), off, 16, true, "cp_async_16");
        for (int i = 0; i < 16; ++i) {
            g_rt.shadow[off + i].async_tid = static_cast<uint16_t>(f->tid + 1);
        }
    }
    f->pending.push_back({dst, static_cast<const char *>(gmem_src), src_bytes, f->committed});
    detail::count_source(f->pending.back().src, static_cast<std::size_t>(src_bytes), 1);
}

void cp_async_commit_group() { ++g_rt.cur->committed; }

// mbarriers and bulk copies. A barrier's state lives here, keyed by its shared address (the
// kernel never reads the 8 bytes itself). Bulk copies land when a thread waits on their barrier
// after the phase's last arrival; until then their destination is marked like a cp.async's, so a
// read before the wait is reported as stale. Their writes take no part in race detection. A
// tensor copy (cp_async_bulk_tensor_g2s) is issued as pieces on the same machinery (start_bulk):
// runs of source bytes, and runs of zeros for the box outside the tensor.

namespace detail {

/// The mbarrier at `bar` for `what`; fails unless mbarrier_init made it and, where `what` is the
/// copy engine's use (`by_copy`: a bulk copy completing on it), the initialising thread has run
/// a proxy fence since: without one the copy engine may meet a barrier not yet initialised for
/// it. In a checked run another thread's use must also be ordered after the init (a
/// __syncthreads, or a __syncwarp of the initialising thread's warp, between them): unordered, it
/// may meet the barrier's word before the init on a GPU, and whether the emulator's thread
/// order ran the init first would decide the result.
MBarrier &mbarrier_at(Fiber *f, unsigned long long *bar, const char *what,
                      bool by_copy = false) {
    require_shared(f, bar, 8, 8, what);
    auto it = g_rt.mbarriers.find(reinterpret_cast<uintptr_t>(bar));
    if (it == g_rt.mbarriers.end()) {
        fail(f, format("%s on the mbarrier at %#lx, which mbarrier_init has not initialised", what,
                       reinterpret_cast<unsigned long>(bar)));
    }
    const MBarrier &b = it->second;
    if (g_rt.check && b.init_epoch == g_rt.epoch && b.init_tid != f->tid) {
        const Fiber &initiator = g_rt.fibers[b.init_tid];
        const Accesses init{b.init_epoch, b.init_wep, 1u << initiator.lane,
                            static_cast<uint16_t>(b.init_tid),
                            static_cast<uint16_t>(initiator.warp)};
        if (!ordered(init, f)) {
            fail(f, format("%s on the mbarrier at %#lx, which %s initialised in this barrier "
                           "interval: no __syncthreads (or __syncwarp of its warp) orders the "
                           "init before this use",
                           what, reinterpret_cast<unsigned long>(bar),
                           thread_name(b.init_tid).c_str()));
        }
    }
    if (by_copy && !b.fenced) {
        fail(f, format("%s on the mbarrier at %#lx, whose mbarrier_init (by thread %d) no "
                       "fence_mbarrier_init or fence_proxy_async_shared of that thread has made "
                       "visible to the copy engine",
                       what, reinterpret_cast<unsigned long>(bar), b.init_tid));
    }
    return it->second;
}

/// Marks the mbarriers fiber `f` initialised as visible to the copy engine (a proxy fence).
void fence_own_mbarriers(Fiber *f) {
    for (auto &entry : g_rt.mbarriers) {
        if (entry.second.init_tid == f->tid) entry.second.fenced = true;
    }
}

/// Lands the bulk copies of barrier `b` (at `addr`) in its current phase. Checked, the landed bytes
/// become this epoch's last write, visible to the threads that see the phase complete.
void land(MBarrier &b, uintptr_t addr) {
    if (g_rt.check && !b.copies.empty()) {
        if (g_rt.landings.size() + 1 >= kBarrierBytes) {
            fail(g_rt.cur, format("more than %u bulk-copy phases complete between two "
                                  "__syncthreads(): more than the emulator's checks count",
                                  kBarrierBytes - 2u));
        }
        g_rt.landings.push_back({&b, addr, b.completed});
    }
    for (const BulkCopy &c : b.copies) {
        if (g_rt.check) {
            std::size_t off;
            shared_region(reinterpret_cast<uintptr_t>(c.dst), c.bytes, &off);
            for (unsigned i = 0; i < c.bytes; ++i) {
                Shadow &s = g_rt.shadow[off + i];
                s.async_tid = 0;
                s.w_epoch = g_rt.epoch;
                s.w_tid = kMany;
                s.bulk = static_cast<uint16_t>(g_rt.landings.size());
            }
            count_source(c.src, c.bytes, -1);
        }
        if (c.src) {
            std::memcpy(c.dst, c.src, c.bytes);
        } else {
            std::memset(c.dst, 0, c.bytes);
        }
        b.tx -= c.bytes;
    }
    b.copies.clear();
}

}  // namespace detail

void mbarrier_init(unsigned long long *bar, unsigned count) {
    Fiber *f = g_rt.cur;
    detail::require_shared(f, bar, 8, 8, "mbarrier_init");
    if (count == 0) detail::fail(f, "mbarrier_init needs a count of at least 1, got 0");
    auto &b = g_rt.mbarriers[reinterpret_cast<uintptr_t>(bar)];
    if (!b.copies.empty()) {
        detail::fail(f, detail::format("mbarrier_init on the mbarrier at %#lx while %zu bulk "
                                       "copies on it have not landed",
                                       reinterpret_cast<unsigned long>(bar), b.copies.size()));
    }
    b = detail::MBarrier{};
    b.expected = b.pending = count;
    b.init_tid = f->tid;
    b.init_epoch = g_rt.epoch;
    b.init_wep = g_rt.warps[f->warp].sync_gen;
    if (g_rt.check) {  // its 8 bytes are the barrier's alone from now on (detail::kBarrierBytes)
        std::size_t off;
        detail::shared_region(reinterpret_cast<uintptr_t>(bar), 8, &off);
        for (int i = 0; i < 8; ++i) g_rt.shadow[off + i].bulk = detail::kBarrierBytes;
    }
    g_rt.mbarrier_spins = 0;
}

void fence_mbarrier_init() {  // (the emulator's barriers are visible at once: it only marks them)
    detail::fence_own_mbarriers(g_rt.cur);
}

void fence_proxy_async_shared() {
    detail::fence_own_mbarriers(g_rt.cur);
    if (g_rt.check) {  // (for check_fenced and check_refill_fenced)
        ++g_rt.cur->proxy_fences;
        g_rt.cur->fence_epoch = g_rt.epoch;
    }
}

void mbarrier_arrive_expect_tx(unsigned long long *bar, unsigned bytes) {
    Fiber *f = g_rt.cur;
    detail::MBarrier &b = detail::mbarrier_at(f, bar, "mbarrier_arrive_expect_tx");
    if (b.pending == 0) {
        detail::fail(f, detail::format("mbarrier_arrive_expect_tx on the mbarrier at %#lx, whose "
                                       "phase has had all %u arrivals mbarrier_init allowed",
                                       reinterpret_cast<unsigned long>(bar), b.expected));
    }
    b.tx += bytes;
    --b.pending;
    g_rt.mbarrier_spins = 0;
}

namespace detail {

/// Issues a bulk copy for fiber `f`: `what` (the instruction, for messages) lands `pieces` (n of
/// them, together exactly the `bytes` shared bytes at `dst`) on the current phase of `bar`.
/// Checked: each piece's global source lies inside the kernel's tensors and races with no store;
/// the landing bytes are no async copy's destination still in flight, count as written now (a
/// race with this epoch's unordered accesses), and stay marked in flight, so that reading them
/// before a wait on the phase is reported as stale, until the phase lands them (land()).
void start_bulk(Fiber *f, const char *what, char *dst, std::size_t bytes, unsigned long long *bar,
                const BulkCopy *pieces, std::size_t n) {
    if (g_rt.check) {
        for (std::size_t k = 0; k < n; ++k) {
            const BulkCopy &c = pieces[k];
            if (c.src == nullptr) continue;  // zeros: nothing read
            const auto s = reinterpret_cast<uintptr_t>(c.src);
            if (!in_global(s, c.bytes)) {
                fail(f, format("out-of-bounds global-memory access: %s reads %u bytes at %#lx, "
                               "outside every tensor passed to the kernel",
                               what, c.bytes, static_cast<unsigned long>(s)));
            }
            global_access(f, s, c.bytes, GKind::kLoad, what);
        }
    }
    MBarrier &b = mbarrier_at(f, bar, what, true);
    if (g_rt.check) {
        std::size_t off;
        shared_region(reinterpret_cast<uintptr_t>(dst), bytes, &off);
        for (std::size_t i = 0; i < bytes; ++i) {
            if (g_rt.shadow[off + i].async_tid) {
                fail(f, format("%s to %#lx overlaps an async copy that has not landed", what,
                               reinterpret_cast<unsigned long>(dst + i)));
            }
        }
        shadow_access(f, reinterpret_cast<uintptr_t>(dst), off, bytes, true, what);
        check_refill_fenced(f, reinterpret_cast<uintptr_t>(dst), off, bytes, what);
        for (std::size_t i = 0; i < bytes; ++i) {
            g_rt.shadow[off + i].async_tid = static_cast<uint16_t>(f->tid + 1);
        }
    }
    for (std::size_t k = 0; k < n; ++k) {
        b.copies.push_back(pieces[k]);
        count_source(pieces[k].src, pieces[k].bytes, 1);
    }
    g_rt.mbarrier_spins = 0;
}

/// The largest rank of a tensor map (CUDA's, and spio.cuda.tensor_map.MAX_RANK).
constexpr int kMapRank = 5;
/// "SPIOTMAP" as a little-endian word: the first 8 bytes of an emulator tensor map.
constexpr uint64_t kMapMagic = 0x50414d544f495053ull;

/// A tensor map decoded from the emulator's layout (spio.cuda.tensor_map.TensorMap.emulator_bytes,
/// 16 little-endian words): innermost dim first; stride[0] is the element size.
struct TensorMapInfo {
    uintptr_t address;
    int rank;
    unsigned element_bytes;
    unsigned swizzle;  ///< the swizzle span in bytes, 0 for none
    uint64_t dims[kMapRank];
    uint64_t strides[kMapRank];
    uint64_t box[kMapRank];
};

/// Reads and checks the tensor map at `map` for `what` (a copy of `rank` coordinates).
TensorMapInfo read_tensor_map(Fiber *f, const char *what, const void *map, int rank) {
    const auto m = reinterpret_cast<uintptr_t>(map);
    if (m % 16) {
        fail(f, format("%s: the tensor map at %#lx is not 16-byte aligned (pass a spio::TensorMap, "
                       "e.g. a `const __grid_constant__ spio::TensorMap` kernel parameter)",
                       what, static_cast<unsigned long>(m)));
    }
    if (g_rt.check) check_access(f, m, 16 * sizeof(uint64_t), false);  // a wild pointer fails here
    uint64_t w[16];
    std::memcpy(w, map, sizeof w);
    if (w[0] != kMapMagic) {
        fail(f, format("%s: the map at %#lx is not a tensor map made for the emulator "
                       "(spio.cuda.tensor_map.TensorMap.emulator_bytes): its first 8 bytes are "
                       "%#llx, not \"SPIOTMAP\" (a driver-encoded map runs only on a GPU)",
                       what, static_cast<unsigned long>(m),
                       static_cast<unsigned long long>(w[0])));
    }
    TensorMapInfo t{};
    t.address = static_cast<uintptr_t>(w[1]);
    t.rank = static_cast<int>(w[2] & 0xff);
    t.element_bytes = static_cast<unsigned>((w[2] >> 8) & 0xff);
    t.swizzle = static_cast<unsigned>((w[2] >> 16) & 0xffff);
    if (t.rank != rank) {
        fail(f, format("%s: the tensor map has rank %d, but the copy gives %d coordinates", what,
                       t.rank, rank));
    }
    const unsigned eb = t.element_bytes;
    if (eb != 1 && eb != 2 && eb != 4 && eb != 8) {
        fail(f, format("%s: the tensor map's element size must be 1, 2, 4 or 8 bytes, got %u",
                       what, eb));
    }
    if (t.swizzle != 0 && t.swizzle != 32 && t.swizzle != 64 && t.swizzle != 128) {
        fail(f, format("%s: the tensor map's swizzle must be 0, 32, 64 or 128 bytes, got %u",
                       what, t.swizzle));
    }
    for (int d = 0; d < kMapRank; ++d) {
        t.dims[d] = w[3 + d];
        t.strides[d] = d == 0 ? eb : w[8 + d - 1];
        t.box[d] = (w[12 + d / 2] >> (32 * (d % 2))) & 0xffffffffu;
        if (d >= rank) continue;
        if (t.dims[d] < 1 || t.dims[d] > (uint64_t(1) << 32)) {
            fail(f, format("%s: tensor map dim %d must be 1..2^32 elements, got %llu", what, d,
                           static_cast<unsigned long long>(t.dims[d])));
        }
        if (t.box[d] < 1 || t.box[d] > 256) {
            fail(f, format("%s: tensor map box dim %d must be 1..256 elements, got %llu", what, d,
                           static_cast<unsigned long long>(t.box[d])));
        }
    }
    if ((t.box[0] * eb) % 16) {
        fail(f, format("%s: a tensor map box's inner dim must span a multiple of 16 bytes, got "
                       "%llu",
                       what, static_cast<unsigned long long>(t.box[0] * eb)));
    }
    return t;
}

/// The instruction name of a tensor copy in (g2s) or, with `store`, out (s2g) of `rank`
/// coordinates (a string that lives as long as the program: pieces keep it); fails unless rank
/// is 1..kMapRank.
const char *tensor_copy_name(Fiber *f, bool store, int rank) {
    static const char *const names[2][kMapRank + 1] = {
        {"cp_async_bulk_tensor_g2s", "cp_async_bulk_tensor_1d_g2s", "cp_async_bulk_tensor_2d_g2s",
         "cp_async_bulk_tensor_3d_g2s", "cp_async_bulk_tensor_4d_g2s",
         "cp_async_bulk_tensor_5d_g2s"},
        {"cp_async_bulk_tensor_s2g", "cp_async_bulk_tensor_1d_s2g", "cp_async_bulk_tensor_2d_s2g",
         "cp_async_bulk_tensor_3d_s2g", "cp_async_bulk_tensor_4d_s2g",
         "cp_async_bulk_tensor_5d_s2g"}};
    if (rank < 1 || rank > kMapRank) {
        fail(f, format("%s: a tensor copy has 1 to %d coordinates, got %d", names[store][0],
                       kMapRank, rank));
    }
    return names[store][rank];
}

/// Reads the tensor map at `map` for tensor copy `what` of `rank` coordinates, and checks the box
/// at shared `smem`, the copy's destination (g2s) or its source (`store`: s2g): inside shared
/// memory, 128-byte aligned, and with a swizzle, rows of exactly the span from a multiple of the
/// pattern's repeat. Returns the map; *box_bytes gets the box's bytes.
TensorMapInfo check_tensor_copy(Fiber *f, const char *what, bool store, const void *map,
                                int rank, const void *smem, uint64_t *box_bytes) {
    const TensorMapInfo t = read_tensor_map(f, what, map, rank);
    const char *role = store ? "source" : "destination";
    const uint64_t eb = t.element_bytes;
    const uint64_t row_bytes = t.box[0] * eb;
    uint64_t rows = 1;
    for (int d = 1; d < rank; ++d) rows *= t.box[d];
    *box_bytes = rows * row_bytes;
    const std::string smem_what = std::string(what) + " " + role;
    require_shared(f, smem, *box_bytes, 128, smem_what.c_str());
    if (t.swizzle && row_bytes != t.swizzle) {
        fail(f, format("%s: a %u-byte swizzle needs a box inner dim of exactly %u bytes in the "
                       "emulator, got %llu (box dim 0 of %llu elements of %llu bytes); the GPU "
                       "accepts fewer, but then pads each row of the box in shared memory in a "
                       "way spio does not rely on",
                       what, t.swizzle, t.swizzle, static_cast<unsigned long long>(row_bytes),
                       static_cast<unsigned long long>(t.box[0]),
                       static_cast<unsigned long long>(eb)));
    }
    if (t.swizzle && reinterpret_cast<uintptr_t>(smem) % (8 * t.swizzle)) {
        // The GPU swizzles by address bits: from a box off the pattern's repeat the rows are
        // permuted differently from the first on. spio's kernels align to the repeat.
        fail(f, format("%s: a %u-byte swizzle's %s must be aligned to its repeat, %u bytes (8 "
                       "rows of its span), for the box to %s in the layout spio's buffers "
                       "expect; got %#lx",
                       what, t.swizzle, role, 8 * t.swizzle, store ? "be read" : "land",
                       static_cast<unsigned long>(reinterpret_cast<uintptr_t>(smem))));
    }
    return t;
}

/// Calls run(off, from, n) for every row of the box of `t` at `coords`, in landing order: runs of
/// `n` bytes at byte `off` of the box's unswizzled layout in shared memory, of tensor bytes from
/// global `from`, or lying outside the tensor (`from` null). Zero-length runs come too.
template <class Run>
void box_runs(const TensorMapInfo &t, const int *coords, Run run) {
    const uint64_t eb = t.element_bytes;
    const uint64_t row_bytes = t.box[0] * eb;
    uint64_t rows = 1;
    for (int d = 1; d < t.rank; ++d) rows *= t.box[d];
    // The in-bounds elements of every row: i0 in [lo0, hi0).
    const int64_t c0 = coords[0];
    const int64_t box0 = static_cast<int64_t>(t.box[0]);
    const int64_t lo0 = std::min(box0, std::max<int64_t>(0, -c0));
    const int64_t hi0 = std::max(lo0, std::min(box0, static_cast<int64_t>(t.dims[0]) - c0));
    for (uint64_t row = 0; row < rows; ++row) {
        // Row (i1, i2, ...), i1 fastest: inside the tensor along every outer dim, or not at all.
        uint64_t rest = row, src = 0;
        bool inside = hi0 > lo0;
        for (int dim = 1; dim < t.rank; ++dim) {
            const int64_t x = coords[dim] + static_cast<int64_t>(rest % t.box[dim]);
            rest /= t.box[dim];
            if (x < 0 || x >= static_cast<int64_t>(t.dims[dim])) {
                inside = false;
            } else {
                src += static_cast<uint64_t>(x) * t.strides[dim];
            }
        }
        const uint64_t base = row * row_bytes;
        if (!inside) {
            run(base, nullptr, row_bytes);
            continue;
        }
        const auto *from = reinterpret_cast<const char *>(t.address + src +
                                                          static_cast<uint64_t>(c0 + lo0) * eb);
        run(base, nullptr, static_cast<uint64_t>(lo0) * eb);
        run(base + static_cast<uint64_t>(lo0) * eb, from, static_cast<uint64_t>(hi0 - lo0) * eb);
        run(base + static_cast<uint64_t>(hi0) * eb, nullptr,
            static_cast<uint64_t>(box0 - hi0) * eb);
    }
}

/// Calls chunk(p, from, n) for the `n` bytes at byte `off` of the unswizzled layout of the box at
/// shared `box` (from global `from`, or null): where they lie in shared memory, at p. Swizzled,
/// 16-byte chunk by chunk: chunk bits [4, 4 + log2(S/16)) of the shared address XOR its bits
/// [7, ...).
template <class Chunk>
void swizzled_run(const TensorMapInfo &t, char *box, uint64_t off, const char *from, uint64_t n,
                  Chunk chunk) {
    if (!t.swizzle) {
        if (n) chunk(box + off, from, n);
        return;
    }
    const uint64_t chunk_mask = t.swizzle / 16 - 1;
    while (n) {
        const uint64_t take = std::min<uint64_t>(n, 16 - off % 16);
        uintptr_t a = reinterpret_cast<uintptr_t>(box) + off;
        a ^= ((a >> 7) & chunk_mask) << 4;
        chunk(reinterpret_cast<char *>(a), from, take);
        off += take;
        n -= take;
        if (from) from += take;
    }
}

/// Issues bulk tensor store `s` for fiber `f`. Checked: its pieces' global bytes lie inside the
/// kernel's tensors, and it writes them now in race terms (a race with earlier unordered
/// accesses); its box counts as read now; then, until a wait retires it, a write to its box
/// fails (Runtime::store_sources) and so does an access to its pieces' global bytes
/// (GRange::writing).
void start_store(Fiber *f, BulkStore &&s) {
    if (g_rt.check) {
        for (const BulkCopy &c : s.pieces) {
            const auto d = reinterpret_cast<uintptr_t>(c.dst);
            if (!in_global(d, c.bytes)) {
                fail(f, format("out-of-bounds global-memory access: %s writes %u bytes at %#lx, "
                               "outside every tensor passed to the kernel",
                               s.via, c.bytes, static_cast<unsigned long>(d)));
            }
            global_access(f, d, c.bytes, GKind::kStore, s.via);
        }
        const auto src = reinterpret_cast<uintptr_t>(s.src);
        std::size_t off;
        shared_region(src, s.bytes, &off);
        shadow_access(f, src, off, s.bytes, false, nullptr, false, true);  // (a race first)
        check_fenced(f, src, off, s.bytes, s.via);
        g_rt.store_sources.push_back({src, src + s.bytes, f->tid, s.via});
        for (const BulkCopy &c : s.pieces) count_dest(c.dst, c.bytes, 1);
    }
    f->stores.push_back(std::move(s));
}

/// Completes bulk tensor store `s` of fiber `f` (its wait retires it): copies its pieces. Checked,
/// its box counts as read by `f` again now, in race terms, and its global bytes as written, so
/// that other threads must order their accesses after the wait by a barrier.
void retire_store(Fiber *f, const BulkStore &s) {
    if (g_rt.check) {
        const auto src = reinterpret_cast<uintptr_t>(s.src);
        auto &sources = g_rt.store_sources;
        for (auto it = sources.begin(); it != sources.end(); ++it) {
            if (it->tid == f->tid && it->lo == src) {
                sources.erase(it);
                break;
            }
        }
        for (const BulkCopy &c : s.pieces) count_dest(c.dst, c.bytes, -1);
        std::size_t off;
        shared_region(src, s.bytes, &off);
        shadow_access(f, src, off, s.bytes, false, nullptr, false, true);
        for (const BulkCopy &c : s.pieces) {
            global_access(f, reinterpret_cast<uintptr_t>(c.dst), c.bytes, GKind::kStore, s.via);
        }
    }
    for (const BulkCopy &c : s.pieces) std::memcpy(c.dst, c.src, c.bytes);
}

}  // namespace detail

void cp_async_bulk_g2s(void *dst, const void *src, unsigned bytes, unsigned long long *bar) {
    Fiber *f = g_rt.cur;
    if (bytes == 0 || bytes % 16) {
        detail::fail(f, detail::format("cp_async_bulk_g2s needs a positive multiple of 16 bytes, "
                                       "got %u", bytes));
    }
    detail::require_shared(f, dst, bytes, 16, "cp_async_bulk_g2s destination");
    const auto s = reinterpret_cast<uintptr_t>(src);
    if (s % 16) {
        detail::fail(f, detail::format("cp_async_bulk_g2s source %#lx is not 16-byte aligned",
                                       static_cast<unsigned long>(s)));
    }
    auto *d = static_cast<char *>(dst);
    const detail::BulkCopy copy{d, static_cast<const char *>(src), bytes, "cp_async_bulk_g2s"};
    detail::start_bulk(f, "cp_async_bulk_g2s", d, bytes, bar, &copy, 1);
}

// A tensor copy lands box[0] x ... x box[rank-1] elements: box element (i0, i1, ...) lands at
// byte (i0 + box0 * (i1 + box1 * (i2 + ...))) * element_bytes from dst, swizzled, and comes from
// element (coords[0] + i0, coords[1] + i1, ...) of the tensor, or is zero where that lies outside
// it. The copy is issued as pieces on the 1-D copies' machinery (BulkCopy, landed with the phase):
// a contiguous run of source bytes, or of zeros, per piece; with a swizzle, at most a 16-byte
// chunk per piece, since the swizzle moves each chunk on its own.
void cp_async_bulk_tensor_g2s(void *dst, const void *map, int rank, const int *coords,
                              unsigned long long *bar) {
    Fiber *f = g_rt.cur;
    const char *what = detail::tensor_copy_name(f, false, rank);
    uint64_t box_bytes;
    const detail::TensorMapInfo t =
        detail::check_tensor_copy(f, what, false, map, rank, dst, &box_bytes);
    auto *d = static_cast<char *>(dst);
    std::vector<detail::BulkCopy> pieces;
    // Appends a piece, merged into the last one when it continues it (in shared memory, and in
    // global memory or as zeros).
    const auto add = [&](char *to, const char *from, uint64_t n) {
        if (!pieces.empty()) {
            detail::BulkCopy &last = pieces.back();
            const bool zeros = from == nullptr && last.src == nullptr;
            const bool data = from && last.src && last.src + last.bytes == from;
            if (last.dst + last.bytes == to && (zeros || data)) {
                last.bytes += static_cast<unsigned>(n);
                return;
            }
        }
        pieces.push_back({to, from, static_cast<unsigned>(n), what});
    };
    detail::box_runs(t, coords, [&](uint64_t off, const char *from, uint64_t n) {
        detail::swizzled_run(t, d, off, from, n, add);
    });
    // The landing bytes are exactly [dst, dst + box_bytes): dst is 128-byte aligned and a swizzled
    // row spans the swizzle S (checked above), so the swizzle permutes chunks within each S-byte
    // row.
    detail::start_bulk(f, what, d, box_bytes, bar, pieces.data(), pieces.size());
}

// A bulk tensor store reads the box from shared memory as a tensor copy lands it (the same
// layout and swizzle) and writes the elements inside the tensor, leaving out the rest. It is
// issued as pieces (BulkCopy from shared src to global dst; at most a 16-byte chunk each when
// swizzled) into the thread's open bulk group, and copies when a wait retires the group: a
// kernel that writes its source before the wait gets what it wrote, and the checks report it.
// Its box counts as read whole (which of a clipped box's bytes the copy engine reads is not
// modelled).
void cp_async_bulk_tensor_s2g(const void *map, int rank, const int *coords, const void *src) {
    Fiber *f = g_rt.cur;
    const char *what = detail::tensor_copy_name(f, true, rank);
    uint64_t box_bytes;
    const detail::TensorMapInfo t =
        detail::check_tensor_copy(f, what, true, map, rank, src, &box_bytes);
    auto *box = const_cast<char *>(static_cast<const char *>(src));
    detail::BulkStore store{box, box_bytes, {}, UINTPTR_MAX, 0, f->bulk_committed, what};
    std::vector<detail::BulkCopy> &pieces = store.pieces;
    // Appends a piece (from shared `at` to global `to`), merged into the last one when it
    // continues it in both memories.
    const auto add = [&](char *at, const char *to, uint64_t n) {
        auto *dst = const_cast<char *>(to);
        const auto lo = reinterpret_cast<uintptr_t>(dst);
        store.lo = std::min(store.lo, lo);
        store.hi = std::max(store.hi, lo + n);
        if (!pieces.empty()) {
            detail::BulkCopy &last = pieces.back();
            if (last.dst + last.bytes == dst && last.src + last.bytes == at) {
                last.bytes += static_cast<unsigned>(n);
                return;
            }
        }
        pieces.push_back({dst, at, static_cast<unsigned>(n), what});
    };
    detail::box_runs(t, coords, [&](uint64_t off, const char *to, uint64_t n) {
        if (to) detail::swizzled_run(t, box, off, to, n, add);  // outside the tensor: left out
    });
    detail::start_store(f, std::move(store));
}

void cp_async_bulk_commit_group() { ++g_rt.cur->bulk_committed; }

void cp_async_bulk_wait_group(int n, bool /*read*/) {
    Fiber *f = g_rt.cur;
    if (n < 0) {
        detail::fail(f, detail::format("cp_async_bulk_wait_group needs n >= 0, got %d", n));
    }
    const auto keep = static_cast<uint64_t>(n);
    const uint64_t limit = f->bulk_committed > keep ? f->bulk_committed - keep : 0;
    // Stores are in issue order, so in group order: the retired ones come first. They leave the
    // thread's list before they copy, so that their global writes are not taken for accesses to
    // stores in flight.
    auto first = f->stores.begin(), last = first;
    while (last != f->stores.end() && last->group < limit) ++last;
    if (first == last) return;
    std::vector<detail::BulkStore> retired(std::make_move_iterator(first),
                                           std::make_move_iterator(last));
    f->stores.erase(first, last);
    for (const detail::BulkStore &s : retired) detail::retire_store(f, s);
}

bool mbarrier_try_wait_parity(unsigned long long *bar, unsigned parity) {
    Fiber *f = g_rt.cur;
    detail::MBarrier &b = detail::mbarrier_at(f, bar, "mbarrier_try_wait_parity");
    if (b.pending == 0) {  // every arrival is in: the phase's copies land now
        detail::land(b, reinterpret_cast<uintptr_t>(bar));
        if (b.tx < 0) {
            detail::fail(f, detail::format("bulk copies on the mbarrier at %#lx moved %lld bytes "
                                           "more than mbarrier_arrive_expect_tx announced",
                                           reinterpret_cast<unsigned long>(bar), -b.tx));
        }
        if (b.tx == 0) {
            b.phase ^= 1;
            b.pending = b.expected;
            ++b.completed;
            g_rt.mbarrier_spins = 0;
        }
    }
    if (b.phase != (parity & 1)) {  // the phase with this parity has completed
        if (g_rt.check) {  // the thread has seen every phase up to it complete
            if (b.seen.size() < static_cast<std::size_t>(g_rt.nthreads)) {
                b.seen.resize(g_rt.nthreads);
            }
            b.seen[f->tid] = b.completed;
        }
        return true;
    }
    // Not yet: let the other threads run. A wait that no thread can ever end is a deadlock: every
    // fiber that ran since has only failed mbarrier waits, many times over.
    if (++g_rt.mbarrier_spins > 64ull * g_rt.nthreads + 1024) {
        detail::fail(f, detail::format("mbarrier wait never ends: phase parity %u of the "
                                       "mbarrier at %#lx has %u of %u arrivals left and %lld "
                                       "announced bytes not copied, and no thread changes it",
                                       parity & 1, reinterpret_cast<unsigned long>(bar),
                                       b.pending, b.expected, b.tx));
    }
    f->state = detail::State::kRunnable;
    g_rt.spun = true;
    detail::switch_to_scheduler(f);
    detail::g_thread_idx = f->idx;
    return false;
}

void cp_async_wait_all() { detail::cp_async_wait(-1); }

}  // namespace emu
}  // namespace spio

// ---------------------------------------------------------------------------------------------
// Exports for Python and the instrumentation callbacks
// ---------------------------------------------------------------------------------------------

SPIO_EMU_EXPORT const char *spio_emu_last_error() { return spio::emu::g_rt.error.c_str(); }
/// Which context switch the fibers use: "asm" (fiber_switch_x86_64.S) or "ucontext".
SPIO_EMU_EXPORT const char *spio_emu_fiber_switch() { return SPIO_EMU_ASM_SWITCH ? "asm" : "ucontext"; }

/// Bytes of static shared memory in this library (every kernel's __shared__ variables together).
SPIO_EMU_EXPORT uint64_t spio_emu_static_shared_bytes() {
    return static_cast<uint64_t>(spio::emu::detail::g_tls_arena_end -
                                 (spio::emu::detail::g_tls_arena_begin +
                                  sizeof spio::emu::detail::g_tls_arena_begin));
}

/// Bytes of race-detection record per byte of shared memory (`global` 0) or of a registered
/// tensor (`global` 1) in a checked launch. Every checked access reads and writes its bytes'
/// records, so their size shows in a checked launch's time (a test holds them to 32 and 20).
SPIO_EMU_EXPORT uint32_t spio_emu_shadow_bytes(int global) {
    return global ? sizeof(spio::emu::detail::GShadow) : sizeof(spio::emu::detail::Shadow);
}

namespace {
inline void on_access(unsigned long addr, std::size_t n, bool write) {
    spio::emu::detail::Fiber *f = spio::emu::g_rt.cur;
    if (f == nullptr || !spio::emu::g_rt.check) return;  // host code (launch glue) is not checked
    spio::emu::detail::check_access(f, addr, n, write);
}
}  // namespace

// -fsanitize=alignment instrumentation of a checked kernel (build.py; GCC's and clang's): a call
// where a pointer dereferenced, or a reference bound, is not aligned as its type requires (a
// uint4 at an 8-byte boundary), which a GPU faults on ("misaligned address"). The data is the
// sanitizer's: where, the type, log2 of its alignment, and what the code did.
namespace {
struct UbsanLocation {
    const char *file;
    uint32_t line, column;
};
struct UbsanType {
    uint16_t kind, info;
    char name[1];
};
struct UbsanTypeMismatch {
    UbsanLocation where;
    const UbsanType *type;
    unsigned char log_alignment, check_kind;  // 0: a load, 1: a store, 2..4: see on_misaligned
};
void on_misaligned(const UbsanTypeMismatch *data, unsigned long addr) {
    spio::emu::detail::Fiber *f = spio::emu::g_rt.cur;
    if (f == nullptr || !spio::emu::g_rt.check || data == nullptr) return;  // (host code)
    const unsigned long align = 1ul << data->log_alignment;
    if (addr % align == 0) return;  // (a null pointer's call: that check is not compiled in)
    const char *file = data->where.file ? std::strrchr(data->where.file, '/') : nullptr;
    static const char *const kHow[] = {"reads", "writes", "binds a reference to",
                                        "accesses a member of", "calls a member function of"};
    const char *how = data->check_kind < 5 ? kHow[data->check_kind] : "uses";
    spio::emu::detail::fail(f, spio::emu::detail::format(
        "misaligned address: %s %s at %#lx, not %lu-byte aligned as its type needs (a GPU "
        "faults), at %s:%u", how, data->type ? data->type->name : "a value", addr, align,
        file ? file + 1 : (data->where.file ? data->where.file : "?"), data->where.line));
}
}  // namespace
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1(void *data,
                                                                                      void *ptr) {
    on_misaligned(static_cast<const UbsanTypeMismatch *>(data), reinterpret_cast<unsigned long>(ptr));
}
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1_abort(
    void *data, void *ptr) {
    on_misaligned(static_cast<const UbsanTypeMismatch *>(data), reinterpret_cast<unsigned long>(ptr));
}

// -fsanitize=thread instrumentation (GCC's and clang's): a call before every load and store, with
// its address (sizes 1..16 that are powers of two; clang calls the `unaligned` ones where it cannot
// prove the alignment) or address and size (the rest). Function entry and exit are not
// instrumented, and volatile accesses call these same callbacks (see build.py).
#define SPIO_EMU_CALLBACKS(n)                                                                      \
    extern "C" __attribute__((visibility("hidden"))) void __tsan_read##n(void *addr) {            \
        on_access(reinterpret_cast<unsigned long>(addr), n, false);                                \
    }                                                                                              \
    extern "C" __attribute__((visibility("hidden"))) void __tsan_write##n(void *addr) {           \
        on_access(reinterpret_cast<unsigned long>(addr), n, true);                                 \
    }                                                                                              \
    extern "C" __attribute__((visibility("hidden"))) void __tsan_unaligned_read##n(void *addr) {  \
        on_access(reinterpret_cast<unsigned long>(addr), n, false);                                \
    }                                                                                              \
    extern "C" __attribute__((visibility("hidden"))) void __tsan_unaligned_write##n(void *addr) { \
        on_access(reinterpret_cast<unsigned long>(addr), n, true);                                 \
    }
SPIO_EMU_CALLBACKS(1)
SPIO_EMU_CALLBACKS(2)
SPIO_EMU_CALLBACKS(4)
SPIO_EMU_CALLBACKS(8)
SPIO_EMU_CALLBACKS(16)
#undef SPIO_EMU_CALLBACKS

extern "C" __attribute__((visibility("hidden"))) void __tsan_read_range(void *addr,
                                                                        unsigned long n) {
    on_access(reinterpret_cast<unsigned long>(addr), n, false);
}
extern "C" __attribute__((visibility("hidden"))) void __tsan_write_range(void *addr,
                                                                         unsigned long n) {
    on_access(reinterpret_cast<unsigned long>(addr), n, true);
}

// clang (16 and newer) replaces memset, memcpy and memmove in the instrumented object by these,
// which must do the work as well (GCC leaves those calls to the C library, unchecked).
extern "C" __attribute__((visibility("hidden"))) void *__tsan_memset(void *dst, int value,
                                                                     std::size_t n) {
    on_access(reinterpret_cast<unsigned long>(dst), n, true);
    return std::memset(dst, value, n);
}
extern "C" __attribute__((visibility("hidden"))) void *__tsan_memcpy(void *dst, const void *src,
                                                                     std::size_t n) {
    on_access(reinterpret_cast<unsigned long>(src), n, false);
    on_access(reinterpret_cast<unsigned long>(dst), n, true);
    return std::memcpy(dst, src, n);
}
extern "C" __attribute__((visibility("hidden"))) void *__tsan_memmove(void *dst, const void *src,
                                                                      std::size_t n) {
    on_access(reinterpret_cast<unsigned long>(src), n, false);
    on_access(reinterpret_cast<unsigned long>(dst), n, true);
    return std::memmove(dst, src, n);
}
/// Called by the instrumented object's constructor: nothing to set up.
extern "C" __attribute__((visibility("hidden"))) void __tsan_init() {}
