
// ---------------------------------------------------------------------------------------------------------------
// Tensor-core helpers of gdn_tc.cu, attn_tc.cu and gdn_prep_tc.cu (runtime.rs concatenates the sources, this file
// before those three): TF32 rounding and the 3xTF32 split, the m16n8k8 TF32 and m16n8k16 bf16 / f16 mma,
// ldmatrix, cp.async.
// ---------------------------------------------------------------------------------------------------------------

// The TF32 bits of an f32's bits: round to nearest, ties away, as cvt.rna.tf32.f32 does for finite values, with
// integer ops (measured on an H200: this split instead of cvt.rna, with division-free tile copies, took the
// 3,400-token state pass of the 0.8B shape from 502 to 327 µs).
__device__ __forceinline__ unsigned tc_tf32_bits(unsigned u) { return (u + 0x1000u) & 0xffffe000u; }
__device__ __forceinline__ unsigned tc_tf32(float x) { return tc_tf32_bits(__float_as_uint(x)); }
// x = big + small (the 3xTF32 split): big = TF32(x) rounded to nearest (ties away, as cvt.rna; finite x), small =
// x - big exactly in f32, passed as is (the tensor core reads its top 19 bits): |x - big - tf32(small)| <= 2^-21 |x|,
// and the dropped small*small term of a product is below 2^-22 relative. Rounding small too (two more integer ops on
// the chain from each operand load to its mma, as the gated delta kernels did until run s11c) tightens the first bound
// to 2^-22 and cost 4-5% of their time (H200, 0.8B heads, 3xTF32: state pass 1 x 3,400 307.5 -> 292.3 µs, pre-pass
// 137 -> 131; largest state-pass output error against the CPU 1.86e-7 either way, final states 5.0e-7 -> 5.1e-7).
__device__ __forceinline__ void tc_split(float x, unsigned& big, unsigned& small) {
    big = tc_tf32(x);
    small = __float_as_uint(x - __uint_as_float(big));
}
// c[16x8] += a[16x8] · b[8x8], TF32 in, f32 accumulation. Fragments (PTX ISA layouts; g = lane >> 2, t = lane & 3):
// a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (k t, n g), b1 (k t+4, n g); c0 (g, 2t), c1 (g, 2t+1),
// c2 (g+8, 2t), c3 (g+8, 2t+1).
__device__ __forceinline__ void tc_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c[16x8] += a[16x16] · b[16x8], bf16 in (two per register, the lower k index in the low half), f32
// accumulation. Fragments: a0 (g, 2t..2t+1), a1 (g+8, 2t..2t+1), a2 (g, 2t+8..2t+9), a3 (g+8, 2t+8..2t+9);
// b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g); c as tc_mma.
__device__ __forceinline__ void tc_mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c[16x8] += a[16x16] · b[16x8], f16 in (fragments as tc_mma_bf16), f32 accumulation.
__device__ __forceinline__ void tc_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two f32 values as an f16 pair rounded to nearest even, x in the low half (the lower k index of a fragment).
__device__ __forceinline__ unsigned tc_f16x2(float x, float y) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    return r;
}
// ldmatrix .x4: four 8x8 matrices of 16-bit values from shared memory, lane l giving the address of row l & 7 of
// matrix l >> 3 (16 contiguous bytes); register i gets matrix i, lane (g, t) holding its row g, columns 2t and 2t + 1
// (TRANS: rows 2t and 2t + 1 of column g).
template <bool TRANS>
__device__ __forceinline__ void tc_ldsm4(unsigned addr, unsigned (&r)[4]) {
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}
// c += a · b with both operands split: X3 (3xTF32) the small products first, the big one last; !X3 (1xTF32) the
// big one only (the small halves are then dead code wherever the caller computed them).
template <bool X3>
__device__ __forceinline__ void tc_mma3(float* c, const unsigned* ab, const unsigned* as, unsigned bb0, unsigned bb1,
                                        unsigned bs0, unsigned bs1) {
    if (X3) {
        tc_mma(c, as, bb0, bb1);
        tc_mma(c, ab, bs0, bs1);
    }
    tc_mma(c, ab, bb0, bb1);
}

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned tc_smem_addr(const void* p) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(p));
    return (unsigned)s;
}
// cp.async of 16 / 4 bytes global -> shared; the bytes past `bytes` are zero-filled (bytes 0: nothing read).
__device__ __forceinline__ void tc_cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_cp16(float* dst, const void* src, int bytes) {
    tc_cp16(tc_smem_addr(dst), src, bytes);
}
__device__ __forceinline__ void tc_cp4(float* dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(tc_smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups (the newest) are still in flight.
template <int N>
__device__ __forceinline__ void tc_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
