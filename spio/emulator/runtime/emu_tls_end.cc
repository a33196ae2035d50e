/// Last object of every emulator library: its TLS guard closes the static shared-memory arena.
///
/// The link order is runtime object (opening guard), kernel object, this object, so the kernel's
/// thread_local __shared__ variables lie between the two guards in the library's TLS block.

namespace spio {
namespace emu {
namespace detail {

/// Closing guard of the static shared-memory arena; any access to it is out of bounds.
__attribute__((visibility("hidden"), aligned(16))) __thread char g_tls_arena_end[64];

}  // namespace detail
}  // namespace emu
}  // namespace spio
