//! Sequence state on the device: the memory ledger that enforces the budget, the KV layout of the attention layers,
//! [`CudaState`] (recurrent and conv state, own KV rows over a shared forked-from base) and its creation and forking.

use super::*;

impl Ledger {
    /// Counts `bytes` more, or fails (counting nothing) when that would pass the budget.
    pub(super) fn charge(self: &Arc<Self>, bytes: usize, what: &str) -> Result<Charge, CudaError> {
        let budget = self.budget.load(Ordering::Relaxed);
        let prev = self.live.fetch_add(bytes, Ordering::Relaxed);
        if budget > 0 && prev + bytes > budget {
            self.live.fetch_sub(bytes, Ordering::Relaxed);
            return Err(CudaError::Budget {
                what: what.to_string(),
                need: bytes,
                live: prev,
                budget,
            });
        }
        Ok(Charge {
            ledger: self.clone(),
            bytes,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.ledger.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl KvLayout {
    /// `f16`: the caches hold f16 values, else f32.
    pub(super) fn new(rows: Vec<usize>, f16: bool) -> Self {
        let pre = rows
            .iter()
            .scan(0, |acc, r| {
                let at = *acc;
                *acc += 2 * r;
                Some(at)
            })
            .collect();
        let per_pos = 2 * rows.iter().sum::<usize>();
        KvLayout {
            rows,
            pre,
            per_pos,
            bytes: if f16 { 2 } else { 4 },
        }
    }

    /// Value offsets of layer `a`'s K and V rows in a buffer of `cap` positions.
    pub(super) fn offsets(&self, cap: usize, a: usize) -> (usize, usize) {
        let k = cap * self.pre[a];
        (k, k + cap * self.rows[a])
    }

    /// f32 words that `values` values take (an offset or a count; whole with f16, see [`KvLayout::bytes`]).
    pub(super) fn words(&self, values: usize) -> usize {
        (values * self.bytes).div_ceil(4)
    }
}

impl CudaState {
    /// Tokens consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Device bytes this state holds itself (a forked-from KV base it shares is not counted).
    pub fn bytes(&self) -> usize {
        let own = if self.kv.cap > 0 {
            self.kv.buf.len()
        } else {
            0
        };
        4 * (self.rec.len() + own)
    }

    pub(super) fn base_len(&self) -> usize {
        self.base.as_ref().map_or(0, |b| b.1)
    }
}

impl CudaModel {
    /// A KV buffer of `cap` positions: every attention layer's K and V rows ([`KvLayout`]), one allocation.
    pub(super) fn kv_buf(&self, cap: usize) -> Result<KvBuf, CudaError> {
        let floats = self.kv.words(cap * self.kv.per_pos);
        let charge = self.ledger.charge(4 * floats, "KV cache")?;
        Ok(KvBuf {
            buf: self.gpu.alloc(floats)?,
            cap,
            _charge: Some(charge),
        })
    }

    /// Copies positions `0..rows` of every layer's K and V rows from `src` to `dst` starting at position `at`.
    pub(super) fn copy_kv(
        &self,
        src: &KvBuf,
        dst: &mut KvBuf,
        at: usize,
        rows: usize,
    ) -> Result<(), CudaError> {
        for (a, &row) in self.kv.rows.iter().enumerate() {
            let (sk, sv) = self.kv.offsets(src.cap, a);
            let (dk, dv) = self.kv.offsets(dst.cap, a);
            let w = |v: usize| self.kv.words(v);
            for (s, d) in [(sk, dk), (sv, dv)] {
                self.gpu
                    .copy(&src.buf, w(s), &mut dst.buf, w(d + at * row), w(rows * row))?;
            }
        }
        Ok(())
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let rec = g.zeros(self.rec_len)?;
        Ok(CudaState {
            pos: 0,
            rec,
            kv: self.empty_kv.clone(),
            base: None,
            _charge: charge,
        })
    }

    /// The pad root's state of a plain forward padded to its bucket (`forward::Pad::Root`), at position 0: the one
    /// kept from the last such forward, or a new one with KV rows for the most pad rows. Its conv and recurrent
    /// state hold whatever that forward left (finite: its own rows' inputs and updates); only its own rows read them.
    pub(super) fn take_pad_state(&self) -> Result<CudaState, CudaError> {
        let kept = self
            .pad_state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let mut st = match kept {
            Some(st) => st,
            None => {
                let mut st = self.new_state()?;
                self.reserve(&mut st, super::forward::PAD_MAX)?;
                st
            }
        };
        st.pos = 0;
        Ok(st)
    }

    /// Keeps `st` for the next plain forward padded to its bucket ([`CudaModel::take_pad_state`]).
    pub(super) fn put_pad_state(&self, st: CudaState) {
        *self.pad_state.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
    }

    /// `n` independent device-side continuations of `st`: the recurrent state copied (one copy per fork),
    /// the KV caches shared read-only (a fork appends to its own rows). Neither side sees the other's later
    /// tokens.
    pub fn fork(&self, st: &CudaState, n: usize) -> Result<Vec<CudaState>, CudaError> {
        let out = (0..n).map(|_| self.copy_state(st)).collect();
        self.mark("fork")?;
        out
    }

    /// A device-side copy (snapshot); restore by using the copy in place of the original.
    pub fn copy_state(&self, st: &CudaState) -> Result<CudaState, CudaError> {
        let g = &*self.gpu;
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let mut rec = g.alloc(self.rec_len)?;
        g.copy(&st.rec, 0, &mut rec, 0, self.rec_len)?;
        let (kv, base) = match &st.base {
            // The usual case: share everything this state holds.
            None => (self.empty_kv.clone(), Some((st.kv.clone(), st.pos))),
            // A fork of a fork: one level of sharing only, so copy base and own rows into a new buffer.
            Some((b, blen)) => {
                let mut nb = self.kv_buf(st.pos.next_multiple_of(256))?;
                self.copy_kv(b, &mut nb, 0, *blen)?;
                self.copy_kv(&st.kv, &mut nb, *blen, st.pos - blen)?;
                (Arc::new(nb), None)
            }
        };
        Ok(CudaState {
            pos: st.pos,
            rec,
            kv,
            base,
            _charge: charge,
        })
    }

    /// Grows the own KV rows of `st` to hold positions up to `need`.
    pub(super) fn reserve(&self, st: &mut CudaState, need: usize) -> Result<(), CudaError> {
        let blen = st.base_len();
        let rows = need - blen;
        if rows > st.kv.cap {
            let mut nb = self.kv_buf(rows.next_multiple_of(256).max(st.kv.cap * 2))?;
            self.copy_kv(&st.kv, &mut nb, 0, st.pos - blen)?;
            st.kv = Arc::new(nb);
        }
        Ok(())
    }
}
