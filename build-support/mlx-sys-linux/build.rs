//! mlxbar's build script for mlx-sys 0.7.0 on Linux (scripts/setup.sh puts it in place of
//! upstream's, in a copy of the crate fetched by cargo). Upstream builds MLX itself with
//! Metal; here MLX comes prebuilt from the PyPI wheel `mlx-cpu` (CPU backend) and only the
//! bundled mlx-c is compiled, as a static library against the wheel's libmlx.so.
//!
//! Env: MLX_DIR = <wheel>/mlx/share/cmake/MLX (written to .cargo/config.toml by setup.sh).
//!
//! Check-only mode: when the target is not Linux (`cargo check --target aarch64-apple-darwin`
//! on a Linux host) nothing is compiled or linked; only the bindings are generated, so the
//! macOS code of the crates above can be type-checked here. macOS users build upstream.
use std::{
    env,
    path::{Path, PathBuf},
};

#[path = "src/bindgen_config.rs"]
#[allow(dead_code)]
mod bindgen_config;

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let mlx_c_root = PathBuf::from("src/mlx-c");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();

    if target_os != "linux" {
        println!("cargo:warning=mlx-sys (mlxbar Linux build script): check-only mode for {target_os}, nothing is linked");
        let host = env::var("HOST").unwrap();
        // The C headers need a libc: parse them for the host, whose 64-bit C ABI matches
        // aarch64-apple-darwin for every type mlx-c uses (LP64, signed char).
        generate_bindings(&mlx_c_root, &out, Some(&host));
        return;
    }

    let mlx_dir = PathBuf::from(env::var("MLX_DIR").expect(
        "MLX_DIR is not set: run scripts/setup.sh (it installs the mlx-cpu wheel and writes .cargo/config.toml)",
    ));
    let prefix = mlx_dir
        .join("../../..")
        .canonicalize()
        .unwrap_or_else(|e| panic!("MLX_DIR {} does not exist ({e}): run scripts/setup.sh", mlx_dir.display()));
    let (lib_dir, inc_dir) = (prefix.join("lib"), prefix.join("include"));

    // 1. mlx-c as a static library, linked against the prebuilt libmlx.so.
    let shim_h = out.join("linux_shim.h");
    std::fs::write(&shim_h, LINUX_SHIM_H).unwrap();
    let dst = cmake::Config::new(&mlx_c_root)
        // -I as well: CMAKE_CXX_FLAGS also reaches cmake's compiler-check programs.
        .cxxflag(format!("-I{} -include {}", inc_dir.display(), shim_h.display()))
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_DIR", &mlx_dir)
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .define("CMAKE_INSTALL_LIBDIR", "lib")
        .profile("Release")
        .build();
    println!("cargo:rustc-link-search=native={}/lib", dst.display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");
    // A dependency's link args only reach its own tests; dependents read DEP_MLX_LIBDIR
    // and add the rpath in their build scripts (mlxbar's build.rs does).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());

    // 2. mlx-rs seeds its RNG with mach_approximate_time(), a macOS call.
    let shim_c = out.join("mach_shim.c");
    std::fs::write(&shim_c, MACH_SHIM_C).unwrap();
    cc::Build::new().file(&shim_c).compile("mach_shim");

    // 3. Metadata for dependents: upstream's contract plus the lib dir for the rpath.
    let include = env::join_paths([inc_dir.clone(), env::current_dir().unwrap().join(&mlx_c_root)]).unwrap();
    println!("cargo::metadata=include={}", include.display());
    println!("cargo::metadata=libdir={}", lib_dir.display());
    let version_file = std::fs::read_to_string(mlx_dir.join("MLXConfigVersion.cmake")).unwrap_or_default();
    if let Some(v) = version_file.lines().find_map(|l| l.trim().strip_prefix("set(PACKAGE_VERSION \"")) {
        println!("cargo::metadata=version={}", v.trim_end_matches("\")"));
    }

    generate_bindings(&mlx_c_root, &out, None);
}

/// bindgen as upstream, with the 16-bit float types spelled as on arm64
/// (`__fp16` -> `__BindgenFloat16`, bf16 -> u16) so mlx-rs compiles unchanged.
fn generate_bindings(mlx_c_root: &Path, out: &Path, clang_target: Option<&str>) {
    let headers = bindgen_config::discover_headers(mlx_c_root).expect("mlx-c headers");
    let half_shim = out.join("bindgen_half_shim.h");
    std::fs::write(&half_shim, BINDGEN_HALF_SHIM_H).unwrap();
    let mut builder = bindgen_config::builder(mlx_c_root, &headers)
        .clang_arg("-include")
        .clang_arg(half_shim.to_str().unwrap())
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if let Some(t) = clang_target {
        builder = builder.clang_arg(format!("--target={t}"));
    }
    builder
        .generate()
        .expect("Unable to generate bindings")
        .write_to_file(out.join("bindings.rs"))
        .unwrap();
}

/// Force-included into every mlx-c translation unit:
/// (a) mlx-c's private/io.h uses std::format (libstdc++ >= 13); Debian 12's GCC 12 lacks
///     it, so a "{}"-only fallback is provided when <format> is missing;
/// (b) mlx-c's half.h defines float16_t/bfloat16_t only on ARM, but mlx-rs needs
///     mlx_array_{item,data}_{b,}float16: use MLX's portable structs.
const LINUX_SHIM_H: &str = r#"#pragma once
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#define HAS_FLOAT16
#define HAS_BFLOAT16
#include <version>
#ifndef __cpp_lib_format
#include <sstream>
#include <string>
#include <string_view>
namespace std {
inline void mlx_fmt_(ostringstream& o, string_view f) { o << f; }
template <class T, class... R>
void mlx_fmt_(ostringstream& o, string_view f, const T& v, const R&... r) {
  auto p = f.find("{}");
  if (p == string_view::npos) { o << f; return; }
  o << f.substr(0, p) << v;
  mlx_fmt_(o, f.substr(p + 2), r...);
}
template <class... A> string format(string_view f, const A&... a) {
  ostringstream o; mlx_fmt_(o, f, a...); return o.str();
}
}
#endif
"#;

const MACH_SHIM_C: &str = "#include <stdint.h>\n#include <time.h>\n\
uint64_t mach_approximate_time(void) {\n\
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);\n\
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;\n}\n";

const BINDGEN_HALF_SHIM_H: &str = "#define HAS_FLOAT16\n#define HAS_BFLOAT16\n\
typedef __fp16 float16_t;\ntypedef unsigned short bfloat16_t;\n";
