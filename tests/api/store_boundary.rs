//! The store boundary (issue 17): nothing above `src/store/` may know which database engine
//! it talks to, so a second engine is added inside the store only. This walks `src/` and
//! names every line outside `src/store/` (and `src/mock/`, the fake upstream) that names an
//! sqlx type, SQLite, a transaction begun by hand, SQL text, or the store's test-only
//! accessor for its SQLite pools. Unit-test modules (`#[cfg(test)] mod …` to the end of a
//! file) may know the engine, like the tests in `tests/`.

use std::path::{Path, PathBuf};

/// What code above the store must not contain (comments may speak of SQLite).
const FORBIDDEN: &[&str] = &[
    "sqlx",
    "Sqlite",
    "SQLite",
    "SQLITE",
    "-wal",
    "begin_with",
    "BEGIN IMMEDIATE",
    "SELECT ",
    "UPDATE ",
    "INSERT ",
    "DELETE ",
    "PRAGMA",
    "VACUUM",
    ".sqlite()",
    ".postgres()",
    "pg::",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The folder `dir` of the repository and its Rust files, sorted; at least `at_least` of
/// them, or the folder was not found.
fn sources(dir: &str, at_least: usize) -> (PathBuf, Vec<PathBuf>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    assert!(
        files.len() > at_least,
        "{dir}/ not found at {}",
        root.display()
    );
    (root, files)
}

/// `file:line: text` for each forbidden mention in the production part of `text`.
fn leaks(file: &str, text: &str) -> Vec<String> {
    mentions(file, text, FORBIDDEN)
}

/// `file:line: text` for each of `forbidden` in the production part of `text`.
fn mentions(file: &str, text: &str, forbidden: &[&str]) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    // The closing line of the inline test module being skipped, if any.
    let mut skipping: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        if let Some(end) = &skipping {
            if line.trim_end() == end {
                skipping = None;
            }
            continue;
        }
        let code = line.trim_start();
        // An inline test module is skipped up to its closing brace at its own indentation
        // (`#[cfg(test)] mod x;` only names another file, and the code after it is still
        // production code; so is code after the module's closing brace).
        if code.starts_with("#[cfg(test)]") {
            if let Some(next) = lines.get(i + 1).filter(|next| {
                let next = next.trim();
                next.starts_with("mod ") && next.ends_with('{')
            }) {
                let indent = &next[..next.len() - next.trim_start().len()];
                skipping = Some(format!("{indent}}}"));
                continue;
            }
        }
        if code.starts_with("//") {
            continue;
        }
        // A trailing comment is prose too.
        let code = code.split(" // ").next().unwrap_or(code);
        for word in forbidden {
            if code.contains(word) {
                out.push(format!("{file}:{}: `{word}` in: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn nothing_above_the_store_knows_the_database_engine() {
    let (src, files) = sources("src", 20);
    let mut found = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        if rel.starts_with("store") || rel.starts_with("mock") {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        found.extend(leaks(&format!("src/{}", rel.display()), &text));
    }
    assert!(
        found.is_empty(),
        "{} mentions of the engine above src/store/:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The client endpoints (`src/api/`) reach the store through the layer below them
/// (`AppState`'s reads, the pipeline), never by naming it (issue 21 item 5): a handler
/// that reads a table itself skips whatever that layer adds (the retention bound, the
/// owner scope).
#[test]
fn the_client_endpoints_never_name_the_store() {
    let (_, files) = sources("src/api", 5);
    let mut found = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        found.extend(mentions(
            &path.display().to_string(),
            &text,
            &["crate::store", "store::"],
        ));
    }
    assert!(
        found.is_empty(),
        "src/api/ names the store:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_guard_sees_what_it_must_and_spares_prose_and_unit_tests() {
    let text = "//! VACUUM INTO, PRAGMA and SQLite are words here\n\
                fn a() { let x = pool.begin_with(\"BEGIN IMMEDIATE\"); } // sqlx\n\
                fn b(c: &mut sqlx::SqliteConnection) {}\n\
                fn c() { q(\"SELECT 1\") }\n\
                fn d() { db.sqlite().read }\n\
                fn e() {} // a SELECT in a comment\n\
                #[cfg(test)]\n\
                mod other_file;\n\
                fn g() { sqlx::query(\"DELETE FROM t\") }\n\
                #[cfg(test)]\n\
                mod tests {\n\
                fn f(c: &mut sqlx::SqliteConnection) {} }\n";
    let found = leaks("x.rs", text);
    let lines: Vec<&str> = found
        .iter()
        .map(|l| l.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        ["x.rs:2", "x.rs:2", "x.rs:3", "x.rs:3", "x.rs:4", "x.rs:5", "x.rs:9", "x.rs:9"],
        "{found:#?}"
    );
}

/// What the guard must also see (issue 17's PostgreSQL side): the test-only accessor for
/// the PostgreSQL pool and the `pg` store modules named from above the store, and
/// production code after an inline test module that closes before the end of the file.
#[test]
fn the_guard_sees_the_postgres_accessor_and_code_after_a_closed_test_module() {
    let text = "fn a() { let p = &db.postgres().unwrap().pool; }\n\
                fn b() { sluice::store::pg::audit::tip(c) }\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    fn t(c: &mut sqlx::SqliteConnection) {}\n\
                }\n\
                fn c() { q(\"DELETE FROM t\") }\n";
    let found = leaks("x.rs", text);
    let lines: Vec<&str> = found
        .iter()
        .map(|l| l.split(": ").next().unwrap())
        .collect();
    assert_eq!(lines, ["x.rs:1", "x.rs:2", "x.rs:7"], "{found:#?}");
}
