// Sampled decoding's next token, drawn where the logits are (sample.rs has the launch order and the exactness
// argument): the token the host's `sample` (onepass-model) draws for the same logits, settings and generator state.
// Compiled after decode.cu (argmax_block). Every pass over the vocabulary takes SMP_CHUNK logits per block (256
// threads, 8 each, block b the ids [b * SMP_CHUNK, (b + 1) * SMP_CHUNK)), and the last block to finish (`done`)
// combines the blocks' results in block order, so a draw is the same on every run.
//
// Candidates are ordered by their composite key (smp_key: the logit's bits in IEEE total order, as Rust's
// `total_cmp`, then the id reversed), descending: logit descending, id ascending, the host's order. Every key is
// distinct, so "the c best" is one threshold on the key.

#define SMP_CHUNK 2048
// Candidates the one-block sort takes (the host's first cut).
#define SMP_CUT 2048
// Bits per radix-select pass (2048 bins); six passes cover the 64-bit key (11 · 5 + 9).
#define SMP_DIGIT 11

// The sampler's device state (`Sampler::state` in sample.rs, 16 u64 words; the last holds a test draw's token). The
// first 24 bytes are the host's, set before a decode; the rest is the draw's own.
struct SmpState {
    u64 rng;      // SplitMix64 state, one step per draw
    float temp;   // temperature (> 0)
    float top_p;  // clamped to [0, 1]
    int k;        // top-k, at most V (V: none)
    int cut;      // candidates of the first cut: min(k, SMP_CUT)
    int pad0, pad1;
    double max;   // the logit at the host's argmax, f64
    double total; // the sum of every weight, blocks in order
    u64 thr;      // radix select: the bits fixed so far ([hi, 64)); once resolved, the threshold
    int hi;
    int need;     // candidates still to take among the keys that match thr's fixed bits
    int resolved; // 1: the candidates are exactly the keys >= thr
    int ncand;    // candidates gathered
    int wide;     // 1: the wide path draws (the first cut did not hold the top-p set, or k > SMP_CUT)
    unsigned done;// blocks finished (0 between launches)
};

__device__ __forceinline__ u64 smp_key(float l, int i) {
    unsigned b = __float_as_uint(l);
    unsigned o = b ^ ((b >> 31) ? 0xffffffffu : 0x80000000u);
    return ((u64)o << 32) | (u64)(0xffffffffu - (unsigned)i);
}
__device__ __forceinline__ float smp_logit(u64 c) {
    unsigned o = (unsigned)(c >> 32);
    return __uint_as_float((o >> 31) ? (o ^ 0x80000000u) : ~o);
}
__device__ __forceinline__ int smp_id(u64 c) { return (int)(0xffffffffu - (unsigned)c); }

// The host's weight: exp((l - max) / t) in f64, 0 for NaN. The explicit roundings keep NVRTC from contracting.
__device__ __forceinline__ double smp_weight(float l, double max, double t) {
    return isnan(l) ? 0.0 : exp(__ddiv_rn(__dsub_rn((double)l, max), t));
}

// The host's Rng::next_f64: the state advanced one step, 53 bits in [0, 1).
__device__ __forceinline__ double smp_uniform(SmpState* st) {
    u64 z = st->rng + 0x9E3779B97F4A7C15ull;
    st->rng = z;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return __dmul_rn((double)(z >> 11), 1.0 / 9007199254740992.0);
}

