//! A safe wrapper over the `gemm` crate for strided single-precision products.

/// A strided matrix view: element (r, c) lives at `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major `[rows, cols]` matrix.
    pub fn rm(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major `[cols, rows]` buffer, seen as `[rows, cols]`.
    pub fn rm_t(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs: 1,
            cs: rows,
        }
    }
    fn last_index(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.rs + (self.cols - 1) * self.cs
        }
    }
}

/// `dst[m, n] (row stride dst_rs) = (accumulate ? dst : 0) + a[m, k] · b[k, n]`, single-threaded.
pub(crate) fn sgemm(dst: &mut [f32], dst_rs: usize, a: Mat<'_>, b: Mat<'_>, accumulate: bool) {
    let (m, n) = (a.rows, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        dst.len() > (m - 1) * dst_rs + (n - 1),
        "sgemm: dst buffer too small"
    );
    // SAFETY: the assert keeps every destination index inside `dst`, which is uniquely borrowed.
    unsafe { sgemm_raw(dst.as_mut_ptr(), dst_rs, a, b, accumulate) }
}

/// [`sgemm`] into a raw destination.
///
/// # Safety
/// `dst + r * dst_rs + c` must be valid for writes for every `r < a.rows`, `c < b.cols`, and no
/// other thread may touch those elements during the call.
pub(crate) unsafe fn sgemm_raw(
    dst: *mut f32,
    dst_rs: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    accumulate: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "sgemm: inner dimensions {k} vs {}", b.rows);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.data.len() > a.last_index() || k == 0,
        "sgemm: lhs buffer too small"
    );
    assert!(
        b.data.len() > b.last_index() || k == 0,
        "sgemm: rhs buffer too small"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                for c in 0..n {
                    // SAFETY: in bounds by the caller's contract.
                    unsafe { *dst.add(r * dst_rs + c) = 0.0 };
                }
            }
        }
        return;
    }
    // SAFETY: the asserts keep every input index inside its slice; the caller guarantees the
    // destination, which does not alias the inputs (they are shared borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_with_transposed_operand() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect(); // [n, k]
        let mut c = vec![1.0; m * n];
        sgemm(&mut c, n, Mat::rm(&a, m, k), Mat::rm_t(&bt, k, n), true);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = 1.0 + (0..k).map(|x| a[i * k + x] * bt[j * k + x]).sum::<f32>();
                assert!((c[i * n + j] - want).abs() < 1e-5);
            }
        }
    }
}
