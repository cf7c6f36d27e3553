//! What MLX's CPU backend needs from us, per platform. On Linux: MLX calls `cblas_sgemm`
//! for every matmul, and Debian's OpenBLAS is slow at decode shapes, so the executable
//! exports its own `cblas_sgemm` ([`gemv_forward`]) that sends 1-row calls to gemv and
//! 2-16-row calls to [`small_m`]. macOS uses Accelerate as MLX ships it: nothing to do.
#[cfg(target_os = "linux")]
pub mod gemv_forward;
#[cfg(target_os = "linux")]
pub mod small_m;

/// Makes this platform's matmul routing active (call before MLX runs a matmul).
pub fn install() {
    #[cfg(target_os = "linux")]
    gemv_forward::install();
}