// Exclusive prefix sum of v over the block's threads in thread order, and the block's total in *total (every thread
// calls it; blockDim.x a multiple of 32). Deterministic: a fixed tree.
template <typename T>
__device__ T smp_scan(T v, T* total) {
    __shared__ T ws[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    T x = v;
    for (int o = 1; o < 32; o <<= 1) {
        T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    T ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) ex = (T)0;
    __syncthreads();  // a call before this one has read ws
    if (lane == 31) ws[w] = x;
    __syncthreads();
    if (w == 0) {
        T s = lane < nw ? ws[lane] : (T)0;
        for (int o = 1; o < 32; o <<= 1) {
            T y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        ws[lane] = s;
    }
    __syncthreads();
    *total = ws[nw - 1];
    return w > 0 ? ws[w - 1] + ex : ex;
}

// Whether this block is the last of the grid to get here (every thread calls it; the block's global writes before
// it are visible to the last block).
__device__ __forceinline__ bool smp_last_block(unsigned* done) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The radix-select pass over bits [lo, lo + width) of the keys that match thr's fixed bits, in the last block:
// the digit whose bin holds the need-th best, counted from the top; the bins zeroed for the next pass.
__device__ void smp_resolve(SmpState* st, unsigned* hist, int lo, int width) {
    __shared__ int pick_d, pick_above, pick_count;
    int nb = 1 << width, per = nb / blockDim.x;
    int need = st->need;
    int c[8], s = 0;
    for (int q = 0; q < per; q++) {
        int d = nb - 1 - (threadIdx.x * per + q);
        c[q] = (int)__ldcg(hist + d);
        s += c[q];
    }
    int tot;
    int above = smp_scan<int>(s, &tot);
    if (above < need && need <= above + s) {
        for (int q = 0; q < per; q++) {
            if (need <= above + c[q]) {
                pick_d = nb - 1 - (threadIdx.x * per + q);
                pick_above = above;
                pick_count = c[q];
                break;
            }
            above += c[q];
        }
    }
    for (int q = 0; q < per; q++) hist[nb - 1 - (threadIdx.x * per + q)] = 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        need -= pick_above;
        st->thr |= (u64)pick_d << lo;
        st->hi = lo;
        st->need = need;
        st->resolved = pick_count == need;
    }
}

// The bits of radix-select pass p: [lo, hi).
__device__ __forceinline__ void smp_digit(int p, int* lo, int* hi) {
    *hi = 64 - SMP_DIGIT * p;
    *lo = max(*hi - SMP_DIGIT, 0);
}

// This block's histogram of pass p's digit over the keys of its chunk that match thr (when `sel`), added to hist.
__device__ void smp_count(const float* __restrict__ x, int n, const SmpState* st, unsigned* h, unsigned* hist, int p,
                          bool sel) {
    if (!sel) return;
    int lo, hi;
    smp_digit(p, &lo, &hi);
    u64 thr = st->thr;
    int base = blockIdx.x * SMP_CHUNK, mask = (1 << (hi - lo)) - 1;
    for (int b = threadIdx.x; b <= mask; b += blockDim.x) h[b] = 0;
    __syncthreads();
    for (int j = 0; j < SMP_CHUNK / 256; j++) {
        int e = base + j * 256 + threadIdx.x;
        if (e >= n) break;
        u64 c = smp_key(x[e], e);
        if (hi == 64 || (c >> hi) == (thr >> hi)) atomicAdd(&h[(c >> lo) & mask], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b <= mask; b += blockDim.x)
        if (h[b]) atomicAdd(&hist[b], h[b]);
}

// Pass 1 of a draw: the argmax (the host's: the lowest id among equal maxima, NaN never wins, 0 when nothing beats
// -inf) and, with `sel`, radix-select pass 0. The last block sets the draw's state: max, the select's start, the wide
// path's flag (`wide_only`: k > SMP_CUT without top-p, the first cut skipped). grid ceil(n / SMP_CHUNK), 256 threads.
KERNEL(simt) void smp_max(const float* __restrict__ x, int n, SmpState* st, float* part_v, int* part_i,
                          unsigned* hist, int sel, int wide_only) {
    __shared__ unsigned h[1 << SMP_DIGIT];
    __shared__ bool last;
    int base = blockIdx.x * SMP_CHUNK;
    float v = -__int_as_float(0x7f800000);
    int i = 0x7fffffff;
    for (int j = 0; j < SMP_CHUNK / 256; j++) {
        int e = base + j * 256 + threadIdx.x;
        if (e >= n) break;
        float l = x[e];
        if (l > v) {
            v = l;
            i = e;
        }
    }
    argmax_block(v, i);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = i;
    }
    // Pass 0 matches every key (thr's fixed bits are none).
    smp_count(x, n, st, h, hist, 0, sel);
    bool is_last = smp_last_block(&st->done);
    if (threadIdx.x == 0) last = is_last;
    __syncthreads();
    if (!last) return;
    v = -__int_as_float(0x7f800000);
    i = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        float v2 = __ldcg(part_v + b);
        int i2 = __ldcg(part_i + b);
        if (v2 > v || (v2 == v && i2 < i)) {
            v = v2;
            i = i2;
        }
    }
    argmax_block(v, i);
    if (threadIdx.x == 0) {
        st->max = (double)x[i == 0x7fffffff ? 0 : i];
        st->thr = 0;
        st->hi = 64;
        st->need = st->cut;
        st->resolved = 0;
        st->ncand = 0;
        st->wide = wide_only;
        st->done = 0;
    }
    __syncthreads();
    if (sel) smp_resolve(st, hist, 64 - SMP_DIGIT, SMP_DIGIT);
}

