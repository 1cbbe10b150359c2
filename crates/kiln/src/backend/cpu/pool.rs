//! A persistent thread pool tuned for per-token latency: `run(n, f)` calls `f(0..n)` spread
//! over the workers and the caller, and returns when all calls are done.
//!
//! A job is published by bumping an epoch; idle workers spin on it for a short while (a
//! decode step issues hundreds of jobs a few microseconds apart), then yield, then sleep
//! on a condvar. Tasks are claimed from one atomic word holding `(epoch, next index)`, so
//! a worker that wakes late cannot claim a task of a newer job, and the caller waits for
//! the tasks to finish, never for every worker to wake: on an oversubscribed machine a
//! descheduled worker costs nothing but its share of the work.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// How long an idle worker polls before yielding, and yields before sleeping.
const SPIN: Duration = Duration::from_micros(100);
const YIELD: Duration = Duration::from_millis(2);

struct Shared {
    /// `epoch << 32 | next task index` of the current job.
    state: AtomicU64,
    /// Tasks of the current job.
    n: AtomicUsize,
    /// Tasks of the current job finished.
    done: AtomicUsize,
    /// The current job's function. Written only by `run` while no task is claimable (every
    /// task of the previous job finished), read by a worker only after claiming a task.
    f: UnsafeCell<Option<Task<'static>>>,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `f` is only accessed under the claim protocol described on the field.
unsafe impl Sync for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool with `n_threads` threads in all (the caller counts as one).
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            n: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            f: UnsafeCell::new(None),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n_threads.saturating_sub(1));
        for i in 1..n_threads.max(1) {
            let shared = shared.clone();
            match std::thread::Builder::new().name(format!("kiln-cpu-{i}")).spawn(move || worker(&shared)) {
                Ok(w) => workers.push(w),
                // The system has no more threads to give: run on those started (the caller
                // takes tasks too, so even none works).
                Err(_) => break,
            }
        }
        ThreadPool { shared, workers, run_lock: Mutex::new(()) }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(i)` for every `i < n`, in parallel.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.workers.is_empty() {
            (0..n).for_each(f);
            return;
        }
        assert!(n < u32::MAX as usize, "too many pool tasks");
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: every task has finished (`done == n`) before this function returns, and a
        // worker touches `f` only after claiming a task, so `f` outlives every use.
        let f: Task<'static> = unsafe { std::mem::transmute::<Task<'_>, Task<'static>>(f) };
        // SAFETY: no task of the previous job is claimable or running (see `Shared::f`).
        unsafe { *sh.f.get() = Some(f) };
        // Release: a worker that sees this `n` also sees the previous job closed (below), so
        // its stale claim on that job fails instead of running a task of this one.
        sh.n.store(n, Release);
        sh.done.store(0, Relaxed);
        let epoch = ((sh.state.load(Relaxed) >> 32) + 1) & 0xffff_ffff;
        sh.state.store(epoch << 32, SeqCst);
        if sh.sleepers.load(SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        drain(sh, epoch);
        let t0 = Instant::now();
        let mut spins = 0u32;
        while sh.done.load(Acquire) < n {
            spins += 1;
            if spins < 64 || t0.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        sh.state.store(epoch << 32 | CLOSED, SeqCst);
    }
}

/// The `next` index of a finished job: no claim can succeed against it.
const CLOSED: u64 = 0xffff_ffff;

/// Claims and runs tasks of job `epoch` until none is left (or a newer job started).
fn drain(sh: &Shared, epoch: u64) {
    loop {
        let s = sh.state.load(Acquire);
        if s >> 32 != epoch {
            return;
        }
        let i = (s & 0xffff_ffff) as usize;
        if i >= sh.n.load(Acquire) {
            return;
        }
        if sh.state.compare_exchange_weak(s, s + 1, Acquire, Relaxed).is_err() {
            continue;
        }
        // SAFETY: we hold an unfinished task of job `epoch`, so `f` is that job's function.
        let f = unsafe { (*sh.f.get()).expect("job published") };
        f(i);
        sh.done.fetch_add(1, Release);
    }
}

fn worker(sh: &Shared) {
    let mut seen = 0u64;
    loop {
        let t0 = Instant::now();
        let mut spins = 0u32;
        let epoch = loop {
            let e = sh.state.load(Acquire) >> 32;
            if e != seen {
                break e;
            }
            if sh.shutdown.load(Relaxed) {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins < 256 || !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = t0.elapsed();
            if idle < SPIN {
                continue;
            }
            if idle < YIELD {
                std::thread::yield_now();
                continue;
            }
            let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.sleepers.fetch_add(1, SeqCst);
            while sh.state.load(SeqCst) >> 32 == seen && !sh.shutdown.load(SeqCst) {
                g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            sh.sleepers.fetch_sub(1, SeqCst);
        };
        seen = epoch;
        drain(sh, epoch);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_index_once() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 7, 100, 5000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
        }
    }

    #[test]
    fn many_small_jobs_and_sleeping_workers() {
        let pool = ThreadPool::new(4);
        let total = AtomicUsize::new(0);
        for round in 0..20_000 {
            pool.run(3, &|i| {
                total.fetch_add(i + 1, Relaxed);
            });
            if round == 10_000 {
                // Let the workers fall asleep, then check they wake for the next job.
                std::thread::sleep(YIELD * 3);
            }
        }
        assert_eq!(total.load(Relaxed), 20_000 * 6);
    }
}
