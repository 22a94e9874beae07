// Small kernels outside the forward's op set.

// Keeps the stream busy for about `cycles` clock cycles (one thread), so that the host can queue a whole
// forward before the GPU starts it: the profiler's events then time the GPU's work, not the host's launches.
extern "C" __global__ void spin_wait(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// Split-mode consumers of a GEMM run once over both bf16 planes ([hi; lo] stacked as 2N rows): the two halves of
// its output are summed where they are read, so the weights are read once instead of twice.

// x += f[:N] + f[N:] (f: [2N, dim], the lo half `lo` values after the hi half), then RMSNorm as rms_norm.
// x: [R, dim] stride ldx; out: [R, dim] stride ldo, stored as `store_act` with `mode`. grid R.
extern "C" __global__ void add2_rms_norm(float* x, int ldx, const float* __restrict__ f, long long lo,
                                         const float* gain, float eps, int dim, void* out, int mode, int ldo) {
    int r = blockIdx.x;
    float* row = x + (idx_t)r * ldx;
    const float* fr = f + (idx_t)r * dim;
    float s = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float v = row[c] + (fr[c] + fr[c + lo]);
        row[c] = v;  // read back below by this same thread
        s += v * v;
    }
    s = block_sum(s);
    float inv = 1.0f / sqrtf(s / dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) store_act(out, (idx_t)r * ldo + c, row[c] * inv * gain[c], mode);
}

// SwiGLU over a gate|up GEMM output in two halves: g = gu[n] + gu[n + lo] per value, out = silu(gate) * up.
// gu: [2N, 2I] f32 (hi rows, then lo rows `lo` values later); out: [N, I] as `store_act` with `mode`.
extern "C" __global__ void swiglu2(const float* __restrict__ gu, int inter, int rows, long long lo, void* out,
                                   int mode) {
    idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (idx_t)rows * inter) return;
    idx_t n = i / inter, c = i % inter;
    const float* r = gu + n * 2 * inter;
    float gate = r[c] + r[c + lo], up = r[inter + c] + r[inter + c + lo];
    store_act(out, i, silu_f(gate) * up, mode);
}
