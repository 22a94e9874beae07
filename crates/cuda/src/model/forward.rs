//! The forward entry points: input checks, `forward` / `forward_batch`, the one-forward trees (`forward_tree`: a
//! request's shared prefixes and their suffixes in one forward), and `forward_queue`, which stages states, table and
//! scratch, then runs the layers (directly or as a CUDA graph) and the final norm.

use super::*;

impl CudaModel {
    pub(super) fn check_input(&self, st: &CudaState, ids: &[u32]) -> Result<(), CudaError> {
        self.check_ids(st.pos, ids)?;
        let fits = |b: &KvBuf| b.cap == 0 || b.buf.len() == self.kv.words(b.cap * self.kv.per_pos);
        if !fits(&st.kv)
            || !st.base.as_ref().is_none_or(|b| fits(&b.0))
            || st.rec.len() != self.rec_len.max(1)
        {
            return Err(CudaError::Model(ModelError::Input(
                "sequence state belongs to another model".into(),
            )));
        }
        Ok(())
    }

    /// `ids` continue a sequence at position `pos`: not empty, in the vocabulary, within the positions.
    pub(super) fn check_ids(&self, pos: usize, ids: &[u32]) -> Result<(), CudaError> {
        let bad = |m: String| CudaError::Model(ModelError::Input(m));
        if ids.is_empty() {
            return Err(bad("empty token sequence".into()));
        }
        if let Some(b) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(bad(format!(
                "token id {b} is outside the vocabulary (0..{})",
                self.vocab
            )));
        }
        if pos + ids.len() > self.max_pos {
            return Err(bad(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                pos + ids.len(),
                self.max_pos
            )));
        }
        Ok(())
    }

    /// Runs `ids` through the model, continuing `state`. → hidden [T, H] on the device
    pub fn forward(&self, state: &mut CudaState, ids: &[u32]) -> Result<CudaHidden, CudaError> {
        self.forward_batch(&mut [(state, ids)])
    }

    /// Runs several sequences at once (the projections see all tokens stacked, the mixers walk each
    /// segment with its own state). → hidden [ΣT, H] on the device, sequences in order.
    pub fn forward_batch(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
    ) -> Result<CudaHidden, CudaError> {
        timed(&self.enqueue_ns, || {
            let par = vec![-1; items.len()];
            self.prepare(items)?;
            self.forward_queue(items, &[], &par)
        })
    }

    /// Checks every item's ids against its state, then grows each state's KV rows to hold them.
    pub(super) fn prepare(&self, items: &mut [(&mut CudaState, &[u32])]) -> Result<(), CudaError> {
        for (st, seq) in items.iter() {
            self.check_input(st, seq)?;
        }
        for (st, seq) in items.iter_mut() {
            let need = st.pos + seq.len();
            self.reserve(st, need)?;
        }
        Ok(())
    }

    /// Runs `roots` (each continuing its state, as [`CudaModel::forward_batch`]) and `children` — `(root, ids)`, a
    /// continuation of `roots[root]` after the root's ids — in ONE forward: within each layer the children's mixers
    /// start from the state their root reached in that layer (conv inputs from the root's last rows, a second state
    /// pass launch that reads the root's recurrent state, attention over the root's cache rows written earlier in the
    /// layer). Every weight is read and every kernel launched once for roots and children together, instead of once
    /// for the roots and again for the forks. → the hidden rows of the roots' ids then of the children's, and with
    /// `keep` the children's states (equal to forks of the roots after their ids, sharing the roots' KV caches
    /// read-only); without it none, and nothing is allocated for them: their recurrent states are never written (the
    /// state pass skips its last update) and their KV rows live in the forward scratch.
    ///
    /// `Ok(None)`, with nothing run: this model does not take the tree ([`GdnKernels::Simt`], a GDN layer the
    /// tensor-core state pass does not take, trees turned off), or a root with children has fewer ids than
    /// `tree_min_root` or is itself a fork (its KV caches shared). The caller then runs the roots, forks them and runs
    /// the children.
    pub fn forward_tree(
        &self,
        roots: &mut [(&mut CudaState, &[u32])],
        children: &[(usize, &[u32])],
        keep: bool,
    ) -> Result<Option<(CudaHidden, Vec<CudaState>)>, CudaError> {
        if children.is_empty() {
            return Ok(Some((self.forward_batch(roots)?, Vec::new())));
        }
        let Some(min_root) = self
            .tree_min_root
            .filter(|_| self.tree_on.load(Ordering::Relaxed))
        else {
            return Ok(None);
        };
        for &(r, _) in children {
            let Some((st, ids)) = roots.get(r) else {
                return Err(CudaError::Model(ModelError::Input(format!(
                    "child of root {r}, of {} roots",
                    roots.len()
                ))));
            };
            if ids.len() < min_root || st.base.is_some() {
                return Ok(None);
            }
        }
        let r = timed(&self.enqueue_ns, || self.run_tree(roots, children, keep))?;
        self.trees.fetch_add(1, Ordering::Relaxed);
        Ok(Some(r))
    }

    /// [`CudaModel::forward_tree`] once it takes the tree.
    pub(super) fn run_tree(
        &self,
        roots: &mut [(&mut CudaState, &[u32])],
        children: &[(usize, &[u32])],
        keep: bool,
    ) -> Result<(CudaHidden, Vec<CudaState>), CudaError> {
        // The roots' KV rows first: a child shares its root's buffer as it stands after this.
        self.prepare(roots)?;
        for &(r, ids) in children {
            self.check_ids(roots[r].0.pos + roots[r].1.len(), ids)?;
        }
        let par: Vec<i32> = (0..roots.len())
            .map(|_| -1)
            .chain(children.iter().map(|&(r, _)| r as i32))
            .collect();
        if !keep {
            let h = self.forward_queue(roots, children, &par)?;
            return Ok((h, Vec::new()));
        }
        let mut kids = Vec::with_capacity(children.len());
        for &(r, ids) in children {
            let mut kid = self.continuation(roots[r].0, roots[r].1.len())?;
            let need = kid.pos + ids.len();
            self.reserve(&mut kid, need)?;
            kids.push(kid);
        }
        let mut items: Vec<(&mut CudaState, &[u32])> = roots
            .iter_mut()
            .map(|(st, ids)| (&mut **st, *ids))
            .chain(
                kids.iter_mut()
                    .zip(children)
                    .map(|(st, &(_, ids))| (st, ids)),
            )
            .collect();
        let h = self.forward_queue(&mut items, &[], &par)?;
        Ok((h, kids))
    }

    /// The state a continuation of `st` after `ahead` more ids starts from, for a [`CudaModel::forward_tree`] that
    /// keeps it: its KV rows share `st`'s (not yet written), its conv and recurrent state are left for that forward to
    /// write (every value of them: the conv states from the root's and its own rows, the recurrent ones by the state
    /// pass).
    pub(super) fn continuation(
        &self,
        st: &CudaState,
        ahead: usize,
    ) -> Result<CudaState, CudaError> {
        let charge = self.ledger.charge(4 * self.rec_len, "sequence state")?;
        let pos = st.pos + ahead;
        Ok(CudaState {
            pos,
            rec: self.gpu.alloc(self.rec_len)?,
            kv: self.empty_kv.clone(),
            base: Some((st.kv.clone(), pos)),
            _charge: charge,
        })
    }

    /// Whether a forward over `items` then `dropped` (as [`CudaModel::forward_queue`]) of `rows` rows is padded to
    /// its bucket ([`bucket_rows`]), and how ([`Pad`]): the pad rows come after every other, so the caller's rows
    /// keep their places; they are computed and never read. Forwards of a bucket then share one shape (the bucket's
    /// rows, the longest segment counted in whole chunks: [`CudaModel::shape_of`]), so that requests of lengths not
    /// seen before replay a captured graph instead of launching each kernel. Padded, with shape buckets on, forwards
    /// that fit the persistent scratch and whose longest segment is more than one id (not a decode step): plain ones
    /// (every segment a root) by one more root ([`Pad::Root`]); trees whose children's states are dropped by the
    /// last child's ids going on within its last gated delta chunk ([`Pad::Extend`], not in batch-invariant mode),
    /// else by one more such child ([`Pad::Child`]) where a root may take one (as [`CudaModel::forward_tree`]
    /// requires: at least `tree_min_root` ids, not itself a fork, the child's positions within the model's; the one
    /// with the fewest positions, whose keys are what the pad rows' attention reads). Not padded: trees whose
    /// children keep states.
    pub(super) fn pad_for(
        &self,
        items: &[(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
        rows: usize,
    ) -> Option<Pad> {
        if !self.shape_buckets() {
            return None;
        }
        let roots: Vec<RootInfo> = items
            .iter()
            .map(|(st, ids)| RootInfo {
                ids: ids.len(),
                pos: st.pos,
                forked: st.base.is_some(),
            })
            .collect();
        let children: Vec<(usize, usize)> =
            dropped.iter().map(|&(r, ids)| (r, ids.len())).collect();
        let min_root = self
            .tree_min_root
            .filter(|_| self.tree_on.load(Ordering::Relaxed));
        let kept_children = par.iter().any(|&p| p >= 0) && dropped.is_empty();
        let tree = TreeInfo {
            children: &children,
            kept_children,
            min_root,
            extend: !self.batch_invariant(),
        };
        choose_pad(&roots, tree, rows, self.max_pos)
    }

    /// The graph key of a forward over segments of `lens` ids, the first `roots` of them roots (see
    /// [`CudaModel::forward_queue`]), the children's states written when `keep_children`. `padded`: the forward
    /// was padded to its bucket ([`CudaModel::pad_for`]; the pad in the last segment): the longest segment is
    /// counted at its length rounded up to whole gated delta chunks (every launch bounded by it exits past a
    /// segment's own length), and attention's key splits are planned from that and the last one's whole chunks
    /// (batch-invariant: at the most any segment may take, which each segment's own plan then caps), so that the
    /// forwards of a bucket share one key.
    pub(super) fn shape_of(
        &self,
        lens: &[usize],
        roots: usize,
        keep_children: bool,
        padded: bool,
    ) -> Shape {
        let invariant = self.batch_invariant();
        let children = &lens[roots.min(lens.len())..];
        let LensKey {
            n,
            nseg,
            max_len,
            chunks,
            counted,
        } = lens_key(lens, padded);
        Shape {
            n,
            nseg,
            roots,
            keep_children,
            // Batch-invariant: whichever children are short take the leaf pass (the others the state pass), so a
            // child's kernel follows from its own length.
            short_children: if invariant {
                children.iter().any(|&l| l <= ops::GDN_CHUNK)
            } else {
                children.iter().all(|&l| l <= ops::GDN_CHUNK)
            },
            long_children: invariant && children.iter().any(|&l| l > ops::GDN_CHUNK),
            max_len,
            chunks,
            split: self.split_gemms(),
            attn_splits: self.attn_tc_dims().map_or(1, |a| {
                let sms = self.gpu.sms;
                if invariant && padded {
                    // A segment's own plan is non-increasing in its length: one row's is the most any takes.
                    crate::attn_tc::attention_tc_segment_splits(1, a, sms)
                } else if invariant {
                    lens.iter()
                        .map(|&l| crate::attn_tc::attention_tc_segment_splits(l, a, sms))
                        .max()
                        .unwrap_or(1)
                } else {
                    crate::attn_tc::attention_tc_plan(counted.iter().copied(), a, sms)
                }
            }),
            step: Step::Forward,
            invariant,
        }
    }

    /// One forward over `items` then `dropped` (see [`CudaModel::forward_tree`] for `par`: -1, or the index of the
    /// earlier segment a segment continues; those come after every segment with -1). `dropped`: children `(root,
    /// ids)` without states of their own (their recurrent states are not written, their KV rows live in the forward
    /// scratch); when empty, the states of every child among `items` are written.
    pub(super) fn forward_queue(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
    ) -> Result<CudaHidden, CudaError> {
        let rows: usize = items.iter().map(|(_, s)| s.len()).sum::<usize>()
            + dropped.iter().map(|(_, s)| s.len()).sum::<usize>();
        if rows == 0 {
            return Err(CudaError::Model(ModelError::Input("empty batch".into())));
        }
        // Padded to its bucket: ids 0 after every other row, as one more segment or the last child's.
        match self.pad_for(items, dropped, par, rows) {
            None => self.run_forward(items, dropped, par, rows, false),
            Some(Pad::Child { root, pad }) => {
                let dropped = [dropped, &[(root, &PAD_IDS[..pad])]].concat();
                let par = [par, &[root as i32]].concat();
                self.run_forward(items, &dropped, &par, rows, true)
            }
            Some(Pad::Extend(pad)) => {
                let mut dropped = dropped.to_vec();
                let Some(last) = dropped.last_mut() else {
                    return self.run_forward(items, &dropped, par, rows, false);
                };
                let ids = [last.1, &PAD_IDS[..pad]].concat();
                last.1 = &ids;
                self.run_forward(items, &dropped, par, rows, true)
            }
            Some(Pad::Root(pad)) => {
                // Without room for the pad state (the memory budget), unpadded.
                let Ok(mut st) = self.take_pad_state() else {
                    return self.run_forward(items, dropped, par, rows, false);
                };
                let mut padded: Vec<(&mut CudaState, &[u32])> = items
                    .iter_mut()
                    .map(|(st, ids)| (&mut **st, *ids))
                    .collect();
                padded.push((&mut st, &PAD_IDS[..pad]));
                let par = [par, &[-1]].concat();
                let r = self.run_forward(&mut padded, dropped, &par, rows, true);
                drop(padded);
                self.put_pad_state(st);
                r
            }
        }
    }

    /// [`CudaModel::forward_queue`] once padded (`padded`: the last segment is the pad, [`CudaModel::pad_for`]),
    /// the caller's segments holding the first `rows` rows.
    fn run_forward(
        &self,
        items: &mut [(&mut CudaState, &[u32])],
        dropped: &[(usize, &[u32])],
        par: &[i32],
        rows: usize,
        padded: bool,
    ) -> Result<CudaHidden, CudaError> {
        let g = &*self.gpu;
        let hid = self.hid;
        let lens: Vec<usize> = items
            .iter()
            .map(|(_, s)| s.len())
            .chain(dropped.iter().map(|(_, s)| s.len()))
            .collect();
        let nseg = lens.len();
        let roots = par.iter().take_while(|&&p| p < 0).count();
        if self.profiling() {
            // Hold the GPU (~20 ms at 2 GHz) while this forward is queued: the events then time GPU work only.
            crate::launch!(g, g.k.spin_wait, crate::runtime::cfg((1, 1), 1, 0); 40_000_000i64)?;
        }
        self.mark("start")?;
        let n: usize = lens.iter().sum();
        let shape = self.shape_of(&lens, roots, dropped.is_empty(), padded);
        let table_len = TableLayout::new(&self.layers, n, nseg).len;
        // Positions of KV rows the dropped children write into the scratch.
        let kv_rows: usize = dropped.iter().map(|(_, s)| s.len()).sum();
        let ph = &self.phase_ns;
        let (out, _out_charge) = timed(&ph.out, || -> Result<_, CudaError> {
            let out: CudaSlice<f32> = g.alloc(n * hid)?;
            Ok((out, self.ledger.charge(4 * n * hid, "forward scratch")?))
        })?;
        let span0 = self.span_event()?;
        // The table, written once the scratch (which holds the dropped children's KV rows) is in place.
        let upload = |sc: &mut Scratch| {
            timed(&ph.table, || -> Result<FwdPtrs, CudaError> {
                sc.kv.reserve(
                    self,
                    self.kv.words(kv_rows * self.kv.per_pos),
                    "tree children's KV rows",
                )?;
                let table = self.table(items, dropped, par, (g.ptr(&sc.kv.buf), kv_rows));
                debug_assert_eq!(table.len(), table_len, "the table and its layout disagree");
                g.upload_into(&table, &sc.table.buf)?;
                Ok(sc.ptrs(self, shape))
            })
        };
        if n <= ARENA_ROWS {
            // The persistent scratch: fixed addresses, so a repeated shape can replay a captured CUDA graph.
            let mut arena = self.arena_for(shape, table_len)?;
            let a = arena
                .as_mut()
                .ok_or_else(|| CudaError::Unsupported("no arena".into()))?;
            let p = upload(a)?;
            timed(&ph.launch, || {
                self.graphed(shape, &|| self.run_layers(&p, shape))
            })?;
            timed(&ph.out, || self.final_norm(&p, shape, &out))?;
        } else {
            let mut sc = self.scratch(n, table_len)?;
            sc.attn
                .reserve(self, self.attn_scratch(shape), "attention scratch")?;
            let p = upload(&mut sc)?;
            timed(&ph.launch, || self.run_layers(&p, shape))?;
            timed(&ph.out, || self.final_norm(&p, shape, &out))?;
            // The scratch is freed in stream order when it drops here.
        }
        if let (Some(a), Some(b)) = (span0, self.span_event()?) {
            self.spans.push((a, b));
        }
        for (st, seq) in items.iter_mut() {
            st.pos += seq.len();
        }
        Ok(CudaHidden {
            buf: out,
            // The pad rows come after every other: the caller's rows are the first ones.
            rows,
            hid,
        })
    }
}

/// How a forward is padded to its bucket ([`CudaModel::pad_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pad {
    /// A plain forward: one more root of this many ids, on the model's pad state ([`CudaModel::take_pad_state`]).
    Root(usize),
    /// A tree whose children's states are dropped: one more such child of `items[root]`, of `pad` ids.
    Child { root: usize, pad: usize },
    /// A tree whose children's states are dropped: the last child's ids go on by this many ids 0 within its last
    /// gated delta chunk, so no segment is added and none changes its kernels (the leaf pass or the state pass, the
    /// chunk counts); the child's own rows come before them and, causal, never see them. Its last attention tile's
    /// keys then reach further, which moves where that tile's key splits fall: not in batch-invariant mode.
    Extend(usize),
}

