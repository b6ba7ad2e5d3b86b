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
    // The probe below decides by the linker: probed again when the linker may have changed
    // (s41 final attack F3).
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        std::env::var("TARGET")
            .unwrap_or_default()
            .to_uppercase()
            .replace('-', "_")
    );
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_LINKER",
        &linker_var,
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let list = concat!(env!("CARGO_MANIFEST_DIR"), "/link/code-order.txt");
    let Some(order) = order_for_the_linker(list) else {
        return;
    };
    let order = order.as_str();
    match linker_reads_symbol_order(order) {
        Ok(()) => {
            // The code a gateway runs laid out together, hottest first (`link/code-order.txt`,
            // made by `scripts/code-order.py`): the kernel maps a binary's code 64 KiB around
            // each page a process runs, and start-up and the request path ran code spread over
            // most of the binary — 16 of its 22 MB resident idle, 7 MB so (issue 21 item 2,
            // idle RSS). A name the build no longer has is skipped, silently. `-Xlinker` keeps
            // the path one argument whatever it holds (`-Wl,` would split it at a comma).
            for arg in symbol_order_args(order) {
                println!("cargo:rustc-link-arg-bins={arg}");
            }
            // For `files::the_binarys_code_is_laid_out_in_the_order_of_the_list`.
            println!("cargo:rustc-env=SLUICE_CODE_ORDER={order}");
        }
        // Not an error — the binary is right, only its code is spread — but a figure of
        // docs/PERFORMANCE.md will not hold (s41 final attack F4), and the test of the
        // layout fails where the binary is linked by LLD (s42 final attack F3).
        Err(why) => println!(
            "cargo:warning=link/code-order.txt left out: a probe link with \
             --symbol-ordering-file failed ({why}); the idle gateway holds ~9 MB more code \
             (LLD reads the list)"
        ),
    }
}

/// The most codegen units a crate's code is split into that the list allows for: the
/// `release` profile has 4 (numbered 0-3); a profile without the setting has Cargo's 16,
/// which rustc numbers with two digits (00-15).
const CODEGEN_UNITS: usize = 16;

/// The list as the linker gets it, written to `OUT_DIR`: a function ThinLTO exported from
/// its codegen unit is named for that unit (`name.llvm.<crate>_<hash>_cgu_<k>`,
/// `.cargo/config.toml`), and which unit a function lands in moves as the code around it
/// changes — one commit of three files moved ~300 of the list's names — so each such name
/// is listed under every unit's number (of the same width) and bare (not exported), at its
/// own rank; only one of them is in a binary. `bench/overhead.py` (`linked_forms`) counts
/// the list's names in a binary by the same forms. `None` when there is no list.
fn order_for_the_linker(list: &str) -> Option<String> {
    if !std::path::Path::new(list).exists() {
        return None;
    }
    let path = format!("{}/code-order.txt", std::env::var("OUT_DIR").ok()?);
    match std::fs::read_to_string(list)
        .and_then(|names| std::fs::write(&path, linked_forms(&names)))
    {
        Ok(()) => Some(path),
        Err(e) => {
            println!("cargo:warning=link/code-order.txt left out: {e}");
            None
        }
    }
}

/// Every name of `names` (one a line) in the forms the linker may meet it in, at its rank.
fn linked_forms(names: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut out = String::with_capacity(names.len() * 4);
    let mut add = |name: &str, out: &mut String| {
        if seen.insert(name.to_string()) {
            out.push_str(name);
            out.push('\n');
        }
    };
    for name in names.lines().map(str::trim).filter(|n| !n.is_empty()) {
        add(name, &mut out);
        let Some((bare, unit)) = name.split_once(".llvm.") else {
            continue;
        };
        add(bare, &mut out);
        let Some((module, k)) = unit.rsplit_once("_cgu_") else {
            continue;
        };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let width = k.len();
        let units = 10usize
            .checked_pow(width as u32)
            .map_or(CODEGEN_UNITS, |n| n.min(CODEGEN_UNITS));
        for i in 0..units {
            add(&format!("{bare}.llvm.{module}_cgu_{i:0width$}"), &mut out);
        }
    }
    out
}

fn symbol_order_args(order: &str) -> [String; 4] {
    [
        "-Xlinker".into(),
        format!("--symbol-ordering-file={order}"),
        "-Xlinker".into(),
        "--no-warn-symbol-ordering".into(),
    ]
}

/// Whether the linker the binaries will be linked with reads a symbol ordering file (LLD
/// does — Rust's own `rust-lld` is the default of `x86_64-unknown-linux-gnu` in rustup's
/// toolchains since 1.90 — GNU ld and mold do not, and a distribution's rustc may link with
/// GNU ld): a throwaway `fn main() {}` is linked with the build's compiler, target, flags
/// and linker, and the arguments, from the package's folder — where Cargo runs rustc for a
/// package that is its own workspace, as this one is — so a relative path in the flags
/// resolves as it does for the build. Its failure, whatever the reason, leaves them out;
/// the error says what caused it (`cause`).
fn linker_reads_symbol_order(order: &str) -> Result<(), String> {
    let var = |k| std::env::var(k).unwrap_or_default();
    let dir = std::path::PathBuf::from(var("OUT_DIR")).join("symbol-order-probe");
    let source = dir.join("probe.rs");
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&source, "fn main() {}\n"))
        .map_err(|e| format!("the probe could not be written: {e}"))?;
    let mut rustc = std::process::Command::new(var("RUSTC"));
    rustc
        .current_dir(var("CARGO_MANIFEST_DIR"))
        .arg(&source)
        .args(["--crate-type=bin", "-o"])
        .arg(dir.join("probe"))
        .arg("--target")
        .arg(var("TARGET"))
        .args(
            var("CARGO_ENCODED_RUSTFLAGS")
                .split('\x1f')
                .filter(|f| !f.is_empty()),
        );
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        rustc.arg(format!("-Clinker={linker}"));
    }
    for arg in symbol_order_args(order) {
        rustc.arg(format!("-Clink-arg={arg}"));
    }
    let out = rustc
        .stdout(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("rustc did not run: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(cause(&String::from_utf8_lossy(&out.stderr)))
}

/// What a failed link says caused it, from rustc's error output: the linker's own first
/// line (the first of rustc's `= note:`s past the command line and the "arguments are
/// omitted" line — `rust-lld: error: cannot open …`, `ld.bfd: unrecognized option …`),
/// else rustc's first error (`error: unknown codegen option …`); at most 300 characters.
fn cause(said: &str) -> String {
    let notes = said
        .lines()
        .filter_map(|l| l.trim().strip_prefix("= note:"))
        .map(str::trim)
        .find(|l| {
            !l.starts_with('"') && !l.starts_with("LC_ALL=") && !l.starts_with("some arguments")
        });
    let first = notes
        .or_else(|| said.lines().map(str::trim).find(|l| l.starts_with("error")))
        .or_else(|| said.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("no message");
    first.chars().take(300).collect()
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
