//! The CPU kernels' fork-join: a job's tasks split between the calling thread (MLX's CPU
//! stream, which runs the kernels as ops) and one helper thread per further core, whose
//! waits spin rather than sleep while jobs keep coming.
//!
//! Why not rayon: a call from outside rayon's pool queues the job and puts the caller to
//! sleep on a condition variable until a worker has run it, and the workers sleep between
//! jobs. A decode step is ~150 kernel ops a few microseconds apart, and each sleep and wake
//! is a futex round trip (an inter-processor interrupt on a VM): `perf` of a 1-row decode
//! on a 2-vCPU Xeon VM put a quarter of the time in the scheduler, ~600 context switches a
//! step. Here the caller works on the job's tasks itself and spins for the helpers'
//! stragglers, and the helpers spin for [`SPIN`] after a job before they sleep, as
//! llama.cpp's thread pool polls between a graph's ops.
//!
//! One job at a time: a caller that finds the pool busy (a second stream, a test thread, a
//! kernel inside a kernel) runs its tasks itself.
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it sleeps: a step's ops come
/// microseconds apart, and an idle server's helpers should cost nothing.
const SPIN: Duration = Duration::from_micros(300);

/// The job word: generation, task count and the next task to claim, so that a claim (a
/// compare-and-swap) is only ever of a task of the job it read.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u64 = (1 << (64 - 2 * INDEX_BITS)) - 1;
/// Tasks a job may have (more are grouped by [`for_each`]).
const MAX_TASKS: usize = INDEX_MASK as usize;

struct Pool {
    helpers: usize,
    /// `generation << 40 | tasks << 20 | next`.
    word: AtomicU64,
    /// Tasks of the current job finished.
    done: AtomicUsize,
    /// The current job: a pointer to the caller's `&dyn Fn(usize)`, valid while it waits.
    job: AtomicPtr<()>,
    /// The first panic in one of the current job's tasks, re-raised by its caller.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Held by the caller of the running job.
    busy: Mutex<()>,
    /// Helpers asleep (they sleep on `wake` under `sleep`).
    sleeping: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

type Job<'a> = &'a (dyn Fn(usize) + Sync);

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let helpers = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            helpers,
            word: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panic: Mutex::new(None),
            busy: Mutex::new(()),
            sleeping: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 0..helpers {
            // A helper that cannot start leaves its share to the caller (tasks are claimed,
            // not assigned).
            let _ = std::thread::Builder::new().name(format!("mlxbar-kernel-{i}")).spawn(move || pool.help());
        }
        pool
    })
}

/// Threads a job's tasks run on: the caller and the helpers.
pub fn threads() -> usize {
    pool().helpers + 1
}

/// Runs `f(0)`, …, `f(tasks - 1)`, each once, across the caller and the helpers; returns
/// when all have run. A panic in a task is re-raised here, after the others have finished.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    run(tasks, &f)
}

fn run(tasks: usize, f: Job) {
    let pool = pool();
    if tasks > MAX_TASKS {
        let per = tasks.div_ceil(MAX_TASKS);
        return run(tasks.div_ceil(per), &|g| (g * per..((g + 1) * per).min(tasks)).for_each(f));
    }
    let guard = match pool.busy.try_lock() {
        _ if tasks <= 1 || pool.helpers == 0 => None,
        Ok(guard) => Some(guard),
        // A job whose caller panicked while holding it: the pool itself is sound.
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    let Some(guard) = guard else {
        let mut panicked = None;
        for i in 0..tasks {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                panicked.get_or_insert(panic);
            }
        }
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
        return;
    };
    pool.job.store(&f as *const Job as *mut (), Ordering::Relaxed);
    pool.done.store(0, Ordering::Relaxed);
    // Generations wrap, skipping 0 (what a helper has seen before the first job).
    let generation = match ((pool.word.load(Ordering::Relaxed) >> (2 * INDEX_BITS)) + 1) & GENERATION_MASK {
        0 => 1,
        g => g,
    };
    pool.word.store(generation << (2 * INDEX_BITS) | (tasks as u64) << INDEX_BITS, Ordering::SeqCst);
    if pool.sleeping.load(Ordering::SeqCst) > 0 {
        let _sleep = pool.sleep.lock().unwrap_or_else(|e| e.into_inner());
        pool.wake.notify_all();
    }
    // The caller's own share (a task's panic is kept for after: the helpers read `f`).
    pool.work(generation);
    let mut spins = 0u32;
    while pool.done.load(Ordering::Acquire) < tasks {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            // A helper descheduled mid-task: let it have the core.
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
    let panicked = pool.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    // Released before unwinding, so that the pool is not left poisoned.
    drop(guard);
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
}

/// `f(i, chunk)` for each `chunk`-long piece of `data` (the last may be shorter), across
/// the pool.
pub fn for_each_chunk_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let (len, chunk) = (data.len(), chunk.max(1));
    let base = SendPtr(data.as_mut_ptr());
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        // SAFETY: task i is run once and its range `start..start + n` lies in `data`
        // (start < len) and overlaps no other task's; `data` is borrowed mutably for the
        // whole call, which returns only after every task has.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start)) };
        f(i, piece)
    });
}