/// What [`choose_pad`] needs of a segment with a state: its ids, the position it starts at, and whether it is a fork
/// (its KV rows partly another state's).
#[derive(Clone, Copy, Debug)]
struct RootInfo {
    ids: usize,
    pos: usize,
    forked: bool,
}

/// What [`choose_pad`] needs of a forward's tree: the dropped children (their root's index in `items`, their ids),
/// whether some of `items` are children keeping their states, the tree's shortest root (`None`: no trees), and
/// whether the last child may be extended ([`Pad::Extend`]: outside batch-invariant mode).
#[derive(Clone, Copy, Debug)]
struct TreeInfo<'a> {
    children: &'a [(usize, usize)],
    kept_children: bool,
    min_root: Option<usize>,
    extend: bool,
}

/// [`CudaModel::pad_for`]'s choice, from the segments with states (`items`), the tree, the forward's `rows` and the
/// model's positions.
fn choose_pad(items: &[RootInfo], tree: TreeInfo, rows: usize, max_pos: usize) -> Option<Pad> {
    let bucket = bucket_rows(rows);
    if bucket > ARENA_ROWS
        || tree.kept_children
        || items
            .iter()
            .map(|r| r.ids)
            .chain(tree.children.iter().map(|c| c.1))
            .all(|l| l <= 1)
    {
        return None;
    }
    let pad = bucket - rows;
    let Some(&(last_root, last)) = tree.children.last() else {
        return (pad <= max_pos).then_some(Pad::Root(pad));
    };
    let within_chunk = last % ops::GDN_CHUNK != 0 && last % ops::GDN_CHUNK + pad <= ops::GDN_CHUNK;
    let fits = |r: &RootInfo| r.pos + r.ids + last + pad <= max_pos;
    if tree.extend && within_chunk && items.get(last_root).is_some_and(fits) {
        return Some(Pad::Extend(pad));
    }
    let min_root = tree.min_root?;
    (0..items.len())
        .filter(|&r| {
            let x = items[r];
            x.ids >= min_root && !x.forked && x.pos + x.ids + pad <= max_pos
        })
        .min_by_key(|&r| items[r].pos + items[r].ids)
        .map(|root| Pad::Child { root, pad })
}

