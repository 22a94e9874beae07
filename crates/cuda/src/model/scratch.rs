//! Execution resources: the persistent forward scratch (activation buffers, the per-forward table of state
//! addresses, ids and segments), its sizes per shape, and the CUDA graph cache keyed by forward shape.

use super::*;

/// Forwards of at most this many token rows run in the persistent scratch (and may replay CUDA graphs); larger
/// ones allocate their scratch per call (launch costs are small next to their work).
pub(super) const ARENA_ROWS: usize = 4096;
/// Captured graphs kept (least recently used dropped first): a stream of requests of many lengths meets one shape
/// per bucket of rows ([`super::forward::bucket_rows`]: 88 up to 4,096 rows) times the segment counts it sends.
pub(super) const GRAPHS_KEPT: usize = 256;
/// Addresses per segment of a GDN layer in the forward's table: conv state, recurrent state, and the recurrent state
/// the segment starts from (its own, or its parent's in [`CudaModel::forward_tree`]).
pub(super) const GDN_ENTRIES: usize = 3;

impl<T: cudarc::driver::DeviceRepr> Growing<T> {
    /// A buffer of `len` values, charged as `what`.
    pub(super) fn new(m: &CudaModel, len: usize, what: &str) -> Result<Self, CudaError> {
        let mut b = Growing {
            buf: m.gpu.alloc(1)?,
            len: 0,
            _charge: None,
        };
        if len > 0 {
            b.reserve(m, len, what)?;
        }
        Ok(b)
    }

    /// Bytes charged for it.
    pub(super) fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Makes room for `len` values (the next power of two). The old charge goes first, so the budget never holds
    /// both; a failed charge leaves the buffer counted empty, to be reserved again. → whether the buffer moved
    pub(super) fn reserve(
        &mut self,
        m: &CudaModel,
        len: usize,
        what: &str,
    ) -> Result<bool, CudaError> {
        if len <= self.len {
            return Ok(false);
        }
        let len = len.next_power_of_two();
        self._charge = None;
        self.len = 0;
        self._charge = Some(m.ledger.charge(len * std::mem::size_of::<T>(), what)?);
        self.buf = m.gpu.alloc(len)?;
        self.len = len;
        Ok(true)
    }
}

impl TableLayout {
    pub(super) fn new(layers: &[Layer], n: usize, nseg: usize) -> Self {
        let entries: usize = layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Gdn(_) => GDN_ENTRIES * nseg,
                Mixer::Attn(_) => KV_ENTRIES * nseg,
            })
            .sum();
        let ids = 8 * entries;
        let segs = ids + 4 * n;
        let tok = segs + 4 * 3 * nseg;
        let par = tok + 4 * 2 * n;
        TableLayout {
            ids,
            segs,
            tok,
            par,
            len: par + 4 * nseg,
        }
    }
}

impl Scratch {
    pub(super) fn ptrs(&self, m: &CudaModel, s: Shape) -> FwdPtrs {
        let g = &*m.gpu;
        let t = TableLayout::new(&m.layers, s.n, s.nseg);
        let ptrs = g.ptr(&self.table.buf);
        FwdPtrs {
            ptrs,
            ids: ptrs + t.ids as u64,
            segs: ptrs + t.segs as u64,
            tok: ptrs + t.tok as u64,
            par: ptrs + t.par as u64,
            x: g.ptr(&self.x),
            act: g.ptr(&self.act),
            proj: g.ptr(&self.proj),
            mid: g.ptr(&self.mid),
            gates: g.ptr(&self.gates),
            wy: g.ptr(&self.wy),
            fold: g.ptr(&self.fold),
            actu: g.ptr(&self.actu),
            rot: g.ptr(&self.rot),
            attn: g.ptr(&self.attn.buf),
        }
    }
}

/// An instantiated graph. SAFETY of Send: graphs are only touched under [`CudaModel::graphs`]'s mutex (CUDA
/// requires graph calls on one object to be serialised, not to stay on one thread).
pub(super) struct Graph(pub(super) cudarc::driver::CudaGraph);
unsafe impl Send for Graph {}