/// `f(row, i, piece)` for each `chunk`-long piece of each `row_len`-long row of `data`
/// (a row's last piece may be shorter), across the pool: tiles that never cross a row.
pub fn for_each_row_chunk_mut<T: Send>(data: &mut [T], row_len: usize, chunk: usize, f: impl Fn(usize, usize, &mut [T]) + Sync) {
    let (row_len, chunk) = (row_len.max(1), chunk.max(1));
    assert!(data.len().is_multiple_of(row_len), "{} values are not rows of {row_len}", data.len());
    let per_row = row_len.div_ceil(chunk);
    let base = SendPtr(data.as_mut_ptr());
    for_each(data.len() / row_len * per_row, |t| {
        let (row, i) = (t / per_row, t % per_row);
        let start = row * row_len + i * chunk;
        // SAFETY: task t is run once; its range lies inside row `row` of `data` and overlaps
        // no other task's; `data` is borrowed mutably for the whole call, which returns only
        // after every task has.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(row_len - i * chunk)) };
        f(row, i, piece)
    });
}

struct SendPtr<T>(*mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: the pointer is only used by `for_each_chunk_mut`'s and `for_each_row_chunk_mut`'s
// tasks, each on its own range.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as for Send.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl Pool {
    /// Claims and runs tasks of job `generation` until none are left; counts them done.
    fn work(&self, generation: u64) {
        loop {
            let word = self.word.load(Ordering::Acquire);
            let (tasks, next) = ((word >> INDEX_BITS) & INDEX_MASK, word & INDEX_MASK);
            if word >> (2 * INDEX_BITS) != generation || next >= tasks {
                return;
            }
            if self.word.compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            // SAFETY: the claim succeeded on this job's word, so task `next` is not done and
            // the job's caller is still waiting (on `done`), its `&dyn Fn` alive.
            let f = unsafe { *(self.job.load(Ordering::Acquire) as *const Job) };
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(next as usize))) {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(panic);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// A helper's life: wait for a job (spinning, then asleep), help with it, again.
    fn help(&self) {
        let mut seen = 0u64;
        loop {
            let started = Instant::now();
            let mut spins = 0u32;
            let generation = loop {
                let g = self.word.load(Ordering::Acquire) >> (2 * INDEX_BITS);
                if g != seen {
                    break g;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(256) && started.elapsed() > SPIN {
                    let mut sleep = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                    self.sleeping.fetch_add(1, Ordering::SeqCst);
                    while self.word.load(Ordering::SeqCst) >> (2 * INDEX_BITS) == seen {
                        sleep = self.wake.wait(sleep).unwrap_or_else(|e| e.into_inner());
                    }
                    self.sleeping.fetch_sub(1, Ordering::SeqCst);
                    drop(sleep);
                    continue;
                }
                std::hint::spin_loop();
            };
            seen = generation;
            self.work(generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once() {
        for tasks in [0, 1, 2, 3, 17, 1000] {
            let runs: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
            for_each(tasks, |i| {
                runs[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "{tasks} tasks");
        }
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut data = vec![0usize; 1001];
        for_each_chunk_mut(&mut data, 64, |i, piece| piece.iter_mut().for_each(|x| *x = i + 1));
        assert!(data.iter().enumerate().all(|(at, &x)| x == at / 64 + 1));
    }

    #[test]
    fn row_chunks_never_cross_a_row() {
        let mut data = vec![(0usize, 0usize); 3 * 10];
        for_each_row_chunk_mut(&mut data, 10, 4, |row, i, piece| {
            assert!(piece.len() == if i == 2 { 2 } else { 4 });
            piece.iter_mut().for_each(|x| *x = (row, i));
        });
        assert!(data.iter().enumerate().all(|(at, &x)| x == (at / 10, at % 10 / 4)));
    }

    #[test]
    fn a_panicking_task_panics_the_caller_after_the_rest() {
        let ran = AtomicU32::new(0);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each(64, |i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 5, "task 5 fails");
            })
        }));
        assert!(result.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 64, "every task ran");
        assert!(!pool().busy.is_poisoned(), "the pool is left usable by its helpers");
        // The pool still works.
        let n = AtomicU32::new(0);
        for_each(10, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn jobs_from_many_threads_all_finish() {
        let total = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        for_each(8, |_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 8);
    }
}