/// The most pad rows a forward takes ([`bucket_rows`]): one gated delta chunk, so the pad child is a short one.
pub(super) const PAD_MAX: usize = ops::GDN_CHUNK;
/// The pad child's ids.
static PAD_IDS: [u32; PAD_MAX] = [0; PAD_MAX];

/// What a forward's graph key takes from its segment lengths alone ([`CudaModel::shape_of`]).
struct LensKey<'a> {
    /// Rows.
    n: usize,
    /// Segments.
    nseg: usize,
    /// The longest segment as the launches count it ([`counted_lens`]).
    max_len: usize,
    /// Gated delta chunks over all segments (each segment's length in chunks, rounded up, summed).
    chunks: usize,
    /// The lengths attention's key-split plan counts ([`counted_lens`]).
    counted: std::borrow::Cow<'a, [usize]>,
}

/// [`LensKey`] of segments of `lens` ids, `padded` as in [`CudaModel::shape_of`].
fn lens_key(lens: &[usize], padded: bool) -> LensKey<'_> {
    let (max_len, counted) = counted_lens(lens, padded);
    LensKey {
        n: lens.iter().sum(),
        nseg: lens.len(),
        max_len,
        chunks: lens.iter().map(|l| l.div_ceil(ops::GDN_CHUNK)).sum(),
        counted,
    }
}

