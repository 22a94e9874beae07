// A bench of the one-row PQ2_0 GEMV (decode's `gemv_pq2_wide_split`, quant.cu, with qgemm.rs's grid) and variants
// of it written here, on the 27B shape's matrices, outside the engine: random codes and scales, split activations,
// enough copies of each matrix that every call reads from HBM (not the 50 MB L2), the device-to-device copy bandwidth
// measured in the same run. Each kernel's output is checked against an f64 sum on sampled rows (the error over the
// largest |y|, flagged above 1e-4). How the engine's kernel was found (docs/benchmarks/ternary-gpu.md); the variant
// now, the int8 tensor-core GEMV, was measured slower. Built and run on the GPU machine (or
// here with the PyPI nvcc, nvvm, cuda-runtime and cuda-crt wheels unpacked as tools/cuda/ptx-check.py says):
//   nvcc -O3 -std=c++17 -arch=sm_90 -cudart static -diag-suppress 1556 -o /tmp/gemv-lab tools/cuda/gemv-lab.cu
//   /tmp/gemv-lab                      every shape and variant, a table
//   /tmp/gemv-lab SHAPE VARIANT        the engine's kernel and one variant on one shape, a few calls (for ncu -k)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
#include <cmath>

#include "lab.h"

#include "../../crates/cuda/src/kernels.cu"
#include "../../crates/cuda/src/decode.cu"
#include "../../crates/cuda/src/tc_common.cu"
#include "../../crates/cuda/src/quant.cu"
#include "../../crates/cuda/src/qmma.cu"

