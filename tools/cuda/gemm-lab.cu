// A bench of prefill's PQ2_0 GEMM on the int8 tensor cores (`qmma_quant`, then the engine's two tile shapes
// `qmma_pq2` and `qmma_pq2_16`, qmma.cu) and other tile shapes of the same kernel template, on the 27B shape's
// matrices at 512 and 400 tokens, outside the engine: random codes (0..3, code 3 rare) and f16 scales, split
// activations. Each kernel's output is checked against an f64 sum on sampled (token, row) pairs (the error over the
// largest |y|, flagged above 1e-4) and against the first kernel's output (the largest difference over the largest
// |y|: every tile shape sums in the same order, so 0). Built and run on the GPU machine (or here with the PyPI nvcc,
// nvvm, cuda-runtime and cuda-crt wheels unpacked as tools/cuda/ptx-check.py says):
//   nvcc -O3 -std=c++17 -arch=sm_90a -cudart static -diag-suppress 1556 -o /tmp/gemm-lab tools/cuda/gemm-lab.cu
//   /tmp/gemm-lab                      every shape and variant, a table
//   /tmp/gemm-lab SHAPE VARIANT        the engine's kernel and one variant on one shape at 512 tokens (for ncu -k)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cmath>

#include "lab.h"

#include "../../crates/cuda/src/kernels.cu"
#include "../../crates/cuda/src/decode.cu"
#include "../../crates/cuda/src/tc_common.cu"
#include "../../crates/cuda/src/quant.cu"
#include "../../crates/cuda/src/qmma.cu"
#include "../../crates/cuda/src/qwgmma.cu"

// Other tile shapes of the engine's PQ2_0 kernel (qmma_pq2_gemm), for comparison.
template <int MI, int NJ, int WW, int NW, int MINB>
__global__ void __launch_bounds__(32 * NW, MINB)
    lab_pq2(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d, const signed char* __restrict__ xh,
            const unsigned char* __restrict__ xl, const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
            int K, int Kp, int tp, int, float* __restrict__ y, int ldy, float beta) {
    qmma_pq2_gemm<MI, NJ, WW, NW>(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, y, ldy, beta);
}

// Tile shapes of the warpgroup-mma kernel (qwg_pq2_gemm, qwgmma.cu; sm_90a): CL 0 the row-layout planes by
// cp.async, CL >= 1 the tiled planes by bulk copy, multicast in clusters of CL blocks.
template <int WGS, int MW, int BT, int STAGES, int CL, int MINB>
__global__ void __launch_bounds__(128 * WGS, MINB) __cluster_dims__(1, CL > 1 ? CL : 1, 1)
    lab_wg(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d, const signed char* __restrict__ xh,
           const unsigned char* __restrict__ xl, const float* __restrict__ sx, const int* __restrict__ qs, int T, int N,
           int K, int Kp, int tp, int tt, float* __restrict__ y, int ldy, float beta) {
    qwg_pq2_gemm<WGS, MW, BT, STAGES, CL>(q, d, xh, xl, sx, qs, T, N, K, Kp, tp, tt, 0, Kp / 128, y, ldy, beta);
}

struct Shape {
    const char* name;
    int n, k;
};
typedef void (*Kern)(const unsigned char*, const unsigned short*, const signed char*, const unsigned char*,
                     const float*, const int*, int, int, int, int, int, int, float*, int, float);
struct Variant {
    const char* name;
    Kern f;
    int bt, bw;  // tokens, weight rows per block
    int smem, threads;
    int cl;  // -1: not a warpgroup kernel; 0: row-layout planes; >= 1 tiled planes, clusters of cl blocks
};
template <int MI, int NJ, int WW, int NW>
static Variant variant(const char* name, Kern f) {
    using L = QmmaPq2Tile<MI, NJ, WW, NW>;
    int smem = L::STAGES * L::STAGE;
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return {name, f, L::BT, L::BW, smem, L::NT, -1};
}

template <int WGS, int MW, int BT, int STAGES, int CL>
static Variant wvariant(const char* name, Kern f) {
    using L = QwgTile<WGS, MW, BT, STAGES>;
    int smem = STAGES * L::STAGE + (CL >= 1 ? 8 * STAGES : 0);
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return {name, f, BT, L::BW, smem, L::NT, CL};
}

