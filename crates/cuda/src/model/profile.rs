//! Profiling: per-op CUDA events, per-forward GPU spans and the host's queueing time by phase (what
//! `onepass bench-systemone` reports).

use super::*;

/// What a forward records while asked to (the profiling marks, the forward spans): `start` turns it on, `take` off,
/// with what it holds.
pub(super) struct Recorder<T>(Mutex<Option<Vec<T>>>);

impl<T> Default for Recorder<T> {
    fn default() -> Self {
        Recorder(Mutex::new(None))
    }
}

impl<T> Recorder<T> {
    pub(super) fn start(&self) {
        if let Ok(mut r) = self.0.lock() {
            *r = Some(Vec::new());
        }
    }

    pub(super) fn take(&self) -> Vec<T> {
        self.0
            .lock()
            .ok()
            .and_then(|mut r| r.take())
            .unwrap_or_default()
    }

    pub(super) fn on(&self) -> bool {
        self.0.lock().is_ok_and(|r| r.is_some())
    }

    /// Keeps `x` while on.
    pub(super) fn push(&self, x: T) {
        if let Ok(mut r) = self.0.lock() {
            if let Some(v) = r.as_mut() {
                v.push(x);
            }
        }
    }
}

/// Milliseconds between two recorded events (the GPU has passed both).
pub(super) fn elapsed_ms(a: &CudaEvent, b: &CudaEvent) -> Result<f64, CudaError> {
    a.elapsed_ms(b)
        .map(f64::from)
        .map_err(|err| CudaError::Driver {
            op: "event elapsed",
            err,
        })
}

/// Runs `f`, adding the host nanoseconds it took to `ns`.
pub(super) fn timed<R>(ns: &AtomicU64, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

impl CudaModel {
    /// [`CudaModel::host_enqueue_ns`] by phase so far, in ns: the states (checks, KV rows, the children's states:
    /// what the other three leave), the table (written and uploaded), launching the layers (one graph launch when a
    /// graph replays), the output buffer and final norm.
    pub fn host_phases(&self) -> [(&'static str, u64); 4] {
        let p = &self.phase_ns;
        let [table, launch, out] = [&p.table, &p.launch, &p.out].map(|a| a.load(Ordering::Relaxed));
        let total = self.host_enqueue_ns();
        [
            ("states", total.saturating_sub(table + launch + out)),
            ("table", table),
            ("launch", launch),
            ("final norm", out),
        ]
    }

    /// Starts recording, per forward, an event before its table upload and one after its final norm (for
    /// [`CudaModel::span_take`]).
    pub fn span_start(&self) {
        self.spans.start();
    }

    /// Stops recording; waits for the GPU; → the GPU time of each forward since [`CudaModel::span_start`], ms (from
    /// its table upload to its final norm: the GPU's work, and any wait on the host's launches within it).
    pub fn span_take(&self) -> Result<Vec<f64>, CudaError> {
        let spans = self.spans.take();
        self.gpu.sync()?;
        spans.iter().map(|(a, b)| elapsed_ms(a, b)).collect()
    }

    /// An event recorded now on the stream while spans are recorded.
    pub(super) fn span_event(&self) -> Result<Option<CudaEvent>, CudaError> {
        if !self.spans.on() {
            return Ok(None);
        }
        self.event_now().map(Some)
    }

    /// A timing event recorded now on the stream (profiling and spans).
    pub(super) fn event_now(&self) -> Result<CudaEvent, CudaError> {
        let e = self
            .gpu
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|err| CudaError::Driver { op: "event", err })?;
        e.record(&self.gpu.stream)
            .map_err(|err| CudaError::Driver {
                op: "event record",
                err,
            })?;
        Ok(e)
    }

    /// Host nanoseconds spent inside `forward_batch` and `forward_tree` so far. The forward never waits for the GPU,
    /// so when this grows as fast as the wall clock the host's kernel launches, not the GPU, bound the request.
    pub fn host_enqueue_ns(&self) -> u64 {
        self.enqueue_ns.load(Ordering::Relaxed)
    }

    pub(super) fn profiling(&self) -> bool {
        self.prof.on()
    }

    /// Starts recording one CUDA event after every op of the following forwards (for `profile_take`). Each
    /// forward then starts behind a ~20 ms busy wait on the GPU, so the events time the GPU's work and not the
    /// host's launches (the wait itself is left out of the figures).
    pub fn profile_start(&self) {
        self.prof.start();
    }

    /// Stops recording; waits for the GPU; → (op, total ms, count) per op name, in first-seen order.
    pub fn profile_take(&self) -> Result<Vec<(&'static str, f64, usize)>, CudaError> {
        let marks = self.prof.take();
        self.gpu.sync()?;
        let mut out: Vec<(&'static str, f64, usize)> = Vec::new();
        for w in marks.windows(2) {
            if w[1].0 == "start" {
                continue;
            }
            let ms = elapsed_ms(&w[0].1, &w[1].1)?;
            match out.iter_mut().find(|e| e.0 == w[1].0) {
                Some(e) => {
                    e.1 += ms;
                    e.2 += 1;
                }
                None => out.push((w[1].0, ms, 1)),
            }
        }
        Ok(out)
    }

    /// Records that the work queued so far ends op `name` (only while profiling).
    pub(super) fn mark(&self, name: &'static str) -> Result<(), CudaError> {
        if self.prof.on() {
            self.prof.push((name, self.event_now()?));
        }
        Ok(())
    }
}