/// The longest segment as a forward's launches count it, and the segment lengths attention's key-split plan counts
/// ([`CudaModel::shape_of`]). Padded ([`CudaModel::pad_for`], the pad in the last segment): the longest and the last
/// at their lengths rounded up to whole gated delta chunks (the longest at most the forward's rows; a pad segment at
/// the most pad rows), so that neither moves within a bucket; else as they are.
fn counted_lens(lens: &[usize], padded: bool) -> (usize, std::borrow::Cow<'_, [usize]>) {
    let longest = lens.iter().copied().max().unwrap_or(0);
    if !padded {
        return (longest, lens.into());
    }
    let max_len = longest
        .next_multiple_of(ops::GDN_CHUNK)
        .min(lens.iter().sum());
    let counted = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| match (l == longest, i + 1 == lens.len()) {
            (true, _) => max_len,
            (false, true) => l.next_multiple_of(ops::GDN_CHUNK),
            (false, false) => l,
        })
        .collect::<Vec<_>>();
    (max_len, counted.into())
}

/// The rows a forward of `rows` rows is padded to ([`CudaModel::pad_for`]): the next multiple of 16 above it below
/// 256 rows, of 32 below 1,024, of 64 from there (so at most 6%, 3% and 6% more rows, and at least one pad row, so
/// that every forward of a bucket has the same segments).
pub(super) fn bucket_rows(rows: usize) -> usize {
    let step = match rows {
        0..256 => 16,
        256..1024 => 32,
        _ => PAD_MAX,
    };
    (rows / step + 1) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_pad_by_one_to_one_chunk_and_share_their_rows() {
        for rows in 1..=super::ARENA_ROWS {
            let b = bucket_rows(rows);
            assert!(b > rows && b - rows <= PAD_MAX, "{rows} rows -> {b}");
            // Every row count between the bucket below and this one lands in it.
            let step = if rows < 256 {
                16
            } else if rows < 1024 {
                32
            } else {
                64
            };
            assert_eq!(b % step, 0, "{rows} rows -> {b}");
            assert_eq!(bucket_rows(b - 1), b, "{rows} rows");
            assert!(b - step <= rows, "{rows} rows -> {b}: a bucket skipped");
        }
        assert_eq!(bucket_rows(402), 416);
        assert_eq!((bucket_rows(255), bucket_rows(256)), (256, 288));
        assert_eq!(bucket_rows(3691), 3712);
    }

    #[test]
    fn the_pad_goes_where_the_tree_allows() {
        let root = |ids, pos, forked| RootInfo { ids, pos, forked };
        let max_pos = 4096;
        // The choice for these children (root index, ids), children keeping states or not, the shortest root a tree
        // takes (None: no trees) and whether the last child may be extended.
        let choose =
            |items: &[RootInfo], children: &[(usize, usize)], kept, rows, min_root, extend| {
                let tree = TreeInfo {
                    children,
                    kept_children: kept,
                    min_root,
                    extend,
                };
                choose_pad(items, tree, rows, max_pos)
            };
        // A plain forward: one more root, whatever its segments (forks included).
        let plain = [root(40, 0, false), root(9, 17, true)];
        for (min_root, extend) in [(Some(3), true), (Some(3), false), (None, true)] {
            assert_eq!(
                choose(&plain, &[], false, 49, min_root, extend),
                Some(Pad::Root(15))
            );
        }
        // Decode steps (every segment one id) and forwards past the scratch are not padded.
        let steps = [root(1, 5, false), root(1, 9, false)];
        assert_eq!(choose(&steps, &[], false, 2, Some(3), true), None);
        assert_eq!(
            choose(&[root(4096, 0, false)], &[], false, 4096, Some(3), true),
            None
        );
        assert_eq!(
            choose(&[root(4000, 0, false)], &[], false, 4000, Some(3), true),
            Some(Pad::Root(32))
        );
        // A tree whose children's states are dropped: the last child goes on where its last chunk has room for the
        // pad (31 ids after 29, 2 + 31 after 66, but not 31 after 40, nor any after a whole chunk of 64), and
        // otherwise, or in batch-invariant mode, the pad is a child of the root with the fewest positions that may
        // take one (enough ids, not a fork, room for the pad's positions).
        let roots = [
            root(300, 0, false),
            root(50, 100, false),
            root(60, 0, false),
            root(2, 0, false),
            root(40, 0, true),
        ];
        let tree_rows = 452;
        for (last, extends) in [
            (29, true),
            (33, true),
            (34, false),
            (40, false),
            (64, false),
            (66, true),
            (128, false),
        ] {
            // 993 rows: 31 pad rows.
            let rows = tree_rows + 541;
            let pad = bucket_rows(rows) - rows;
            let children = [(1, 541 - last), (0, last)];
            let child = Some(Pad::Child { root: 2, pad });
            let want = if extends {
                Some(Pad::Extend(pad))
            } else {
                child
            };
            assert_eq!(
                choose(&roots, &children, false, rows, Some(3), true),
                want,
                "last child {last}, pad {pad}"
            );
            assert_eq!(
                choose(&roots, &children, false, rows, Some(3), false),
                child,
                "batch-invariant, {last}"
            );
        }
        let rows = tree_rows + 29;
        assert_eq!(
            choose(&roots, &[(0, 29)], false, rows, None, false),
            None,
            "no trees: no child"
        );
        // A tree whose children keep their states takes no pad (a dropped child beside them would drop theirs).
        assert_eq!(choose(&plain, &[], true, 49, Some(3), true), None);
        // Where no root may take a child and the last child may not go on, no pad.
        let unfit = [root(2, 0, false), root(40, 0, true)];
        assert_eq!(choose(&unfit, &[(1, 29)], false, 71, Some(3), false), None);
        assert_eq!(
            choose(&unfit, &[(1, 29)], false, 71, Some(3), true),
            Some(Pad::Extend(9)),
            "a fork's child goes on"
        );
        // A root of 60 ids at `pos` and a child of 5 (65 rows, 15 pad rows): the pad's positions must fit.
        let near_end = |pos, extend| {
            choose(
                &[root(60, pos, false)],
                &[(0, 5)],
                false,
                65,
                Some(3),
                extend,
            )
        };
        for extend in [true, false] {
            assert_eq!(near_end(4030, extend), None, "past the positions");
        }
        assert_eq!(
            near_end(4010, true),
            Some(Pad::Extend(15)),
            "the last position"
        );
    }

    /// What a padded forward's graph key takes from its segment lengths (rows, segments, the longest as counted, the
    /// gated delta chunks, attention's counted lengths), over System One's cold trees: a context of 100 to 3,890
    /// ids with 7 suffixes of 29 ids (padded as [`choose_pad`] says: the last suffix going on, or a pad child), as a
    /// stream of new users sends them. Within a bucket, contexts whose last chunk is the same and whose pad goes the
    /// same way share one key, so the keys are at most twice the buckets plus the chunk counts (printed: 178 keys
    /// over 71 buckets for 3,791 lengths on 2026-12-07; unpadded, one key per length), and a key's rows hold its
    /// forward's.
    #[test]
    fn a_bucket_of_system_one_trees_shares_one_key() {
        let kids = 7 * 29;
        let pad_of = |ctx: usize| {
            let children = [(0, 29); 7];
            let tree = TreeInfo {
                children: &children,
                kept_children: false,
                min_root: Some(3),
                extend: true,
            };
            let items = [RootInfo {
                ids: ctx,
                pos: 0,
                forked: false,
            }];
            choose_pad(&items, tree, ctx + kids, 8192)
        };
        let key = |ctx: usize| {
            let mut lens: Vec<usize> = [ctx].into_iter().chain([29; 7]).collect();
            match pad_of(ctx) {
                Some(Pad::Extend(pad)) => lens[7] += pad,
                Some(Pad::Child { root: 0, pad }) => lens.push(pad),
                p => panic!("context of {ctx}: {p:?}"),
            }
            let k = lens_key(&lens, true);
            (k.n, k.nseg, k.max_len, k.chunks, k.counted.into_owned())
        };
        let contexts = 100..=3890;
        let keys: std::collections::BTreeSet<_> = contexts.clone().map(key).collect();
        let buckets: std::collections::BTreeSet<_> =
            contexts.clone().map(|c| bucket_rows(c + kids)).collect();
        let chunk_counts: std::collections::BTreeSet<_> =
            contexts.clone().map(|c| c.div_ceil(64)).collect();
        eprintln!(
            "{} keys, {} buckets, {} chunk counts for {} context lengths",
            keys.len(),
            buckets.len(),
            chunk_counts.len(),
            contexts.clone().count()
        );
        assert!(
            keys.len() <= 2 * buckets.len() + chunk_counts.len(),
            "{} keys for {} buckets and {} chunk counts",
            keys.len(),
            buckets.len(),
            chunk_counts.len()
        );
        // Which way a context's pad goes (the last child, or a pad child).
        let pad_kind = |ctx| pad_of(ctx).map(|p| std::mem::discriminant(&p));
        for c in contexts.clone().skip(1) {
            let (a, b) = (key(c - 1), key(c));
            let same_bucket = bucket_rows(c - 1 + kids) == bucket_rows(c + kids);
            let same_pad = pad_kind(c - 1) == pad_kind(c);
            if same_bucket && same_pad && (c - 1).div_ceil(64) == c.div_ceil(64) {
                assert_eq!(a, b, "contexts of {} and {c} ids", c - 1);
            }
            assert!(
                a.0 >= c - 1 + kids && b.0 >= c + kids,
                "a key's rows below its forward's"
            );
        }
        // Unpadded, every length is a key of its own.
        let exact: std::collections::BTreeSet<_> = contexts
            .clone()
            .map(|c| {
                let lens = [&[c][..], &[29; 7]].concat();
                let k = lens_key(&lens, false);
                (k.max_len, k.counted.into_owned())
            })
            .collect();
        assert_eq!(exact.len(), contexts.count());
    }
}