// The one-row PQ2_0 GEMV on the int8 tensor cores (m16n8k32): A = 16 weight rows x 32 codes (after one shift and
// mask), B = x's hi and lo byte planes as columns 0 and 1 (the other 6 columns unused), so that one mma takes 512
// weights of both planes. x is quantized once per block into shared memory in B-fragment order (per 128-value group
// g and class j: 8 lanes x 2 words) with each group's scale and Σ q. A warp takes 4 groups (a chunk) of a 16-row
// tile: thread (r = lane / 4, t = lane % 4) loads 8 code bytes of rows r and r + 8 per group (columns 32 t ..),
// class j of both words makes its A fragment; C's columns 0 and 1 (lanes t = 0) are the hi and lo sums of rows r,
// r + 8, combined in int32, scaled per group into f32. The warps' chunks of a tile are added in shared memory in warp
// order. Rows per block a multiple of 16, N >= 16, K a multiple of 512, every K in one call.
__global__ void __launch_bounds__(768) gemv_mma(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                                const void* __restrict__ x, long long lo, int K, int ldk, int N,
                                                float* __restrict__ y, float beta, int rpb) {
    extern __shared__ unsigned sm_b[];  // [K / 128][4][8][2] B words, then [K / 128] {scale, Σ q}
    __shared__ float part[2][32][16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int ng = K / 128, chunks = ng / 4;
    float2* sq = (float2*)(sm_b + ng * 64);
    // x into B fragments: slot s = (group s / 4, quarter s % 4), 32 values each, 4 consecutive threads a group.
    for (int s0 = 0; s0 < ng * 4; s0 += blockDim.x) {
        int s = s0 + threadIdx.x;
        bool ok = s < ng * 4;
        float xv[32];
        if (ok) {
#pragma unroll
            for (int i = 0; i < 32; i += 16) load_x16<2>(x, (idx_t)s * 32 + i, lo, xv + i);
        } else {
#pragma unroll
            for (int i = 0; i < 32; i++) xv[i] = 0.0f;
        }
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(xv[i]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        // |q| <= 32639: the high byte (q + 128) >> 8 stays within int8.
        float inv = m > 0.0f ? 32639.0f / m : 0.0f;
        int qsum = 0;
        unsigned hw[2][4], lw[2][4];
#pragma unroll
        for (int w = 0; w < 2; w++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned h = 0u, l = 0u;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    int qv = __float2int_rn(xv[16 * w + 4 * b + j] * inv);
                    qsum += qv;
                    int hi = (qv + 128) >> 8, lv = qv - 256 * hi;
                    h |= (unsigned)(hi & 0xff) << (8 * b);
                    l |= (unsigned)(lv & 0xff) << (8 * b);
                }
                hw[w][j] = h, lw[w][j] = l;
            }
        qsum += __shfl_xor_sync(0xffffffffu, qsum, 1);
        qsum += __shfl_xor_sync(0xffffffffu, qsum, 2);
        if (ok) {
            int g = s >> 2, t = s & 3;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned* o = sm_b + (g * 4 + j) * 16;
                o[2 * t] = hw[0][j], o[2 * t + 1] = hw[1][j];
                o[8 + 2 * t] = lw[0][j], o[8 + 2 * t + 1] = lw[1][j];
            }
            if (t == 0) sq[g] = make_float2(m / 32639.0f, __int_as_float(qsum));
        }
    }
    const int r = lane >> 2, t = lane & 3;
    const unsigned rb = (unsigned)(ldk / 4), rs = (unsigned)(ldk / 128);
    const int n0 = blockIdx.x * rpb, n1 = min(n0 + rpb, N);
    const int mine = warp < chunks ? (chunks - warp + warps - 1) / warps : 0;
    const int tiles = (n1 - n0 + 15) / 16, items = tiles * mine;
    // One item: the 16-row tile from nt, chunk c.
    auto load = [&](int nt, int c, uint2* cw, uint2* sc) {
        int r0 = min(nt, N - 16);
        const unsigned char* p = q + (idx_t)(r0 + r) * rb + c * 128 + 8 * t;
#pragma unroll
        for (int gi = 0; gi < 4; gi++) {
            uint4 a = ld_stream_v2(p + 32 * gi), b2 = ld_stream_v2(p + 8 * (idx_t)rb + 32 * gi);
            cw[2 * gi] = make_uint2(a.x, a.y), cw[2 * gi + 1] = make_uint2(b2.x, b2.y);
        }
        const unsigned short* ps = d + (idx_t)(r0 + r) * rs + c * 4;
        uint4 s0v = ld_stream_v2(ps), s1v = ld_stream_v2(ps + 8 * (idx_t)rs);
        sc[0] = make_uint2(s0v.x, s0v.y), sc[1] = make_uint2(s1v.x, s1v.y);
    };
    uint2 cw[8], sc[2];
    if (items > 0) load(n0, warp, cw, sc);
    __syncthreads();
    float acc0 = 0.0f, acc1 = 0.0f;
    int buf = 0;
    // Every warp walks the block's tiles (a warp with no chunk adds zeros) so that the barriers line up.
    for (int ti = 0; ti < tiles; ti++) {
        for (int k = 0; k < mine; k++) {
            int i = ti * mine + k;
            uint2 nw[8], ns[2];
            if (i + 1 < items) {
                bool same = k + 1 < mine;
                load(n0 + (ti + (same ? 0 : 1)) * 16, warp + (same ? k + 1 : 0) * warps, nw, ns);
            }
            int c = warp + k * warps;
            // The 4 groups' mma chains interleaved (class j of every group, then j + 1): 4 independent chains
            // instead of one of 16 dependent mmas.
            int acc[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int gi = 0; gi < 4; gi++) {
                    int g = c * 4 + gi;
                    unsigned a[4];
                    a[0] = (cw[2 * gi].x >> (2 * j)) & 0x03030303u;
                    a[1] = (cw[2 * gi + 1].x >> (2 * j)) & 0x03030303u;
                    a[2] = (cw[2 * gi].y >> (2 * j)) & 0x03030303u;
                    a[3] = (cw[2 * gi + 1].y >> (2 * j)) & 0x03030303u;
                    uint2 bb = *(const uint2*)(sm_b + (g * 4 + j) * 16 + 2 * (lane & 7));
                    if (j == 0)
                        qmma_s8s8_z(acc[gi], a, bb.x, bb.y);
                    else
                        qmma_s8s8(acc[gi], a, bb.x, bb.y);
                }
#pragma unroll
            for (int gi = 0; gi < 4; gi++) {
                int g = c * 4 + gi;
                float2 xq = sq[g];
                int qs = __float_as_int(xq.y);
                int v0 = acc[gi][0] * 256 + acc[gi][1] - qs, v1 = acc[gi][2] * 256 + acc[gi][3] - qs;
                unsigned s0w = gi < 2 ? sc[0].x : sc[0].y, s1w = gi < 2 ? sc[1].x : sc[1].y;
                unsigned short h0 = (gi & 1) ? (unsigned short)(s0w >> 16) : (unsigned short)(s0w & 0xffff);
                unsigned short h1 = (gi & 1) ? (unsigned short)(s1w >> 16) : (unsigned short)(s1w & 0xffff);
                acc0 = fmaf((float)v0, xq.x * h2f(h0), acc0);
                acc1 = fmaf((float)v1, xq.x * h2f(h1), acc1);
            }
            if (i + 1 < items) {
#pragma unroll
                for (int u = 0; u < 8; u++) cw[u] = nw[u];
                sc[0] = ns[0], sc[1] = ns[1];
            }
        }
        if (t == 0) part[buf][warp][r] = acc0, part[buf][warp][r + 8] = acc1;
        acc0 = acc1 = 0.0f;
        __syncthreads();
        int nt = n0 + ti * 16, r0 = min(nt, N - 16);
        if (threadIdx.x < 16) {
            int row = r0 + (int)threadIdx.x;
            if (row >= nt && row < n1) {
                float s = 0.0f;
                for (int w = 0; w < warps; w++) s += part[buf][w][threadIdx.x];
                float* yo = y + row;
                *yo = beta != 0.0f ? s + beta * *yo : s;
            }
        }
        buf ^= 1;
    }
}

