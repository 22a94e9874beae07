//! Choosing the next token from the logits: greedy, or seeded sampling with temperature, top-k and top-p.
//!
//! Deterministic: the candidates are ordered by logit, then by id (lower first), the probabilities are f64, and the
//! random numbers come from a seeded SplitMix64, so the same logits, settings and seed give the same tokens on every
//! machine and every run.
//!
//! This is the reference the GPU's sampler (`onepass-cuda`'s `sample`) is held to: one `next_f64` per draw, the
//! same order, weights and cuts (what may differ there is written in that module).

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the highest logit, the lowest id on ties). Otherwise the logits are divided by it.
    pub temperature: f32,
    /// Keep the `top_k` highest logits only (0: all).
    pub top_k: usize,
    /// Keep the smallest set of the highest-probability tokens whose mass reaches `top_p` (1: all).
    pub top_p: f32,
}

/// SplitMix64's step between states.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64 (Steele, Lea, Flood 2014): a small generator whose stream is fixed by its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The state: a generator continued from it ([`Rng::new`]) gives the numbers this one would give next.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// Skips `n` numbers, as `n` calls of [`Rng::next_u64`] would (a device drew them).
    pub fn skip(&mut self, n: u64) {
        self.0 = self.0.wrapping_add(GOLDEN.wrapping_mul(n));
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The highest logit's id (the lowest id among equal ones; NaN never wins; 0 when nothing beats -inf).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Candidates considered before the whole vocabulary is sorted (exact: the top-p set is checked to lie within them).
pub const FIRST_CUT: usize = 2048;

impl Sampling {
    /// Whether [`sample`] takes the highest logit without drawing (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// The next token under `s`, drawing from `rng` unless greedy.
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    if s.is_greedy() || logits.len() <= 1 {
        return argmax(logits);
    }
    let t = s.temperature as f64;
    let max = logits[argmax(logits) as usize] as f64;
    // Weights relative to the maximum: exp((l - max) / t), in (0, 1].
    let weight = |l: f32| {
        let l = l as f64;
        if l.is_nan() {
            0.0
        } else {
            ((l - max) / t).exp()
        }
    };
    let top_p = s.top_p.clamp(0.0, 1.0) as f64;
    let k = if s.top_k == 0 {
        logits.len()
    } else {
        s.top_k.min(logits.len())
    };
    if k == logits.len() && top_p >= 1.0 {
        // The whole distribution, in id order.
        let total: f64 = logits.iter().map(|&l| weight(l)).sum();
        let mut r = rng.next_f64() * total;
        let mut last = 0;
        for (i, &l) in logits.iter().enumerate() {
            let w = weight(l);
            if w > 0.0 {
                last = i;
                if r < w {
                    return i as u32;
                }
                r -= w;
            }
        }
        return last as u32;
    }
    let total: f64 = logits.iter().map(|&l| weight(l)).sum();
    // Candidates in order (logit descending, id ascending), first the best FIRST_CUT (or k) only.
    let order = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let cut = if top_p >= 1.0 { k } else { k.min(FIRST_CUT) };
    let mut cand: Vec<u32> = if cut < ids.len() {
        ids.select_nth_unstable_by(cut - 1, order);
        ids.truncate(cut);
        ids
    } else {
        ids
    };
    cand.sort_unstable_by(order);
    let w_of = |i: u32| weight(logits[i as usize]);
    let mut kept = keep_top_p(&cand, k, top_p, total, &w_of);
    if kept.is_none() {
        // The top-p set did not lie within the first cut: sort the whole vocabulary.
        let mut all: Vec<u32> = (0..logits.len() as u32).collect();
        all.sort_unstable_by(order);
        cand = all;
        kept = keep_top_p(&cand, k, top_p, total, &w_of);
    }
    let n = kept.unwrap_or(cand.len().min(k)).clamp(1, cand.len());
    let mass: f64 = cand[..n].iter().map(|&i| w_of(i)).sum();
    let mut r = rng.next_f64() * mass;
    for &i in &cand[..n] {
        let w = w_of(i);
        if r < w {
            return i;
        }
        r -= w;
    }
    cand[n - 1]
}

/// How many of `cand` (sorted, best first) the top-k and top-p cuts keep, or `None` when the kept set may extend past
/// `cand` (it holds fewer than `k` ids and their mass stays below `top_p`).
fn keep_top_p(
    cand: &[u32],
    k: usize,
    top_p: f64,
    total: f64,
    weight: &dyn Fn(u32) -> f64,
) -> Option<usize> {
    let n = cand.len().min(k);
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (i, &id) in cand[..n].iter().enumerate() {
            acc += weight(id);
            if acc >= top_p * total {
                return Some(i + 1);
            }
        }
    }
    (n == k).then_some(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn skip_continues_the_stream() {
        let mut a = Rng::new(11);
        let mut b = Rng::new(11);
        for _ in 0..5 {
            a.next_u64();
        }
        b.skip(5);
        assert_eq!(a.state(), b.state());
        assert_eq!(a.next_u64(), Rng::new(b.state()).next_u64());
    }

    #[test]
    fn greedy_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, -1.0]), 1);
        let s = Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        };
        assert_eq!(sample(&[0.0, 2.0, 2.0], &s, &mut Rng::new(1)), 1);
    }

    /// Draws follow the softmax at the temperature (an independent count against exp / sum), and a seed repeats.
    #[test]
    fn sampling_follows_the_distribution_and_repeats() {
        let logits = [1.0f32, 0.0, 2.0, -1.0];
        let s = Sampling {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
        };
        let mut rng = Rng::new(42);
        let n = 40_000;
        let mut count = [0usize; 4];
        for _ in 0..n {
            count[sample(&logits, &s, &mut rng) as usize] += 1;
        }
        let w: Vec<f64> = logits.iter().map(|&l| ((l as f64) / 0.7).exp()).collect();
        let z: f64 = w.iter().sum();
        for i in 0..4 {
            let p = w[i] / z;
            let got = count[i] as f64 / n as f64;
            assert!((got - p).abs() < 0.01, "token {i}: {got} vs {p}");
        }
        let a: Vec<u32> = (0..50)
            .map({
                let mut r = Rng::new(7);
                move |_| sample(&logits, &s, &mut r)
            })
            .collect();
        let b: Vec<u32> = (0..50)
            .map({
                let mut r = Rng::new(7);
                move |_| sample(&logits, &s, &mut r)
            })
            .collect();
        assert_eq!(a, b);
    }

    /// top-k keeps the k best; top-p the smallest head whose mass reaches p (probabilities 0.5, 0.3, 0.2 here).
    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let p = [0.2f64, 0.5, 0.3];
        let logits: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
        let mut rng = Rng::new(3);
        // (top_k, top_p) → which ids can be drawn; one RNG stream through the cases in order.
        let cases = [
            (2, 1.0, [false, true, true]),
            (0, 0.75, [false, true, true]),
            (0, 0.5, [false, true, false]),
            (0, 0.9, [true, true, true]),
        ];
        for (top_k, top_p, want) in cases {
            let s = Sampling {
                temperature: 1.0,
                top_k,
                top_p,
            };
            let mut seen = [false; 3];
            for _ in 0..2000 {
                seen[sample(&logits, &s, &mut rng) as usize] = true;
            }
            assert_eq!(seen, want, "top_k {top_k}, top_p {top_p}");
        }
    }

    /// The first cut is exact: a flat distribution whose top-p set is larger than the cut sorts the whole vocabulary.
    #[test]
    fn top_p_past_the_first_cut() {
        let logits = vec![0.0f32; 10_000];
        let s = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.99,
        };
        let mut rng = Rng::new(5);
        let max = (0..3000)
            .map(|_| sample(&logits, &s, &mut rng))
            .max()
            .unwrap();
        assert!(max > FIRST_CUT as u32, "{max}");
    }
}
