// A bench of the one-row PQ2_0 GEMV (decode's `gemv_pq2_wide_split`, quant.cu) and variants of it, on the 27B
// shape's matrices, outside the engine: random codes and scales, split activations, enough copies of each matrix
// that every call reads from HBM (not the 50 MB L2), the device-to-device copy bandwidth measured in the same run.
// Built and run on the GPU machine (or built here with the PyPI nvcc wheels, tools/cuda/ptx-check.py's docstring):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/gemv-lab tools/cuda/gemv-lab.cu && /tmp/gemv-lab
//   /tmp/gemv-lab SHAPE VARIANT        one shape and variant, a few calls (for ncu)
// Every variant's output is checked against the engine kernel's (the same sums in the same order: equal bits).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <string>
#include <cmath>

#include "../../crates/cuda/src/kernels.cu"
#include "../../crates/cuda/src/decode.cu"
#include "../../crates/cuda/src/quant.cu"

// The lean one-row PQ2_0 GEMV (split or bf16 x): the engine kernel's integer products with fewer instructions
// around them. (1) A tile's 8 rows are consecutive: one base address a tile and fixed offsets, the last tile moved
// back to end at row N (its rows before the block's current one are not written again) instead of a clamp per row.
// (2) x is rounded to int16 per 128-value block (the 4 lanes of a weight block share its scale), so that the 4
// lanes' integer sums add exactly: the reduction's first two exchanges (lanes 1 and 2 apart) run on int32, each lane
// then holds 2 rows of its block, scaled by 2 weight scales (2 loads a tile instead of 8), then one float exchange
// that leaves one row a lane and two plain sums over the warp's 8 blocks.
template <int XM>
__global__ void __launch_bounds__(704) gemv_lean(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                                 const void* __restrict__ x, long long lo, int K, int ldk, int N,
                                                 float* __restrict__ y, float beta, int rpb) {
    __shared__ float part[2][32][8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    int c0 = (warp * 32 + lane) * 32;
    int n0 = blockIdx.x * rpb, n1 = min(n0 + rpb, N);
    unsigned rb = (unsigned)(ldk / 4), rs = (unsigned)(ldk / 128);
    // This lane's two rows of a tile after the integer exchanges: 4 b0 + 2 b1 + {0, 1}.
    int rsel = 4 * (lane & 1) + 2 * ((lane >> 1) & 1);
    const unsigned char* qc = q + c0 / 4;
    const unsigned short* dc = d + c0 / 128 + (idx_t)rsel * rs;
    int r0 = min(n0, N - 8), buf = 0;
    uint2 wv[8];
    unsigned short sc[2];
    {
        const unsigned char* p = qc + (idx_t)r0 * rb;
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = make_uint2(0, 0), *(uint4*)&wv[i] = ld_stream_v2(p + i * rb);
        const unsigned short* ps = dc + (idx_t)r0 * rs;
        sc[0] = ld_stream_u16(ps), sc[1] = ld_stream_u16(ps + rs);
    }
    pdl_wait();
    float xv[32];
#pragma unroll
    for (int i = 0; i < 32; i += 16) load_x16<XM>(x, c0 + i, lo, xv + i);
    unsigned hq[2][4], lq[2][4];
    int qsum = 0;
    float xs;
    {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(xv[i]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        float inv = m > 0.0f ? 32767.0f / m : 0.0f;
        xs = m / 32767.0f;
#pragma unroll
        for (int w = 0; w < 2; w++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned hw = 0u, lw = 0u;
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    int qv = __float2int_rn(xv[16 * w + 4 * b + j] * inv);
                    qsum += qv;
                    hw |= (unsigned)((qv >> 8) & 0xff) << (8 * b);
                    lw |= (unsigned)(qv & 0xff) << (8 * b);
                }
                hq[w][j] = hw, lq[w][j] = lw;
            }
    }
    bool b0 = lane & 1, b1 = lane & 2, b2 = lane & 4;
#pragma unroll 1
    for (int nt = n0; nt < n1; nt += 8) {
        if (nt + 8 >= n1) pdl_launch();
        int rn = min(nt + 8, N - 8);
        uint2 nw[8];
        unsigned short ns[2];
        if (nt + 8 < n1) {
            const unsigned char* p = qc + (idx_t)rn * rb;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint4 t = ld_stream_v2(p + i * rb);
                nw[i] = make_uint2(t.x, t.y);
            }
            const unsigned short* ps = dc + (idx_t)rn * rs;
            ns[0] = ld_stream_u16(ps), ns[1] = ld_stream_u16(ps + rs);
        }
        int v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int ah = 0;
            unsigned al = 0u;
#pragma unroll
            for (int w = 0; w < 2; w++) {
                unsigned word = w == 0 ? wv[i].x : wv[i].y;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    unsigned c = (word >> (2 * j)) & 0x03030303u;
                    ah = __dp4a((int)c, (int)hq[w][j], ah);
                    al = __dp4a(c, lq[w][j], al);
                }
            }
            v[i] = ah * 256 + (int)al - qsum;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int send = b0 ? v[i] : v[i + 4], keep = b0 ? v[i + 4] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int send = b1 ? v[i] : v[i + 2], keep = b1 ? v[i + 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
        }
        float f0 = (float)v[0] * (xs * h2f(sc[0])), f1 = (float)v[1] * (xs * h2f(sc[1]));
        float f = (b2 ? f1 : f0) + __shfl_xor_sync(0xffffffffu, b2 ? f0 : f1, 4);
        f += __shfl_xor_sync(0xffffffffu, f, 8);
        f += __shfl_xor_sync(0xffffffffu, f, 16);
        if (lane < 8) part[buf][warp][rsel + (b2 ? 1 : 0)] = f;
        __syncthreads();
        if (threadIdx.x < 8) {
            int r = r0 + (int)threadIdx.x;
            if (r >= nt && r < n1) {
                float t = 0.0f;
                for (int w = 0; w < warps; w++) t += part[buf][w][threadIdx.x];
                float* yo = y + r;
                *yo = beta != 0.0f ? t + beta * *yo : t;
            }
        }
        buf ^= 1;
        r0 = rn;
#pragma unroll
        for (int i = 0; i < 8; i++) wv[i] = nw[i];
        sc[0] = ns[0], sc[1] = ns[1];
    }
}