// Pass 2: every weight, each block's sum (block b's ids in order per thread, then a fixed tree) and its first and
// last id of positive weight (-1: none); the last block adds the blocks' sums in block order (total). With `sel`,
// radix-select pass 1. grid and threads as smp_max.
KERNEL(simt) void smp_total(const float* __restrict__ x, int n, SmpState* st, double* bsum, int* first_pos,
                            int* last_pos, unsigned* hist, int sel) {
    __shared__ unsigned h[1 << SMP_DIGIT];
    __shared__ int fp, lp;
    __shared__ bool last;
    bool s1 = sel && !st->resolved;
    double max = st->max, t = (double)st->temp;
    int base = blockIdx.x * SMP_CHUNK;
    if (threadIdx.x == 0) {
        fp = 0x7fffffff;
        lp = -1;
    }
    __syncthreads();
    double s = 0.0;
    int f = 0x7fffffff, l = -1;
    for (int j = 0; j < SMP_CHUNK / 256; j++) {
        int e = base + j * 256 + threadIdx.x;
        if (e >= n) break;
        double w = smp_weight(x[e], max, t);
        s = __dadd_rn(s, w);
        if (w > 0.0) {
            f = min(f, e);
            l = e;
        }
    }
    if (f != 0x7fffffff) atomicMin(&fp, f);
    if (l >= 0) atomicMax(&lp, l);
    double bs;
    smp_scan<double>(s, &bs);
    if (threadIdx.x == 0) {
        bsum[blockIdx.x] = bs;
        first_pos[blockIdx.x] = fp == 0x7fffffff ? -1 : fp;
        last_pos[blockIdx.x] = lp;
    }
    smp_count(x, n, st, h, hist, 1, s1);
    bool is_last = smp_last_block(&st->done);
    if (threadIdx.x == 0) last = is_last;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int b = 0; b < (int)gridDim.x; b++) tot = __dadd_rn(tot, __ldcg(bsum + b));
        st->total = tot;
        st->done = 0;
    }
    if (s1) smp_resolve(st, hist, 64 - 2 * SMP_DIGIT, SMP_DIGIT);
}

// Radix-select pass p (2..5) while the threshold is not resolved. grid and threads as smp_max.
KERNEL(simt) void smp_select(const float* __restrict__ x, int n, SmpState* st, unsigned* hist, int p) {
    __shared__ unsigned h[1 << SMP_DIGIT];
    __shared__ bool last;
    if (st->resolved || st->wide) return;
    smp_count(x, n, st, h, hist, p, true);
    bool is_last = smp_last_block(&st->done);
    if (threadIdx.x == 0) last = is_last;
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) st->done = 0;
    int lo, hi;
    smp_digit(p, &lo, &hi);
    smp_resolve(st, hist, lo, hi - lo);
}