struct Shape {
    const char* name;
    int n, k;
};
struct Variant {
    const char* name;
    bool lab;  // the mma kernel (else the engine's)
    int wps;   // the mma kernel's resident warps a multiprocessor
};
int main(int argc, char** argv) {
    const Shape shapes[] = {{"gate|up", 34816, 5120}, {"down", 5120, 17408}, {"gdn qkv|z", 16384, 5120},
                            {"gdn out", 5120, 6144},  {"attn q|k|v", 14336, 5120}, {"head", 248320, 5120}};
    const Variant variants[] = {
        {"engine", false, 0},
        {"mma, 16 warps/SM", true, 16},
        {"mma, 20 warps/SM", true, 20},
        {"mma, 24 warps/SM", true, 24},
        {"mma, 32 warps/SM", true, 32},
    };
    const int nv = sizeof(variants) / sizeof(variants[0]), ns = sizeof(shapes) / sizeof(shapes[0]);
    int only_s = -1, only_v = -1;
    if (argc == 3) only_s = atoi(argv[1]), only_v = atoi(argv[2]);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaFuncSetAttribute(gemv_mma, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Copy bandwidth (read + write) over 1 GiB.
    double copy_gbs = 0;
    if (only_s < 0) {
        size_t bytes = 1ull << 30;
        void *a, *b;
        CK(cudaMalloc(&a, bytes));
        CK(cudaMalloc(&b, bytes));
        CK(cudaMemset(a, 1, bytes));
        CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        float best = 1e9;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0));
            CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms);
        }
        copy_gbs = 2.0 * bytes / (best * 1e-3) / 1e9;
        printf("copy bandwidth (read + write): %.0f GB/s; %d multiprocessors\n", copy_gbs, sms);
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    for (int si = 0; si < ns; si++) {
        if (only_s >= 0 && si != only_s) continue;
        const Shape s = shapes[si];
        size_t code_bytes = (size_t)s.n * s.k / 4, scale_bytes = (size_t)s.n * (s.k / 128) * 2;
        size_t mat = code_bytes + scale_bytes;
        int copies = only_s >= 0 ? 1 : (int)std::max<size_t>(2, (400ull << 20) / mat + 1);
        std::vector<unsigned char*> qs(copies);
        std::vector<unsigned short*> ds(copies);
        std::vector<unsigned char> hq(code_bytes);
        std::vector<unsigned short> hd(scale_bytes / 2);
        unsigned long long st = 0x9E3779B97F4A7C15ull * (si + 1);
        auto rnd = [&]() {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            return st;
        };
        for (auto& c : hq) {
            // codes 0..2 (values -1, 0, 1), four to a byte
            unsigned char b = 0;
            for (int j = 0; j < 4; j++) b |= (unsigned char)((rnd() % 3) << (2 * j));
            c = b;
        }
        for (auto& h : hd) h = (unsigned short)(0x2000 + (rnd() % 0x400));  // f16 about 2^-7
        for (int c = 0; c < copies; c++) {
            CK(cudaMalloc(&qs[c], code_bytes));
            CK(cudaMalloc(&ds[c], scale_bytes));
            CK(cudaMemcpy(qs[c], hq.data(), code_bytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds[c], hd.data(), scale_bytes, cudaMemcpyHostToDevice));
        }
        std::vector<unsigned short> hx(2 * (size_t)s.k);
        for (size_t i = 0; i < hx.size(); i++) {
            float v = ((float)(rnd() % 20001) - 10000.0f) / 10000.0f;
            if (i >= (size_t)s.k) v *= 1.0f / 512.0f;
            hx[i] = bf_trunc(v);
        }
        std::vector<float> xval(s.k);
        for (int k = 0; k < s.k; k++) xval[k] = bf_host(hx[k]) + bf_host(hx[k + s.k]);
        void* dx;
        float* y;
        CK(cudaMalloc(&dx, hx.size() * 2));
        CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&y, (size_t)s.n * 4));
        int warps = s.k / 1024;
        std::vector<float> hy(s.n);
        for (int vi = 0; vi < nv; vi++) {
            if (only_v >= 0 && vi != only_v && vi != 0) continue;
            const Variant v = variants[vi];
            // engine: qgemm.rs's grid; mma: K / 512 chunks over at most 24 warps, v.wps resident warps a multiprocessor.
            int chunks = s.k / 512, mw = chunks <= 24 ? chunks : (chunks + (chunks + 23) / 24 - 1) / ((chunks + 23) / 24);
            int bw = !v.lab ? warps : mw, tile = !v.lab ? 8 : 16;
            int per_sm = !v.lab ? std::max((warps <= 5 ? 20 : 16) / warps, 1) : std::max(v.wps / mw, 1);
            int blocks = sms * per_sm;
            int rpb = (s.n + blocks - 1) / blocks;
            rpb = (rpb + tile - 1) / tile * tile;
            int grid = (s.n + rpb - 1) / rpb;
            size_t smem = (size_t)(s.k / 128) * (256 + 8);
            float* out = y;
            auto launch = [&](int c) {
                if (!v.lab)
                    gemv_pq2_wide_split<<<grid, 32 * warps>>>(qs[c], ds[c], dx, s.k, s.k, s.k, s.n, out, 0.0f, rpb);
                else
                    gemv_mma<<<grid, 32 * mw, smem>>>(qs[c], ds[c], dx, s.k, s.k, s.k, s.n, out, 0.0f, rpb);
            };
            launch(0);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hy.data(), out, (size_t)s.n * 4, cudaMemcpyDeviceToHost));
            // Against the exact sum (double) on sampled rows and the last 16: the error over the largest |y|.
            double err = 0, big = 0;
            for (int r = 0; r < s.n; r++) {
                if (r % 61 != 0 && r < s.n - 16) continue;
                double t = 0;
                for (int k = 0; k < s.k; k++) {
                    int code = (hq[(size_t)r * s.k / 4 + k / 4] >> (2 * (k % 4))) & 3;
                    float xf = xval[k];
                    t += (double)(code - 1) * h2f_host(hd[(size_t)r * (s.k / 128) + k / 128]) * xf;
                }
                err = std::max(err, fabs(t - hy[r]));
                big = std::max(big, fabs(t));
            }
            double rel = err / (big > 0 ? big : 1);
            if (only_s >= 0) {
                for (int r = 0; r < 3; r++) launch(0);
                CK(cudaDeviceSynchronize());
                continue;
            }
            const int calls = 60;
            std::vector<float> per;
            for (int rep = 0; rep < 7; rep++) {
                CK(cudaEventRecord(e0));
                for (int i = 0; i < calls; i++) launch(i % copies);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                per.push_back(ms * 1e3f / calls);
            }
            std::sort(per.begin(), per.end());
            float us = per[per.size() / 2];
            printf("%-10s %-26s %8.2f us  %5.0f GB/s  %4.1f%% of copy  err %.1e%s  (grid %d x %d warps, rpb %d)\n",
                   s.name, v.name, us, mat / (us * 1e-6) / 1e9, 100.0 * mat / (us * 1e-6) / 1e9 / copy_gbs, rel,
                   rel > 1e-4 ? " TOO LARGE" : "", grid, bw, rpb);
        }
        for (int c = 0; c < copies; c++) {
            CK(cudaFree(qs[c]));
            CK(cudaFree(ds[c]));
        }
        CK(cudaFree(dx));
        CK(cudaFree(y));
    }
    return 0;
}
