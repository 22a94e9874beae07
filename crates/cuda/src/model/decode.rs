//! Greedy and sampled decoding on the device, queued one step ahead of the host.
//!
//! A step is one CUDA graph (captured at the second step of its shape): the pick of the step before is copied into
//! the forward's table as its id, the layers run, then the final norm, the head and the pick (the argmax, or a
//! seeded draw under temperature, top-k and top-p: [`crate::sample`], the generator's state on the device), which
//! writes the next pick where the next step reads it. So the device never waits for the host: the host queues step
//! k + 1 before it waits for step k's pick (copied into page-locked host memory, with an event after the copy), and
//! its work on that token (text, stop strings, streaming) overlaps the device's next step. The price: when the caller
//! stops on a token, the step queued after it has already run, so the state holds one token more than the caller
//! accepted.
//!
//! One decode at a time holds the fixed buffers (their addresses are in the graph); a second concurrent decode gets
//! none ([`CudaModel::greedy_steps`], [`CudaModel::sample_steps`] answer `None`) and runs step by step. A step whose
//! logits go to the host ([`CudaModel::logits_step`]) is one graph too, ending in the head's logits.

use std::sync::{MutexGuard, TryLockError};

use onepass_model::sample::Sampling;

use super::*;
use crate::sample::{SamplePlan, Sampler};
use crate::DrvCtx;

/// Steps a decode may queue ahead of the picks it has read (host slots).
const SLOTS: usize = 2;

/// The fixed device buffers of greedy decoding, and the host slots their picks come back through.
pub(super) struct DecodeBufs {
    /// The last pick, which the next step embeds. [1] i32
    tok: CudaSlice<i32>,
    /// The final-normed hidden row. [H] f32
    hidden: CudaSlice<f32>,
    /// The head's input ([`CudaModel::head_into`]: the row in bf16, or rotated). [H] f32
    hb: CudaSlice<f32>,
    /// [V] f32 (where the head and the pick are two launches)
    logits: CudaSlice<f32>,
    /// The fused head and pick's per-block bests and its count of finished blocks ([`ops::head_argmax_bf16`]).
    part_v: CudaSlice<f32>,
    part_i: CudaSlice<i32>,
    count: CudaSlice<u32>,
    slots: HostSlots,
    /// Sampled decoding's buffers, allocated at the first sampled decode.
    sampler: Option<(Sampler, Charge)>,
    _charge: Charge,
}

/// Page-locked host memory for one pick per slot, each copy followed by its own event, so that waiting for one pick
/// does not wait for the work queued after it.
struct HostSlots {
    ptr: *mut i32,
    events: Vec<CudaEvent>,
}

// SAFETY: the slots are only touched by the holder of the model's decode buffers (behind a mutex); the memory is
// plain page-locked host memory, valid on any thread.
unsafe impl Send for HostSlots {}

impl HostSlots {
    fn new(g: &Gpu) -> Result<Self, CudaError> {
        // SAFETY: a fresh allocation of SLOTS i32, freed in Drop; every slot is written by a copy before it is read.
        let ptr = unsafe { cudarc::driver::result::malloc_host(4 * SLOTS, 0) }
            .op("page-locked allocation")? as *mut i32;
        let mut events = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            match g.ctx.new_event(None) {
                Ok(e) => events.push(e),
                Err(err) => {
                    // SAFETY: allocated above, never handed out.
                    let _ = unsafe { cudarc::driver::result::free_host(ptr as _) };
                    return Err(CudaError::Driver { op: "event", err });
                }
            }
        }
        Ok(HostSlots { ptr, events })
    }

    /// Queues the copy of the i32 at device address `src` into slot `i`, and the slot's event after it.
    fn fetch(&self, g: &Gpu, i: usize, src: u64) -> Result<(), CudaError> {
        assert!(i < SLOTS, "host slot {i} of {SLOTS}");
        // SAFETY: slot i lies in the allocation; nothing reads it before the event after this copy completes.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i), 1) };
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, g.stream.cu_stream()) }
            .op("pick download")?;
        self.events[i].record(&g.stream).op("event record")
    }

    /// Waits for slot `i`'s copy. → the value copied
    fn wait(&self, i: usize) -> Result<i32, CudaError> {
        self.events[i].synchronize().op("event wait")?;
        // SAFETY: the copy into slot i completed (its event did).
        Ok(unsafe { std::ptr::read_volatile(self.ptr.add(i)) })
    }
}