#define CK(e)                                                                                   \
    do {                                                                                        \
        cudaError_t err_ = (e);                                                                 \
        if (err_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #e, cudaGetErrorString(err_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static float h2f_host(unsigned short h) {
    // f16 normals and zero (the lab's scales)
    unsigned e = (h >> 10) & 31, m = h & 1023, u = ((unsigned)(h & 0x8000) << 16) | (e ? ((e + 112) << 23) | (m << 13) : 0);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct Shape {
    const char* name;
    int n, k;
};
struct Variant {
    const char* name;
    int pf;
    bool defer;
    int bps;  // blocks a multiprocessor, 0: the engine's 16 / warps
};
int main(int argc, char** argv) {
    const Shape shapes[] = {{"gate|up", 34816, 5120}, {"down", 5120, 17408}, {"gdn qkv|z", 16384, 5120},
                            {"gdn out", 5120, 6144},  {"attn q|k|v", 14336, 5120}, {"head", 248320, 5120}};
    const Variant variants[] = {
        {"engine", -1, false, 0},
        {"lean", 0, false, 0},
        {"engine, 1 block/SM more", -1, false, 1},
        {"lean, 1 block/SM more", 0, false, 1},
        {"lean, 2 blocks/SM more", 0, false, 2},
    };
    const int nv = sizeof(variants) / sizeof(variants[0]), ns = sizeof(shapes) / sizeof(shapes[0]);
    int only_s = -1, only_v = -1;
    if (argc == 3) only_s = atoi(argv[1]), only_v = atoi(argv[2]);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
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
            unsigned u;
            memcpy(&u, &v, 4);
            hx[i] = (unsigned short)(u >> 16);
        }
        std::vector<float> xval(s.k);
        for (int k = 0; k < s.k; k++) {
            unsigned a = (unsigned)hx[k] << 16, b = (unsigned)hx[k + s.k] << 16;
            float fa, fb;
            memcpy(&fa, &a, 4);
            memcpy(&fb, &b, 4);
            xval[k] = fa + fb;
        }
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
            int blocks = sms * (std::max(16 / warps, 1) + v.bps);
            int rpb = (s.n + blocks - 1) / blocks;
            rpb = (rpb + 7) / 8 * 8;
            int grid = (s.n + rpb - 1) / rpb;
            float* out = y;
            auto launch = [&](int c) {
                if (v.pf < 0)
                    gemv_pq2_wide_split<<<grid, 32 * warps>>>(qs[c], ds[c], dx, s.k, s.k, s.k, s.n, out, 0.0f, rpb);
                else
                    gemv_lean<2><<<grid, 32 * warps>>>(qs[c], ds[c], dx, s.k, s.k, s.k, s.n, out, 0.0f, rpb);
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
                   rel > 1e-4 ? " TOO LARGE" : "", grid, warps, rpb);
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
