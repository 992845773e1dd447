//! Build script: records the compilation target and the rustc version so that
//! `build_info()` can report them at run time.

use std::env;
use std::process::Command;

fn main() {
    // Both are always set by cargo for build scripts; fall back rather than panic.
    let target = env::var("TARGET").unwrap_or_else(|_| String::from("unknown"));
    let rustc = env::var("RUSTC").unwrap_or_else(|_| String::from("rustc"));
    let rustc_version = Command::new(&rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| String::from("unknown"));
    println!("cargo:rustc-env=MONARCH_BUILD_TARGET={target}");
    println!("cargo:rustc-env=MONARCH_BUILD_RUSTC={rustc_version}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
