fn main() {
    // `sqlx::migrate!` embeds `migrations/` at compile time; without this, adding a migration
    // file would not rebuild the crate (sqlx's documented recommendation).
    println!("cargo:rerun-if-changed=migrations");
    if packed_relocations_run_here() {
        // The binaries' relative relocations packed (DT_RELR): the loader's table shrinks
        // from ~1 MB, read at every start and mapped for the process's life, to a few KB
        // (issue 21 item 2, idle RSS).
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=link/code-order.txt");
    let order = concat!(env!("CARGO_MANIFEST_DIR"), "/link/code-order.txt");
    if links_with_lld() && std::path::Path::new(order).exists() {
        // The code a gateway runs laid out together, hottest first (`link/code-order.txt`,
        // made by `scripts/code-order.py`): the kernel maps a binary's code 64 KiB around
        // each page a process runs, and start-up and the request path ran code spread over
        // most of the binary — 16 of its 22 MB resident idle, 7 MB so (issue 21 item 2,
        // idle RSS). A name the build no longer has is skipped, silently.
        println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={order}");
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether the binaries link with LLD, which reads a symbol ordering file: Rust's own
/// `rust-lld` is the default linker of `x86_64-unknown-linux-gnu` since Rust 1.90, unless
/// the build names another linker or linker flavour.
fn links_with_lld() -> bool {
    let var = |k| std::env::var(k).unwrap_or_default();
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let rustc = std::process::Command::new(var("RUSTC"))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // `rustc 1.95.0 (…)`
    let minor = rustc
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.strip_prefix("1."))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(0);
    var("TARGET") == "x86_64-unknown-linux-gnu"
        && minor >= 90
        && !flags.contains("linker")
        && !flags.contains("link-self-contained")
        && std::env::var_os("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_none()
}

/// Whether a binary linked with packed relocations runs where this one is built for: a
/// glibc target built on its own kind of machine with glibc 2.36 or later (the linker marks
/// the binary as needing it; an older glibc refuses to start it). A cross build cannot
/// know its target's glibc, so it is not packed.
fn packed_relocations_run_here() -> bool {
    let var = |k| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("TARGET") != var("HOST")
    {
        return false;
    }
    // `glibc 2.36`
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text
        .trim()
        .strip_prefix("glibc ")
        .unwrap_or("")
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (version.next().unwrap_or(0), version.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}