impl Drop for HostSlots {
    fn drop(&mut self) {
        for e in &self.events {
            let _ = e.synchronize();
        }
        // SAFETY: allocated by malloc_host in new; no copy into it is pending (the events completed).
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as _) };
    }
}

/// One greedy decode in progress: the decode buffers it holds and the steps it queued and read.
pub struct GreedyRun<'m> {
    m: &'m CudaModel,
    bufs: MutexGuard<'m, Option<DecodeBufs>>,
    /// What each queued step ends in: the argmax ([`Step::Greedy`]) or a draw ([`Step::Sample`]).
    step: Step,
    queued: usize,
    taken: usize,
}

impl CudaModel {
    fn decode_bufs(&self) -> Result<DecodeBufs, CudaError> {
        let g = &*self.gpu;
        let bytes = 8 + 8 * self.hid + 4 * self.vocab + 8 * ops::HEAD_BLOCKS;
        let charge = self.ledger.charge(bytes, "decode buffers")?;
        Ok(DecodeBufs {
            tok: g.alloc(1)?,
            hidden: g.alloc(self.hid)?,
            hb: g.alloc(self.hid)?,
            logits: g.alloc(self.vocab)?,
            part_v: g.alloc(ops::HEAD_BLOCKS)?,
            part_i: g.alloc(ops::HEAD_BLOCKS)?,
            count: g.zeros(1)?,
            slots: HostSlots::new(g)?,
            sampler: None,
            _charge: charge,
        })
    }

    /// Takes the decode buffers for a greedy decode or a sampled step. `None`: another decode holds them.
    pub fn greedy_run(&self) -> Result<Option<GreedyRun<'_>>, CudaError> {
        let mut bufs = match self.decode.try_lock() {
            Ok(b) => b,
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if bufs.is_none() {
            *bufs = Some(self.decode_bufs()?);
        }
        Ok(Some(GreedyRun {
            m: self,
            bufs,
            step: Step::Greedy,
            queued: 0,
            taken: 0,
        }))
    }

