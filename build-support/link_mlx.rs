// Shared by the build scripts of every crate that links a binary using MLX (the server and
// the menu-bar app), through `include!`. Each such crate depends on mlx-sys directly so
// that DEP_MLX_LIBDIR reaches it.
//
// Linux: the patched mlx-sys links the mlx-cpu wheel's libmlx.so; a dependency's link args
// do not reach our binaries, so the rpath to the wheel's lib dir is added here. Debian's
// OpenBLAS is linked first so its sgemm wins symbol lookup over the wheel's reference BLAS.
fn link_mlx() {
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        return;
    }
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    // The batch-1 gemv forwarding shim (src/engine/cpu_backend/gemv_forward.rs) must be visible to libmlx.so.
    println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol=cblas_sgemm");
    const OPENBLAS: &[&str] = &[
        "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
        "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    ];
    if let Some(openblas) = OPENBLAS.iter().find(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,{openblas},--as-needed");
    } else {
        println!("cargo:warning=OpenBLAS not found (apt-get install libopenblas0-pthread): matmuls use MLX's slow reference BLAS");
    }
}