// The candidates: every key >= the threshold (exactly `cut` of them), in no order. grid and threads as smp_max.
KERNEL(simt) void smp_gather(const float* __restrict__ x, int n, SmpState* st, u64* cand) {
    if (st->wide) return;
    u64 thr = st->thr;
    int base = blockIdx.x * SMP_CHUNK;
    for (int j = 0; j < SMP_CHUNK / 256; j++) {
        int e = base + j * 256 + threadIdx.x;
        if (e >= n) break;
        u64 c = smp_key(x[e], e);
        if (c >= thr) {
            int at = atomicAdd(&st->ncand, 1);
            if (at < SMP_CUT) cand[at] = c;
        }
    }
}

// Stages j = jmax, jmax / 2, ..., 1 of bitonic step k over a[0, len) in shared memory (a tile at index `base` of the
// whole sequence): pairs (i, i + j) in descending order where (base + i) & k is 0, ascending elsewhere. Every thread
// of the block calls it.
__device__ void smp_merge(u64* a, int len, unsigned base, unsigned k, int jmax) {
    for (int j = jmax; j > 0; j >>= 1) {
        for (int q = threadIdx.x; q < len / 2; q += blockDim.x) {
            int i = 2 * q - (q & (j - 1)), l = i + j;
            bool desc = ((base + (unsigned)i) & k) == 0;
            u64 A = a[i], B = a[l];
            if (desc ? A < B : A > B) {
                a[i] = B;
                a[l] = A;
            }
        }
        __syncthreads();
    }
}

// The first cut's draw: the candidates sorted (best first) and their weights, then one thread walks them as the
// host does, in the host's order and roundings: the top-p cut (the first count whose running mass reaches top_p ·
// total; all `cut` when top_p is 1), the draw over that mass. When the cut's mass stays below top_p · total and the
// cut is less than k, the top-p set may reach past it: the wide path draws instead (wide = 1). 1 block, 1024 threads.
KERNEL(simt) void smp_pick(SmpState* st, const u64* __restrict__ cand, int* out) {
    __shared__ u64 key[SMP_CUT];
    __shared__ double w[SMP_CUT];
    if (st->wide) return;
    int n = min(st->ncand, SMP_CUT);
    int p2 = 2;
    while (p2 < n) p2 <<= 1;
    for (int i = threadIdx.x; i < p2; i += blockDim.x) key[i] = i < n ? cand[i] : 0ull;
    __syncthreads();
    for (unsigned k = 2; k <= (unsigned)p2; k <<= 1) smp_merge(key, p2, 0, k, k >> 1);
    double max = st->max, t = (double)st->temp;
    for (int i = threadIdx.x; i < n; i += blockDim.x) w[i] = smp_weight(smp_logit(key[i]), max, t);
    __syncthreads();
    if (threadIdx.x != 0) return;
    double top_p = (double)st->top_p;
    int nsel = 0;
    double mass = 0.0;
    if (top_p < 1.0) {
        double target = __dmul_rn(top_p, st->total);
        for (int j = 0; j < n; j++) {
            mass = __dadd_rn(mass, w[j]);
            if (mass >= target) {
                nsel = j + 1;
                break;
            }
        }
        if (nsel == 0) {
            if (n < st->k) {
                st->wide = 1;
                return;
            }
            nsel = n;
        }
    } else {
        nsel = n;
        for (int j = 0; j < n; j++) mass = __dadd_rn(mass, w[j]);
    }
    double r = __dmul_rn(smp_uniform(st), mass);
    int tok = smp_id(key[nsel - 1]);
    for (int j = 0; j < nsel; j++) {
        if (r < w[j]) {
            tok = smp_id(key[j]);
            break;
        }
        r = __dsub_rn(r, w[j]);
    }
    *out = tok;
}