impl GraphCache {
    /// The graph of `s`, now the most recently used.
    pub(super) fn get(&mut self, s: &Shape) -> Option<&cudarc::driver::CudaGraph> {
        let i = self.graphs.iter().position(|(k, _)| k == s)?;
        let hit = self.graphs.remove(i);
        self.graphs.push(hit);
        self.graphs.last().map(|(_, g)| &g.0)
    }

    /// Counts one more sight of `s`. → sights so far
    pub(super) fn note(&mut self, s: Shape) -> u32 {
        if self.seen.len() > 4096 {
            self.seen.clear();
        }
        let c = self.seen.entry(s).or_insert(0);
        *c += 1;
        *c
    }

    pub(super) fn insert(&mut self, s: Shape, g: cudarc::driver::CudaGraph) {
        if self.graphs.len() >= GRAPHS_KEPT {
            self.graphs.remove(0);
        }
        self.graphs.push((s, Graph(g)));
    }

    pub(super) fn clear(&mut self) {
        self.graphs.clear();
        self.seen.clear();
    }
}

impl CudaModel {
    /// The bytes of one forward's table over `items` then `dropped` (as [`CudaModel::forward_queue`]), laid out as
    /// [`TableLayout`] says. Per layer: GDN conv [S] | ssm [S] | the ssm each segment starts from [S] (its parent's
    /// when `par[s] >= 0`); attention [S, KV_ENTRIES]. `kv`: the address of the dropped children's KV rows and the
    /// positions it holds ([`KvLayout`]; the children's rows one after another).
    pub(super) fn table(
        &self,
        items: &[(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
        kv: (u64, usize),
    ) -> Vec<u8> {
        let g = &*self.gpu;
        let keep_children = dropped.is_empty();
        // Per segment: the recurrent state it starts from (its root's for a child) and the one it is written to (a
        // child whose state is dropped names its root's, which no launch then writes for it); its position, ids and
        // KV entries per attention layer.
        struct Seg<'a> {
            from: u64,
            to: u64,
            pos: usize,
            ids: &'a [u32],
            /// The own rows' address in a KV buffer of layout `cap` positions, at position `at`, and the base.
            own: (u64, usize, usize),
            base: Option<(&'a KvBuf, usize)>,
        }
        let root_of = |s: usize| usize::try_from(par[s]).ok().map(|p| &*items[p].0);
        let mut segs: Vec<Seg> = Vec::with_capacity(items.len() + dropped.len());
        for (s, (st, ids)) in items.iter().enumerate() {
            let to = g.ptr(&st.rec);
            segs.push(Seg {
                from: root_of(s).map_or(to, |r| g.ptr(&r.rec)),
                to,
                pos: st.pos,
                ids,
                own: (g.ptr(&st.kv.buf), st.kv.cap, 0),
                base: st.base.as_ref().map(|(b, l)| (&**b, *l)),
            });
        }
        let mut at = 0;
        for &(r, ids) in dropped {
            let (root, root_ids) = (&items[r].0, items[r].1);
            let rec = g.ptr(&root.rec);
            let pos = root.pos + root_ids.len();
            segs.push(Seg {
                from: rec,
                to: rec,
                pos,
                ids,
                own: (kv.0, kv.1, at),
                base: Some((&root.kv, pos)),
            });
            at += ids.len();
        }
        debug_assert!(keep_children || items.len() == par.iter().filter(|&&p| p < 0).count());
        let mut ptrs: Vec<u64> = Vec::with_capacity(self.layers.len() * KV_ENTRIES * segs.len());
        let mut ai = 0;
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(m) => {
                    let (conv, ssm) = (4 * m.conv_off as u64, 4 * m.ssm_off as u64);
                    ptrs.extend(segs.iter().map(|s| s.to + conv));
                    ptrs.extend(segs.iter().map(|s| s.to + ssm));
                    ptrs.extend(segs.iter().map(|s| s.from + ssm));
                }
                Mixer::Attn(_) => {
                    let row = self.kv.rows[ai];
                    let kv_at = |p: u64, cap: usize, at: usize| {
                        let (k, v) = self.kv.offsets(cap, ai);
                        let b = self.kv.bytes;
                        (
                            p + (b * (k + at * row)) as u64,
                            p + (b * (v + at * row)) as u64,
                        )
                    };
                    for s in &segs {
                        let (ok, ov) = kv_at(s.own.0, s.own.1, s.own.2);
                        let (bk, bv, blen) = match s.base {
                            Some((b, len)) => {
                                let (bk, bv) = kv_at(g.ptr(&b.buf), b.cap, 0);
                                (bk, bv, len as u64)
                            }
                            None => (0, 0, 0),
                        };
                        ptrs.extend([ok, ov, bk, bv, blen]);
                    }
                    ai += 1;
                }
            }
        }
        let mut ids: Vec<i32> = Vec::new();
        let mut seg_rows = Vec::with_capacity(segs.len() * 3);
        let mut tok = Vec::new();
        for (si, s) in segs.iter().enumerate() {
            seg_rows.extend([ids.len() as i32, s.ids.len() as i32, s.pos as i32]);
            for (i, &id) in s.ids.iter().enumerate() {
                tok.extend([si as i32, (s.pos + i) as i32]);
                ids.push(id as i32);
            }
        }
        let mut bytes: Vec<u8> =
            Vec::with_capacity(8 * ptrs.len() + 4 * (ids.len() * 3 + seg_rows.len() + par.len()));
        bytes.extend(ptrs.iter().flat_map(|p| p.to_le_bytes()));
        for v in [&ids, &seg_rows, &tok, par] {
            bytes.extend(v.iter().flat_map(|i| i.to_le_bytes()));
        }
        bytes
    }

