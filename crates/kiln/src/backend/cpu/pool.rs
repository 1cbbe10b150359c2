//! A small persistent thread pool: `run(n, f)` calls `f(0..n)` spread over the workers
//! and the caller, and returns when all calls are done. Workers sleep on a condvar
//! between jobs (the speed issue replaces this with spinning barriers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Task<'a> = &'a (dyn Fn(usize) + Sync);

struct Job {
    /// Lifetime erased: `run` does not return before every worker has finished with it.
    f: Task<'static>,
    n: usize,
    next: AtomicUsize,
}

#[derive(Default)]
struct State {
    job: Option<Arc<Job>>,
    generation: u64,
    busy: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool with `n_threads` threads in all (the caller counts as one).
    pub fn new(n_threads: usize) -> Self {
        let shared = Arc::new(Shared { state: Mutex::default(), wake: Condvar::new(), done: Condvar::new() });
        let workers = (1..n_threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("kiln-cpu-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawn worker thread")
            })
            .collect();
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
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the job is removed and every worker has dropped its reference before
        // this function returns, so `f` outlives every use.
        let f: Task<'static> = unsafe { std::mem::transmute::<Task<'_>, Task<'static>>(f) };
        let job = Arc::new(Job { f, n, next: AtomicUsize::new(0) });
        {
            let mut st = self.shared.state.lock().unwrap();
            st.job = Some(job.clone());
            st.generation += 1;
            st.busy = self.workers.len();
        }
        self.shared.wake.notify_all();
        drain(&job);
        let mut st = self.shared.state.lock().unwrap();
        while st.busy > 0 {
            st = self.shared.done.wait(st).unwrap();
        }
        st.job = None;
    }
}

fn drain(job: &Job) {
    loop {
        let i = job.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            break;
        }
        (job.f)(i);
    }
}

fn worker(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = shared.state.lock().unwrap();
            while st.generation == seen && !st.shutdown {
                st = shared.wake.wait(st).unwrap();
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job.clone()
        };
        if let Some(job) = job {
            drain(&job);
        }
        let mut st = shared.state.lock().unwrap();
        st.busy -= 1;
        if st.busy == 0 {
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.wake.notify_all();
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
        for n in [0, 1, 2, 7, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}