// The whole distribution's draw (no top-k, top-p 1), in id order as the host walks it: r = u · total; the block
// where r falls (the blocks' sums in order), then the id within it (1024 threads, two ids each, the running sum a
// scan); a draw past the block (roundings) takes the next id of positive weight, a draw past every block (or a NaN
// total) the last one (0: none). 1 block, 1024 threads.
KERNEL(simt) void smp_pick_full(const float* __restrict__ x, int n, SmpState* st, const double* bsum,
                                const int* first_pos, const int* last_pos, int* out) {
    __shared__ int fb, hit;
    __shared__ double fr;
    int nb = (n + SMP_CHUNK - 1) / SMP_CHUNK;
    if (threadIdx.x == 0) {
        double r = __dmul_rn(smp_uniform(st), st->total);
        fb = -1;
        for (int b = 0; b < nb; b++) {
            double s = bsum[b];
            if (r < s) {
                fb = b;
                break;
            }
            r = __dsub_rn(r, s);
        }
        fr = r;
        hit = 0x7fffffff;
    }
    __syncthreads();
    int b = fb;
    if (b >= 0) {
        double max = st->max, t = (double)st->temp;
        int e0 = b * SMP_CHUNK + 2 * threadIdx.x;
        double w0 = e0 < n ? smp_weight(x[e0], max, t) : 0.0;
        double w1 = e0 + 1 < n ? smp_weight(x[e0 + 1], max, t) : 0.0;
        double tot;
        double ex = smp_scan<double>(__dadd_rn(w0, w1), &tot);
        double r = __dsub_rn(fr, ex);
        int h = 0x7fffffff;
        if (w0 > 0.0) {
            if (r < w0)
                h = e0;
            else
                r = __dsub_rn(r, w0);
        }
        if (h == 0x7fffffff && w1 > 0.0 && r < w1) h = e0 + 1;
        if (h != 0x7fffffff) atomicMin(&hit, h);
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    int tok = hit;
    if (tok == 0x7fffffff) {
        tok = -1;
        if (b >= 0)
            for (int c = b + 1; c < nb && tok < 0; c++) tok = first_pos[c];
        for (int c = b >= 0 ? b : nb - 1; c >= 0 && tok < 0; c--) tok = last_pos[c];
        if (tok < 0) tok = 0;
    }
    *out = tok;
}

// The wide path (while wide is set): every key sorted, best first, by a bitonic sort of `P` keys (a power of two, at
// least one tile; keys past n are 0, below every real key): smp_wide_tile sorts each tile of `tile` keys (4,096) in
// dynamic shared memory (steps k <= tile), then per step k > tile the stages j >= tile up to three per launch
// (smp_wide_steps) and the rest in a tile (smp_wide_merge). grid P / tile blocks of 1024 threads, tile · 8 bytes of
// dynamic shared memory (smp_wide_steps: P / 2^s threads in blocks of 256).
KERNEL(simt) void smp_wide_tile(const float* __restrict__ x, int n, const SmpState* st, u64* keys, int tile) {
    extern __shared__ u64 smp_sm[];
    if (!st->wide) return;
    unsigned base = blockIdx.x * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) {
        unsigned e = base + i;
        smp_sm[i] = e < (unsigned)n ? smp_key(x[e], (int)e) : 0ull;
    }
    __syncthreads();
    for (unsigned k = 2; k <= (unsigned)tile; k <<= 1) smp_merge(smp_sm, tile, base, k, k >> 1);
    for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = smp_sm[i];
}
// Stages j, j / 2, ..., j / 2^(s-1) (s <= 3) of bitonic step k over the whole sequence: each thread takes the 2^s keys
// i0 + m · (j >> (s - 1)) (m < 2^s) that those stages pair among themselves, in registers.
KERNEL(simt) void smp_wide_steps(u64* keys, unsigned k, unsigned j, int s, const SmpState* st) {
    if (!st->wide) return;
    unsigned q = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned lo = j >> (s - 1);  // the lowest stage's stride: the group's bits are lo, 2 lo, ..., j
    unsigned i0 = ((q / lo) << s) * lo + (q % lo);
    bool desc = (i0 & k) == 0;
    int m = 1 << s;
    u64 a[8];
#pragma unroll
    for (int t = 0; t < 8; t++)
        if (t < m) a[t] = keys[i0 + t * lo];
#pragma unroll
    for (int h = 4; h > 0; h >>= 1) {
        if (h >= m) continue;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= m || (t & h)) continue;
            u64 A = a[t], B = a[t + h];
            if (desc ? A < B : A > B) {
                a[t] = B;
                a[t + h] = A;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 8; t++)
        if (t < m) keys[i0 + t * lo] = a[t];
}
KERNEL(simt) void smp_wide_merge(u64* keys, unsigned k, const SmpState* st, int tile) {
    extern __shared__ u64 smp_sm[];
    if (!st->wide) return;
    unsigned base = blockIdx.x * tile;
    for (int i = threadIdx.x; i < tile; i += blockDim.x) smp_sm[i] = keys[base + i];
    __syncthreads();
    smp_merge(smp_sm, tile, base, k, tile / 2);
    for (int i = threadIdx.x; i < tile; i += blockDim.x) keys[base + i] = smp_sm[i];
}
// The weights of the first k sorted keys, in sorted order. grid ceil(V / SMP_CHUNK) blocks of 256 (k is read on the
// device).
KERNEL(simt) void smp_wide_weights(const SmpState* st, const u64* __restrict__ keys, double* w) {
    if (!st->wide) return;
    int k = st->k;
    double max = st->max, t = (double)st->temp;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
        w[i] = smp_weight(smp_logit(keys[i]), max, t);
}

