#ifndef SPIO_WARP_LDMATRIX_H_
#define SPIO_WARP_LDMATRIX_H_

/// Warp-wide loads of 8x8 matrices of 16-bit elements from shared memory (ldmatrix).
///
/// Every lane of the warp calls these together (ldmatrix.sync.aligned). row_ptr is the calling
/// lane's generic pointer into shared memory: lanes 8j..8j+7 give the addresses of rows 0..7 of
/// matrix j (x1 reads lanes 0-7, x2 lanes 0-15, x4 all 32; other lanes' pointers are ignored).
/// Each row is 16 contiguous bytes (8 elements) and must be 16-byte aligned.
/// Without .trans, lane l receives in d[j] row l >> 2, columns 2(l % 4) and 2(l % 4) + 1 of
/// matrix j (lower column in the low half). With .trans it receives rows 2(l % 4) and
/// 2(l % 4) + 1 of column l >> 2, i.e. the same positions of the transposed matrix.

#include "spio/macros.h"

namespace spio {

/// Returns the matrix whose row address lane `lane` gives to an ldmatrix of N matrices (.xN).
///
/// Parameters:
///   N: the number of matrices of the load, 1, 2 or 4.
///   lane: the lane's index in the warp.
/// Returns:
///   the matrix, 0..N-1: (lane / 8) % N. Lanes 8N and above give no address; theirs wrap around
///   to a matrix of the N.
template <int N>
SPIO_HOST_DEVICE constexpr int ldmatrix_matrix(int lane) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix reads 1, 2 or 4 matrices");
    return (lane / 8) % N;
}

/// Returns the row whose address lane `lane` gives to an ldmatrix of N matrices (.xN).
///
/// The matrices' rows are counted in order (matrix j's rows 0..7 being rows 8j..8j+7). So
/// ldmatrix_row<1> is the row within the lane's own matrix, whatever the N of the load, and
/// ldmatrix_row<2> the row of a 16-row operand (the A of an m16n8k8) that an .x2 reads.
///
/// Parameters:
///   N: the number of matrices whose rows are counted, 1, 2 or 4.
///   lane: the lane's index in the warp.
/// Returns:
///   the row, counted over the N matrices: lane % (8 N).
template <int N>
SPIO_HOST_DEVICE constexpr int ldmatrix_row(int lane) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix reads 1, 2 or 4 matrices");
    return lane % (8 * N);
}

/// Loads one 8x8 matrix from shared memory (ldmatrix.sync.aligned.m8n8.x1.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x1(unsigned (&d)[1], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(d[0])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x1(d, row_ptr);
#endif
}

/// Loads two 8x8 matrices from shared memory (ldmatrix.sync.aligned.m8n8.x2.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x2(unsigned (&d)[2], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(d[0]), "=r"(d[1])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x2(d, row_ptr);
#endif
}

/// Loads four 8x8 matrices from shared memory (ldmatrix.sync.aligned.m8n8.x4.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x4(unsigned (&d)[4], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x4(d, row_ptr);
#endif
}

/// Loads one 8x8 matrix from shared memory, transposed
/// (ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j transposed.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x1_trans(unsigned (&d)[1], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(d[0])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x1_trans(d, row_ptr);
#endif
}

/// Loads two 8x8 matrices from shared memory, transposed
/// (ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j transposed.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x2_trans(unsigned (&d)[2], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(d[0]), "=r"(d[1])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x2_trans(d, row_ptr);
#endif
}

/// Loads four 8x8 matrices from shared memory, transposed
/// (ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16).
///
/// Parameters:
///   d: d[j] receives the lane's two elements of matrix j transposed.
///   row_ptr: this lane's row address in shared memory (see the file comment).
/// Assumes:
///   every lane of the warp calls it together; each row is 16-byte aligned in shared memory.
SPIO_DEVICE void ldmatrix_x4_trans(unsigned (&d)[4], const void *row_ptr) {
#if defined(__CUDA_ARCH__)
    const unsigned smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(row_ptr));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(smem_addr));
#else
    ::spio::emu::ldmatrix_x4_trans(d, row_ptr);
#endif
}

}  // namespace spio

#endif  // SPIO_WARP_LDMATRIX_H_
