//! Admission and the single batching worker.
//!
//! A request reserves its rows in [`Admission`] (503 past `max_queue_rows`, decider-contract R1.10) and hands its
//! plan to the [`Batcher`]. One worker thread takes every pending plan (up to `max_batch_rows` rows; a larger plan
//! runs alone), calls `score` once for all of them, and answers each. So concurrent requests share one engine call,
//! and none waits behind more than the batch in flight. A failed or panicking call is retried plan by plan so only the
//! plan at fault gets the error. The reservation is released when the job is answered (success or failure).

use crate::engine::DecideEngine;
use crate::metrics::Metrics;
use onepass_decide::Plan;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::oneshot;

/// Rows admitted and not yet answered, over all requests (serve.py `outstanding`).
#[derive(Debug)]
pub struct Admission {
    outstanding: AtomicUsize,
    pub max_rows: usize,
}

/// A reservation; dropping it releases the rows.
#[derive(Debug)]
pub struct Admitted {
    adm: Arc<Admission>,
    rows: usize,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.adm.outstanding.fetch_sub(self.rows, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(max_rows: usize) -> Arc<Admission> {
        Arc::new(Admission {
            outstanding: AtomicUsize::new(0),
            max_rows,
        })
    }

    /// Reserve `n` rows, or `Err(outstanding)` when `outstanding + n > max_rows` (serve.py `_admit`).
    pub fn admit(self: &Arc<Self>, n: usize) -> Result<Admitted, usize> {
        let mut cur = self.outstanding.load(Ordering::Acquire);
        loop {
            if cur + n > self.max_rows {
                return Err(cur);
            }
            match self.outstanding.compare_exchange_weak(
                cur,
                cur + n,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(Admitted {
                        adm: self.clone(),
                        rows: n,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// What a job gets back: its probabilities per slot, or a message for a 500.
pub type JobResult = Result<Vec<Vec<f32>>, String>;

/// One plan waiting for the worker.
pub struct Job {
    pub plan: Arc<Plan>,
    pub reply: oneshot::Sender<JobResult>,
    /// Released once the job is answered.
    pub admitted: Admitted,
}

impl Job {
    fn rows(&self) -> usize {
        self.plan.rows.len()
    }

    /// Release the rows, then reply (so a client that sees its answer also sees the queue without it).
    fn answer(self, r: JobResult) {
        let Job {
            reply, admitted, ..
        } = self;
        drop(admitted);
        let _ = reply.send(r);
    }
}

/// The queue in front of the worker thread.
pub struct Batcher {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    alive: Arc<AtomicBool>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Batcher {
    /// Start the worker. `max_batch_rows`: most rows per `score` call (a larger plan still runs, alone).
    pub fn start(
        engine: Arc<dyn DecideEngine>,
        max_batch_rows: usize,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Batcher> {
        let (tx, rx) = mpsc::channel::<Job>();
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let handle = std::thread::Builder::new()
            .name("onepass-batcher".into())
            .spawn(move || {
                worker(&*engine, rx, max_batch_rows.max(1), &metrics);
                flag.store(false, Ordering::Release);
            })?;
        Ok(Batcher {
            tx: Mutex::new(Some(tx)),
            alive,
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Queue a job; `Err` gives it back when the worker is gone.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// The worker thread is running.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Stop taking jobs, let the worker finish what is queued, and join it.
    pub fn shutdown(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

fn worker(
    engine: &dyn DecideEngine,
    rx: mpsc::Receiver<Job>,
    max_batch_rows: usize,
    metrics: &Metrics,
) {
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return, // every sender dropped: shutdown
            },
        };
        let mut rows = first.rows();
        let mut batch = vec![first];
        while let Ok(j) = rx.try_recv() {
            if rows + j.rows() > max_batch_rows {
                carry = Some(j);
                break;
            }
            rows += j.rows();
            batch.push(j);
        }
        metrics.batch(batch.len(), rows);
        run(engine, batch, metrics);
    }
}

/// Score a batch and answer every job; on failure retry one by one so only the failing plan gets its error.
fn run(engine: &dyn DecideEngine, batch: Vec<Job>, metrics: &Metrics) {
    let t0 = Instant::now();
    let result = call(engine, &batch);
    metrics.engine_seconds(t0.elapsed().as_secs_f64());
    match result {
        Ok(scores) => {
            for (job, s) in batch.into_iter().zip(scores) {
                job.answer(Ok(s));
            }
        }
        Err(e) if batch.len() == 1 => {
            for job in batch {
                job.answer(Err(e.clone()));
            }
        }
        Err(_) => {
            for job in batch {
                let r = call(engine, std::slice::from_ref(&job)).map(|mut s| s.remove(0));
                job.answer(r);
            }
        }
    }
}

/// One `score` call with panics caught and the shape checked (one score list per plan, one per slot).
fn call(engine: &dyn DecideEngine, batch: &[Job]) -> Result<Vec<Vec<Vec<f32>>>, String> {
    let plans: Vec<&Plan> = batch.iter().map(|j| &*j.plan).collect();
    let out = match catch_unwind(AssertUnwindSafe(|| engine.score(&plans))) {
        Ok(r) => r?,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            return Err(format!("the engine panicked: {msg}"));
        }
    };
    if out.len() != plans.len() {
        return Err(format!(
            "the engine answered {} plans for {}",
            out.len(),
            plans.len()
        ));
    }
    for (i, (s, p)) in out.iter().zip(&plans).enumerate() {
        if s.len() != p.slot_count() {
            return Err(format!(
                "the engine answered {} slots for plan {i} with {}",
                s.len(),
                p.slot_count()
            ));
        }
    }
    Ok(out)
}