// One thread's walk of w[0, len): the running sum from *sum (mode 0: the first index whose sum reaches `target`, else
// len; *sum the sum there) or the draw (mode 1: from r = *sum, the first index j where r < w[j], r reduced by each
// weight before it; len when none). The same additions in the same order as one at a time, eight at once: the sum
// only grows and r only falls (weights >= 0; r < w exactly when r - w < 0), so a group of eight that does not reach
// the target (or below 0) holds no stop, and one that does is walked again one weight at a time; the next eight are
// loaded ahead.
__device__ int smp_walk(const double* __restrict__ w, int len, int mode, double target, double* sum) {
    double acc = *sum, cur[8], nxt[8];
#pragma unroll
    for (int t = 0; t < 8; t++) cur[t] = t < len ? __ldcg(w + t) : 0.0;
    for (int j0 = 0; j0 < len; j0 += 8) {
#pragma unroll
        for (int t = 0; t < 8; t++) nxt[t] = j0 + 8 + t < len ? __ldcg(w + j0 + 8 + t) : 0.0;
        int m = min(8, len - j0);
        double a = acc;
        if (m == 8) {
#pragma unroll
            for (int t = 0; t < 8; t++) a = mode == 0 ? __dadd_rn(a, cur[t]) : __dsub_rn(a, cur[t]);
            if (!(mode == 0 ? a >= target : a < 0.0)) {
                acc = a;
#pragma unroll
                for (int t = 0; t < 8; t++) cur[t] = nxt[t];
                continue;
            }
        }
        for (int t = 0; t < m; t++) {
            if (mode == 0) {
                acc = __dadd_rn(acc, cur[t]);
                if (acc >= target) {
                    *sum = acc;
                    return j0 + t;
                }
            } else {
                if (acc < cur[t]) return j0 + t;
                acc = __dsub_rn(acc, cur[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < 8; t++) cur[t] = nxt[t];
    }
    *sum = acc;
    return len;
}

// The wide path's draw over the sorted keys, as smp_pick's walk (the same order and roundings) over up to k of them.
// 1 block of 32 threads (one walks).
KERNEL(simt) void smp_wide_pick(SmpState* st, const u64* __restrict__ keys, const double* __restrict__ w, int* out) {
    if (!st->wide || threadIdx.x != 0) return;
    int k = st->k;
    double top_p = (double)st->top_p;
    double mass = 0.0;
    int nsel = k;
    if (top_p < 1.0) {
        int j = smp_walk(w, k, 0, __dmul_rn(top_p, st->total), &mass);
        if (j < k) nsel = j + 1;
    } else {
        smp_walk(w, k, 0, __longlong_as_double(0x7ff0000000000000ll), &mass);
    }
    double r = __dmul_rn(smp_uniform(st), mass);
    int j = smp_walk(w, nsel, 1, 0.0, &r);
    *out = smp_id(keys[j < nsel ? j : nsel - 1]);
}
