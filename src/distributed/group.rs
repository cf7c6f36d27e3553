//! MLX's distributed group through mlx-c (`mlx/c/distributed.h`, in mlx-sys's bindings),
//! wrapped so the handle is freed once and every array op returns an owned [`Array`].
//! mlx-rs does not wrap this part of the C API yet.
use anyhow::{bail, Result};
use mlx_rs::{Array, Dtype, Stream};

use super::hostfile::Backend;
use super::rejoin::NotFormed;

/// This process's place among the processes serving one model (MLX's ring or jaccl
/// backend; the environment says where each rank is: [`super::hostfile::BackendEnv`]).
pub struct Group(mlx_sys::mlx_distributed_group);

impl Group {
    /// Joins the other ranks over `backend`: blocks until connected (the ring: MLX retries
    /// the connect with a backoff, then fails; the accept side waits as long as it takes:
    /// the caller bounds it).
    pub fn join(backend: Backend) -> Result<Group> {
        let name = backend.mlx_name();
        // SAFETY: `mlx_distributed_is_available` reads a NUL-terminated backend name.
        if !unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) } {
            match backend {
                Backend::Ring => bail!("this MLX build has no ring backend"),
                Backend::Jaccl | Backend::JacclRing => bail!(
                    "this MLX build has no jaccl backend: jaccl (RDMA over Thunderbolt 5) runs on macOS 26.2 or later, with RDMA enabled in recovery mode (rdma_ctl enable); use \"backend\": \"ring\" in the host file elsewhere"
                ),
            }
        }
        // SAFETY: `group` starts as an empty handle (a null context, nothing to free) that
        // mlx-c fills on success, owned by the Group and freed by Drop; on failure it stays
        // empty and is dropped as is; the backend name is NUL-terminated.
        unsafe {
            let mut group = mlx_sys::mlx_distributed_group_new();
            if mlx_sys::mlx_distributed_init(&mut group, true, name.as_ptr()) != 0 || group.ctx.is_null() {
                let why = match backend {
                    Backend::Ring => "MLX's ring backend could not connect this rank to its neighbours (MLX_HOSTFILE's addresses unreachable, a port in use, or a rank that failed to start)",
                    Backend::Jaccl | Backend::JacclRing => "MLX's jaccl backend could not connect this rank (the RDMA devices in the host file's \"rdma\", rank 0's coordinator address, or a rank that failed to start)",
                };
                return Err(NotFormed(why.into()).into());
            }
            Ok(Group(group))
        }
    }

    /// [`Group::join`] within `deadline`. MLX's accept has no timeout of its own, so past
    /// it the joining thread is left behind (it ends if the neighbour ever connects) and
    /// the caller gets an error saying which ranks to start.
    pub fn join_within(backend: Backend, deadline: std::time::Duration, ranks: usize) -> Result<Group> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("mlxbar-ring-join".into()).spawn(move || {
            let _ = tx.send(Group::join(backend).map(Joining));
        })?;
        // Checked a few times a second: a stop (SIGTERM) does not wait out the deadline.
        let until = std::time::Instant::now() + deadline;
        let waited = loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left.min(std::time::Duration::from_millis(200))) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !left.is_zero() && !super::rejoin::stopping() => continue,
                Err(_) if super::rejoin::stopping() => bail!("stopping while joining the other ranks"),
                other => break other,
            }
        };
        match waited {
            Ok(joined) => joined.map(|j| j.0),
            Err(_) => Err(NotFormed(format!(
                "the other ranks did not join within {} s: start `mlxbar serve --hostfile FILE --rank N` for every rank N of the {ranks} in the host file (or `mlxbar cluster launch`), and check that each rank's IP and port are reachable from its neighbours",
                deadline.as_secs()
            ))
            .into()),
        }
    }

    pub fn rank(&self) -> usize {
        // SAFETY: the handle is alive (owned by self).
        unsafe { mlx_sys::mlx_distributed_group_rank(self.0) as usize }
    }

    pub fn size(&self) -> usize {
        // SAFETY: as in `rank`.
        unsafe { mlx_sys::mlx_distributed_group_size(self.0) as usize }
    }

    /// Sends `x` to rank `dst` (a ring neighbour) once the returned array is evaluated.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        // SAFETY: `x`, the group and the stream are alive for the call; mlx-c writes a new
        // array into `res` on success, which the returned Array owns.
        Self::new_array("send", |res, s| unsafe { mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.0, s) })
    }

    /// An array of `shape` and `dtype` received from rank `src` (a ring neighbour) once
    /// evaluated.
    pub fn recv(&self, shape: &[i32], dtype: Dtype, src: usize) -> Result<Array> {
        // SAFETY: `shape` outlives the call, which copies it; the rest as in `send`.
        Self::new_array("recv", |res, s| unsafe {
            mlx_sys::mlx_distributed_recv(res, shape.as_ptr(), shape.len(), dtype as mlx_sys::mlx_dtype, src as i32, self.0, s)
        })
    }

    /// Every rank's `x` stacked along the first axis, in rank order (lazy).
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        // SAFETY: as in `send`.
        Self::new_array("all_gather", |res, s| unsafe { mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.0, s) })
    }

    /// The sum of every rank's `x` (lazy): tensor parallel's partial projections added up.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        // SAFETY: as in `send`.
        Self::new_array("all_sum", |res, s| unsafe { mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.0, s) })
    }

    /// Runs an mlx-c op that writes a new array, on this thread's stream.
    fn new_array(what: &str, op: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32) -> Result<Array> {
        let stream = Stream::thread_local_or_default();
        // SAFETY: `res` starts as an empty handle; on success it holds the op's new array,
        // whose ownership passes to the Array; on failure it is freed here.
        unsafe {
            let mut res = mlx_sys::mlx_array_new();
            if op(&mut res, stream.as_ptr()) != 0 {
                mlx_sys::mlx_array_free(res);
                bail!("MLX distributed {what} failed");
            }
            Ok(Array::from_ptr(res))
        }
    }
}

/// A group on its way from the thread that joined the ring.
struct Joining(Group);
// SAFETY: the handle is a pointer to MLX's reference-counted group, which any thread may
// use or free; it is only moved, never shared, between threads.
unsafe impl Send for Joining {}

/// Frees this handle. MLX keeps the group it made at the process's first init (and its
/// sockets) for later inits, so the ring stays connected until the process ends.
impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful init and is freed only here.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.0);
        }
    }
}