int main(int argc, char** argv) {
    const Shape shapes[] = {{"gate|up", 34816, 5120}, {"down", 5120, 17408}, {"gdn qkv|z", 16384, 5120},
                            {"gdn out", 5120, 6144},  {"attn q|k|v", 14336, 5120}};
    const Variant variants[] = {
        variant<2, 4, 4, 8>("engine qmma_pq2 64t x 128w", lab_pq2<2, 4, 4, 8, 2>),
        variant<2, 2, 8, 16>("engine qmma_pq2_16 32t x 256w", lab_pq2<2, 2, 8, 16, 1>),
        wvariant<2, 1, 64, 4, 1>("engine qwg_pq2 64t x 128w, 2/SM", lab_wg<2, 1, 64, 4, 1, 2>),
        wvariant<4, 1, 64, 4, 1>("wg bulk 64t x 256w, 4 wg", lab_wg<4, 1, 64, 4, 1, 1>),
        wvariant<2, 1, 64, 3, 1>("wg bulk 64t x 128w, 2/SM, 3 st", lab_wg<2, 1, 64, 3, 1, 2>),
        wvariant<4, 1, 64, 3, 1>("wg bulk 64t x 256w, 3 st", lab_wg<4, 1, 64, 3, 1, 1>),
        wvariant<2, 1, 128, 3, 1>("wg bulk 128t x 128w", lab_wg<2, 1, 128, 3, 1, 1>),
        wvariant<2, 2, 64, 4, 1>("wg bulk 64t x 256w, 2 wg of 128", lab_wg<2, 2, 64, 4, 1, 1>),
        wvariant<4, 1, 64, 4, 2>("wg multicast 2, 64t x 256w", lab_wg<4, 1, 64, 4, 2, 1>),
    };
    const int nv = sizeof(variants) / sizeof(variants[0]), ns = sizeof(shapes) / sizeof(shapes[0]);
    int only_s = -1, only_v = -1;
    if (argc == 3) only_s = atoi(argv[1]), only_v = atoi(argv[2]);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("%d multiprocessors; TOPS = 2 T N K / time (each plane's products not counted twice)\n", sms);
    for (int si = 0; si < ns; si++) {
        if (only_s >= 0 && si != only_s) continue;
        const Shape s = shapes[si];
        const int kp = (s.k + 127) / 128 * 128, nbk = kp / 128;
        size_t code_bytes = (size_t)s.n * s.k / 4, scale_n = (size_t)s.n * (s.k / 128);
        std::vector<unsigned char> hq(code_bytes);
        std::vector<unsigned short> hd(scale_n);
        unsigned long long st = 0x9E3779B97F4A7C15ull * (si + 1);
        auto rnd = [&]() {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            return st;
        };
        for (auto& c : hq) {
            unsigned char b = 0;
            for (int j = 0; j < 4; j++) {
                unsigned r = rnd() % 301;
                b |= (unsigned char)((r == 300 ? 3 : r % 3) << (2 * j));
            }
            c = b;
        }
        for (auto& h : hd) h = (unsigned short)(0x2000 + (rnd() % 0x400));
        unsigned char* dq;
        unsigned short* dd;
        CK(cudaMalloc(&dq, code_bytes));
        CK(cudaMalloc(&dd, scale_n * 2));
        CK(cudaMemcpy(dq, hq.data(), code_bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dd, hd.data(), scale_n * 2, cudaMemcpyHostToDevice));
        for (int T : {512, 400}) {
            if (only_s >= 0 && T != 512) continue;
            // split activations: hi plane [T, K], then lo plane, lo about 2^-9 of hi
            std::vector<unsigned short> hx(2 * (size_t)T * s.k);
            for (size_t i = 0; i < hx.size(); i++) {
                float v = ((float)(rnd() % 20001) - 10000.0f) / 10000.0f;
                if (i >= (size_t)T * s.k) v *= 1.0f / 512.0f;
                hx[i] = bf_trunc(v);
            }
            unsigned short* dx;
            CK(cudaMalloc(&dx, hx.size() * 2));
            CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
            const int tp = (T + 3) / 4 * 4;
            signed char* xh;
            unsigned char* xl;
            float* sx;
            int* qsum;
            CK(cudaMalloc(&xh, (size_t)T * kp));
            CK(cudaMalloc(&xl, (size_t)T * kp));
            CK(cudaMalloc(&sx, (size_t)nbk * tp * 4));
            CK(cudaMalloc(&qsum, (size_t)nbk * tp * 4));
            auto quant = [&]() {
                qmma_quant<<<dim3((nbk + 7) / 8, T), 256>>>(dx, s.k, (long long)T * s.k, 1, s.k, kp, 1, xh, xl, sx,
                                                            qsum, tp, 0);
            };
            // The tiled planes of the bulk-copy kernels: tt rows a block (T rounded up to the largest tile, 128).
            const int tt = (T + 127) / 128 * 128;
            signed char* xh2;
            unsigned char* xl2;
            CK(cudaMalloc(&xh2, (size_t)tt * kp));
            CK(cudaMalloc(&xl2, (size_t)tt * kp));
            qmma_quant<<<dim3((nbk + 7) / 8, T), 256>>>(dx, s.k, (long long)T * s.k, 1, s.k, kp, 1, xh2, xl2, sx, qsum,
                                                        tp, tt);
            quant();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            float* y;
            float* y0;
            size_t ybytes = (size_t)T * s.n * 4;
            CK(cudaMalloc(&y, ybytes));
            CK(cudaMalloc(&y0, ybytes));
            std::vector<float> hy((size_t)T * s.n), hy0((size_t)T * s.n);
            // the exact sums of sampled pairs
            std::vector<int> toks = {0, 1, 7, 63, 64, T / 2 + 3, T - 2, T - 1}, rows;
            for (int r = 0; r < s.n; r += 97) rows.push_back(r);
            for (int r = s.n - 9; r < s.n; r++) rows.push_back(r);
            std::vector<double> ref(toks.size() * rows.size());
            double big = 0;
            for (size_t a = 0; a < toks.size(); a++)
                for (size_t b = 0; b < rows.size(); b++) {
                    double t = 0;
                    int tk = toks[a], r = rows[b];
                    for (int k = 0; k < s.k; k++) {
                        int code = (hq[(size_t)r * s.k / 4 + k / 4] >> (2 * (k % 4))) & 3;
                        double xf = (double)bf_host(hx[(size_t)tk * s.k + k]) +
                                    (double)bf_host(hx[(size_t)T * s.k + (size_t)tk * s.k + k]);
                        t += (double)(code - 1) * h2f_host(hd[(size_t)r * (s.k / 128) + k / 128]) * xf;
                    }
                    ref[a * rows.size() + b] = t;
                    big = std::max(big, fabs(t));
                }
            float quant_us = 0;
            for (int vi = 0; vi < nv; vi++) {
                if (only_v >= 0 && vi != only_v && vi != 0) continue;
                const Variant& v = variants[vi];
                float* out = vi == 0 ? y0 : y;
                int gy = (s.n + v.bw - 1) / v.bw;
                if (v.cl > 1) gy = (gy + v.cl - 1) / v.cl * v.cl;
                dim3 grid((T + v.bt - 1) / v.bt, gy);
                const bool tiled = v.cl >= 1;
                auto launch = [&]() {
                    v.f<<<grid, v.threads, v.smem>>>(dq, dd, tiled ? xh2 : xh, tiled ? xl2 : xl, sx, qsum, T, s.n, s.k,
                                                     kp, tp, tt, out, s.n, 0.0f);
                };
                CK(cudaMemset(out, 0xff, ybytes));
                launch();
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                if (only_s >= 0) {
                    launch();
                    CK(cudaDeviceSynchronize());
                    continue;
                }
                CK(cudaMemcpy(vi == 0 ? hy0.data() : hy.data(), out, ybytes, cudaMemcpyDeviceToHost));
                const std::vector<float>& h = vi == 0 ? hy0 : hy;
                double err = 0, dif = 0;
                for (size_t a = 0; a < toks.size(); a++)
                    for (size_t b = 0; b < rows.size(); b++)
                        err = std::max(err, fabs(ref[a * rows.size() + b] - h[(size_t)toks[a] * s.n + rows[b]]));
                for (size_t i = 0; i < h.size(); i++) {
                    double dd2 = fabs((double)h[i] - (double)hy0[i]);
                    if (!(dd2 <= dif)) dif = std::isnan(dd2) ? INFINITY : dd2;
                }
                double rel = err / big;
                const int calls = 10;
                std::vector<float> per, perq;
                for (int rep = 0; rep < 7; rep++) {
                    CK(cudaEventRecord(e0));
                    for (int i = 0; i < calls; i++) launch();
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    per.push_back(ms * 1e3f / calls);
                    if (vi == 0) {
                        CK(cudaEventRecord(e0));
                        for (int i = 0; i < calls; i++) quant();
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaEventElapsedTime(&ms, e0, e1));
                        perq.push_back(ms * 1e3f / calls);
                    }
                }
                std::sort(per.begin(), per.end());
                if (vi == 0) {
                    std::sort(perq.begin(), perq.end());
                    quant_us = perq[perq.size() / 2];
                }
                float us = per[per.size() / 2];
                printf("%-10s T %3d %-28s %8.1f us %6.0f TOPS  err %.1e%s  vs engine %.1e  (grid %d x %d, smem %d)%s\n",
                       s.name, T, v.name, us, 2.0 * T * s.n * s.k / (us * 1e-6) / 1e12, rel,
                       rel > 1e-4 ? " TOO LARGE" : "", dif / big, grid.x, grid.y, v.smem,
                       vi == 0 ? "" : (dif / big > 1e-6 ? " DIFFERS" : ""));
            }
            if (only_s < 0) printf("%-10s T %3d quantization of x %.1f us\n", s.name, T, quant_us);
            CK(cudaFree(dx));
            CK(cudaFree(xh));
            CK(cudaFree(xl));
            CK(cudaFree(xh2));
            CK(cudaFree(xl2));
            CK(cudaFree(sx));
            CK(cudaFree(qsum));
            CK(cudaFree(y));
            CK(cudaFree(y0));
        }
        CK(cudaFree(dq));
        CK(cudaFree(dd));
    }
    return 0;
}