    /// f32 values of key-split scratch the tensor-core attention needs for this shape (0 with [`AttnKernels::Tiled`]).
    pub(super) fn attn_scratch(&self, s: Shape) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attn(m) if m.tc => {
                    crate::attn_tc::attention_tc_scratch_len(s.attn_splits, s.n, m.a)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// The dims of the first attention layer that runs on tensor cores (the split plan's; Qwen3.5's attention
    /// layers share theirs, and any split count is correct for any layer).
    pub(super) fn attn_tc_dims(&self) -> Option<AttnDims> {
        self.layers.iter().find_map(|l| match &l.mixer {
            Mixer::Attn(m) if m.tc => Some(m.a),
            _ => None,
        })
    }

    /// Values per token row of each forward scratch buffer (the widest layer's).
    pub(super) fn widths(&self) -> Widths {
        let mut w = Widths {
            proj: 2 * self.inter,
            mid: 0,
            act: self.hid.max(self.inter),
            gates: 1,
            wy: 0,
            fold: 0,
            actu: 0,
            rot: 0,
        };
        if self.prec.planes()
            && self
                .residual_linears()
                .any(|(_, lin)| lin.f16_exp.is_none())
        {
            // Residual GEMMs over both planes write 2N rows of H.
            w.fold = 2 * self.hid;
        }
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(m) => {
                    w.proj = w.proj.max(m.proj_width());
                    w.mid = w.mid.max(m.cd + m.d.hv * m.d.dv);
                    w.act = w.act.max(m.d.hv * m.d.dv);
                    w.gates = w.gates.max(2 * m.d.hv);
                    // The WY pre-pass's U, W, M and decays of every chunk.
                    w.wy = w.wy.max(ops::gdn_wy_scratch(m.d));
                }
                Mixer::Attn(m) => {
                    w.proj = w.proj.max(m.proj_width());
                    w.act = w.act.max(m.a.heads * m.a.head_dim);
                    w.mid = w.mid.max(m.a.heads * m.a.head_dim);
                }
            }
        }
        if self.rotated {
            w.actu = self.hid;
            w.rot = w.act;
        }
        w
    }

    /// Scratch for forwards of up to `rows` token rows and a table of `table_len` bytes, charged to the budget.
    pub(super) fn scratch(&self, rows: usize, table_len: usize) -> Result<Scratch, CudaError> {
        let g = &*self.gpu;
        let w = self.widths();
        let floats =
            rows * (self.hid + w.act + w.proj + w.mid + w.gates + w.wy + w.fold + w.actu + w.rot);
        let charge = self.ledger.charge(4 * floats, "forward scratch")?;
        Ok(Scratch {
            rows,
            bytes: 4 * floats,
            table: Growing::new(self, table_len, "forward table")?,
            x: g.alloc(rows * self.hid)?,
            // GEMM inputs: bf16, two bf16 planes (split) or f32 (allocated for the larger).
            act: g.alloc(rows * w.act)?,
            proj: g.alloc(rows * w.proj)?,
            mid: g.alloc(rows * w.mid)?,
            gates: g.alloc(rows * w.gates)?,
            wy: g.alloc(rows * w.wy)?,
            fold: g.alloc(rows * w.fold)?,
            // A rotated pack's normed input as it is (in act's layout) and the f32 output of a rotated site.
            actu: g.alloc(rows * w.actu)?,
            rot: g.alloc(rows * w.rot)?,
            attn: Growing::new(self, 0, "attention scratch")?,
            kv: Growing::new(self, 0, "tree children's KV rows")?,
            _charge: charge,
        })
    }

    /// The persistent scratch, made ready for a forward of `s` whose table is `table_len` bytes: allocated anew when
    /// it holds fewer rows (the old one freed first, so that the budget holds one arena at a time), its table and
    /// attention scratch grown. Whatever moves takes the graphs that captured its addresses with it. → the locked arena
    /// (always `Some`)
    pub(super) fn arena_for(
        &self,
        s: Shape,
        table_len: usize,
    ) -> Result<std::sync::MutexGuard<'_, Option<Scratch>>, CudaError> {
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        if arena.as_ref().is_none_or(|a| a.rows < s.n) {
            let (rows, tl) = arena.as_ref().map_or((0, 0), |a| (a.rows, a.table.len));
            *arena = None;
            self.drop_graphs();
            let rows = s.n.max(rows).next_power_of_two().clamp(256, ARENA_ROWS);
            *arena = Some(self.scratch(rows, table_len.max(tl).next_power_of_two())?);
        }
        let a = arena
            .as_mut()
            .ok_or_else(|| CudaError::Unsupported("no arena".into()))?;
        // The children's KV rows may move freely: only the table names them.
        let moved = a.table.reserve(self, table_len, "forward table")?;
        if a.attn
            .reserve(self, self.attn_scratch(s), "attention scratch")?
            || moved
        {
            self.drop_graphs();
        }
        Ok(arena)
    }

    /// Runs `f` (one forward's launches of shape `s`, over the persistent scratch) through a CUDA graph when this shape
    /// was seen before (the first sight runs them directly, so one-off shapes never pay a capture; the second captures
    /// and instantiates the graph, then launches it).
    pub(super) fn graphed(
        &self,
        s: Shape,
        f: &dyn Fn() -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        if self.profiling() || !self.use_graphs.load(Ordering::Relaxed) {
            return f();
        }
        let mut c = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gr) = c.get(&s) {
            self.graph_runs.fetch_add(1, Ordering::Relaxed);
            return gr.launch().map_err(|err| CudaError::Driver {
                op: "graph launch",
                err,
            });
        }
        if c.note(s) < 2 {
            drop(c);
            return f();
        }
        let stream = &self.gpu.stream;
        stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(|err| CudaError::Driver {
                op: "begin capture",
                err,
            })?;
        let r = f();
        let gr = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        match (r, gr) {
            (Ok(()), Ok(Some(gr))) => {
                self.graph_runs.fetch_add(1, Ordering::Relaxed);
                gr.launch().map_err(|err| CudaError::Driver {
                    op: "graph launch",
                    err,
                })?;
                c.insert(s, gr);
                Ok(())
            }
            // Something in the forward cannot be captured (nothing ran): no graphs from now on.
            _ => {
                self.use_graphs.store(false, Ordering::Relaxed);
                c.clear();
                drop(c);
                f()
            }
        }
    }
}