    /// Greedy decoding of `st` from `first`: feeds it, then each pick, handing every pick to `on_token` until it
    /// answers false or `max_steps` forwards ran. Each step is queued before the pick of the step before is read
    /// (see the module's text), so the state may hold one token more than `on_token` accepted. `serial` is held
    /// while a step is queued (the caller's lock on this model's stream), never while waiting for a pick or in
    /// `on_token`. → forwards run (tokens `st` gained), or `None` with nothing run when another decode holds the
    /// decode buffers.
    pub fn greedy_steps(
        &self,
        st: &mut CudaState,
        first: u32,
        max_steps: usize,
        serial: &Mutex<()>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, CudaError> {
        self.decode_steps(st, first, max_steps, None, serial, on_token)
    }

    /// Sampled decoding of `st` from `first` under `s`, the generator continued from state `rng` (`Rng::state`):
    /// as [`CudaModel::greedy_steps`], each step's token drawn on the device ([`crate::sample`]), one number of the
    /// generator per step queued (the step queued ahead of a stop included). Greedy settings run
    /// [`CudaModel::greedy_steps`] (no number drawn). → forwards run, or `None` with nothing run when another
    /// decode holds the decode buffers.
    pub fn sample_steps(
        &self,
        st: &mut CudaState,
        first: u32,
        max_steps: usize,
        s: &Sampling,
        rng: u64,
        serial: &Mutex<()>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, CudaError> {
        let plan = SamplePlan::new(s, self.vocab).map(|p| (p, rng));
        self.decode_steps(st, first, max_steps, plan, serial, on_token)
    }

    /// [`CudaModel::greedy_steps`], each step's pick the argmax, or with `sample` a draw under that plan from that
    /// generator state.
    fn decode_steps(
        &self,
        st: &mut CudaState,
        first: u32,
        max_steps: usize,
        sample: Option<(SamplePlan, u64)>,
        serial: &Mutex<()>,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, CudaError> {
        let lock = || serial.lock().unwrap_or_else(|e| e.into_inner());
        if max_steps == 0 {
            return Ok(Some(0));
        }
        let run = {
            let _s = lock();
            self.greedy_run()?
        };
        let Some(mut run) = run else {
            return Ok(None);
        };
        {
            let _s = lock();
            if let Some((plan, rng)) = &sample {
                run.set_sampling(plan, *rng)?;
            }
            run.queue(st, Some(first))?;
        }
        let mut fed = 1;
        loop {
            let ahead = fed < max_steps;
            if ahead {
                let _s = lock();
                run.queue(st, None)?;
                fed += 1;
            }
            let t = run.pick()?;
            if !on_token(t) || !ahead {
                break;
            }
        }
        drop(run);
        Ok(Some(fed))
    }

    /// One sampled decode step: feeds `tok` to `st`. → the whole vocabulary's logits after it, the step one graph (the
    /// layers, the final norm and the head), or `None` with nothing run when a decode holds the decode buffers.
    pub fn logits_step(&self, st: &mut CudaState, tok: u32) -> Result<Option<Vec<f32>>, CudaError> {
        match self.greedy_run()? {
            Some(mut run) => run.logits_after(st, tok).map(Some),
            None => Ok(None),
        }
    }

    /// The final norm, then the head and the pick into `b.tok`: one launch where the head is a bf16 GEMV's
    /// ([`ops::head_argmax_bf16`]), else the head's logits then [`ops::argmax_rows`].
    fn head_pick(&self, p: &FwdPtrs, s: Shape, b: &DecodeBufs) -> Result<(), CudaError> {
        let g = &*self.gpu;
        let (tok, hidden) = (g.ptr(&b.tok), g.ptr(&b.hidden));
        self.final_norm(p, s, &b.hidden)?;
        if let (GemmInputs::Bf16 | GemmInputs::Split | GemmInputs::Half, W::Bf16(w), None) =
            (self.prec.inputs(), self.head(), &self.head_rot)
        {
            if self.hid.is_multiple_of(8) && w.is_multiple_of(16) {
                let parts = (g.ptr(&b.part_v), g.ptr(&b.part_i), g.ptr(&b.count));
                return ops::head_argmax_bf16(
                    g,
                    hidden,
                    self.hid,
                    (w, self.hid, self.vocab),
                    parts,
                    tok,
                );
            }
        }
        let logits = g.ptr(&b.logits);
        self.head_into(hidden, 1, g.ptr(&b.hb), logits)?;
        ops::argmax_rows(g, logits, 1, self.vocab, tok)
    }
}

impl GreedyRun<'_> {
    /// Makes the steps queued from now on draw their token under `plan` from generator state `rng` (which the device
    /// advances one step per draw) instead of taking the argmax. Allocates the sampler's buffers at first use.
    pub fn set_sampling(&mut self, plan: &SamplePlan, rng: u64) -> Result<(), CudaError> {
        let m = self.m;
        let b = self
            .bufs
            .as_mut()
            .ok_or_else(|| CudaError::Unsupported("no decode buffers".into()))?;
        if b.sampler.is_none() {
            let charge = m
                .ledger
                .charge(Sampler::bytes(m.vocab), "sampler buffers")?;
            b.sampler = Some((Sampler::new(&m.gpu, m.vocab)?, charge));
        }
        if let Some((s, _)) = &b.sampler {
            s.set(&m.gpu, plan, rng)?;
        }
        self.step = Step::Sample(plan.mode);
        Ok(())
    }

    /// Queues one step of `st`: it feeds `feed`, or with `None` the pick of the step queued before.
    pub fn queue(&mut self, st: &mut CudaState, feed: Option<u32>) -> Result<(), CudaError> {
        let input = |s: &str| CudaError::Model(ModelError::Input(s.into()));
        if self.queued - self.taken >= SLOTS {
            return Err(input(
                "a greedy decode queued more steps than it read picks",
            ));
        }
        if feed.is_none() && self.queued == 0 {
            return Err(input("the first step of a greedy decode needs its token"));
        }
        self.run_step(st, feed, self.step)?;
        let (g, b) = (&*self.m.gpu, self.bufs()?);
        b.slots.fetch(g, self.queued % SLOTS, g.ptr(&b.tok))?;
        self.queued += 1;
        Ok(())
    }

    /// One sampled step of `st`: feeds `tok`. → the whole vocabulary's logits after it (the layers, the final norm and
    /// the head in one graph; the logits copied to the host)
    pub fn logits_after(&mut self, st: &mut CudaState, tok: u32) -> Result<Vec<f32>, CudaError> {
        if self.queued != self.taken {
            return Err(CudaError::Model(ModelError::Input(
                "a sampled step while greedy steps are queued".into(),
            )));
        }
        self.run_step(st, Some(tok), Step::Logits)?;
        let b = self.bufs()?;
        self.m.gpu.download(&b.logits, self.m.vocab)
    }

    fn bufs(&self) -> Result<&DecodeBufs, CudaError> {
        self.bufs
            .as_ref()
            .ok_or_else(|| CudaError::Unsupported("no decode buffers".into()))
    }

    /// Queues one decode step of `st` as one graph: the id (`feed`, else the last pick) copied into the table on the
    /// device, the layers, then what `step` adds (the pick into `tok`, or the logits).
    fn run_step(&self, st: &mut CudaState, feed: Option<u32>, step: Step) -> Result<(), CudaError> {
        let (m, g, b) = (self.m, &*self.m.gpu, self.bufs()?);
        // The id checked and the KV rows grown as for any forward; the table's id is a stand-in, the graph copies the
        // pick over it.
        let id = [feed.unwrap_or(0)];
        let mut items = [(&mut *st, &id[..])];
        m.prepare(&mut items)?;
        if let Some(t) = feed {
            g.upload_into(&[t as i32], &b.tok)?;
        }
        let mut shape = m.shape_of(&[1], 1, true, false);
        shape.step = step;
        let table_len = TableLayout::new(&m.layers, 1, 1).len;
        let mut arena = m.arena_for(shape, table_len)?;
        let a = arena
            .as_mut()
            .ok_or_else(|| CudaError::Unsupported("no arena".into()))?;
        let table = m.table(&items, &[], &[-1], (g.ptr(&a.kv.buf), 0));
        g.upload_into(&table, &a.table.buf)?;
        let p = a.ptrs(m, shape);
        let tok = g.ptr(&b.tok);
        m.graphed(shape, &|| {
            // SAFETY: both addresses are live device buffers (the pick, the table's first id), 4 bytes each; the copy
            // is ordered on the model's stream.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(p.ids, tok, 4, g.stream.cu_stream())
            }
            .op("pick into the table")?;
            m.run_layers(&p, shape)?;
            match step {
                Step::Logits => {
                    m.final_norm(&p, shape, &b.hidden)?;
                    m.head_into(g.ptr(&b.hidden), 1, g.ptr(&b.hb), g.ptr(&b.logits))
                }
                Step::Sample(mode) => {
                    let (s, _) = b
                        .sampler
                        .as_ref()
                        .ok_or_else(|| CudaError::Unsupported("no sampler buffers".into()))?;
                    m.final_norm(&p, shape, &b.hidden)?;
                    m.head_into(g.ptr(&b.hidden), 1, g.ptr(&b.hb), g.ptr(&b.logits))?;
                    s.queue(g, mode, g.ptr(&b.logits), tok)
                }
                _ => m.head_pick(&p, shape, b),
            }
        })?;
        drop(arena);
        st.pos += 1;
        Ok(())
    }

    /// Waits for the pick of the oldest step not read yet. → the token
    pub fn pick(&mut self) -> Result<u32, CudaError> {
        if self.taken == self.queued {
            return Err(CudaError::Model(ModelError::Input(
                "no greedy step is queued".into(),
            )));
        }
        let t = self.bufs()?.slots.wait(self.taken % SLOTS)?;
        self.taken += 1;
        Ok(t as u32)
    }
}

impl Drop for GreedyRun<'_> {
    /// The steps queued finish before the buffers go to the next decode (and before the caller touches the state).
    fn drop(&mut self) {
        let _ = self.m.gpu.sync();
    }
}
