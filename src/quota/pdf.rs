//! How many pages a PDF has, read from its bytes without parsing it: a provider bills a
//! PDF by the page (each page's text and an image of it), so its pages are what the
//! reservation needs.
//!
//! Why not a PDF crate: `lopdf` and its kin parse every object (and inflate streams) to
//! answer one number, a large dependency and a large attack surface for a request's
//! bytes. A page is an object whose dictionary says `/Type /Page`, and the page tree's
//! root says `/Count N`: this module counts the first, reads the second and the `/Kids`
//! in one linear pass, bounded by the bytes (no allocation beyond the `/Kids` references
//! it keeps).
//! The count is meant never to be lower than what a provider's parser finds, so
//! whatever could hide pages from such a pass makes the PDF unreadable (`None`) instead
//! — and an unreadable PDF is reserved at the model's whole input (`documents`):
//! - page objects inside compressed object streams (`/ObjStm`, and `/XRef` streams,
//!   whose entries may point into object streams without naming them): not visible;
//! - a page tree that references one node twice (its pages would be counted once per
//!   reference): from one `/Kids` array, or from two objects — a later revision of the
//!   same object (an incremental update appends one under its number) naming its kids
//!   again is the same reference; or whose `/Kids` is not an inline array of references;
//! - a `/Count` by indirect reference (`/Count 3 0 R`: the count is in another object);
//! - no `%PDF-` header in the first KiB, or no page at all.
//!
//! Names are compared after their `#xx` escapes are decoded (`/P#61ge` is `/Page`), and
//! every occurrence counts, wherever it is (a comment, a string, a stream's bytes): a
//! decoy can only raise the count. `/Count` is taken at its largest (an outline's count
//! too): a parser that believes the root's `/Count` sees no more pages than that. A
//! parser that walks the tree instead takes every node without `/Kids` as a page, with or
//! without `/Type /Page`: so the pages are at least the distinct objects `/Kids` name.

use std::collections::HashMap;

/// How far past `/Count` its value is looked for (whitespace and comments included).
const COUNT_REACH: usize = 256;

/// The pages of the PDF in `bytes`, or `None` when they cannot be read soundly.
pub fn pages(bytes: &[u8]) -> Option<i64> {
    let head = &bytes[..bytes.len().min(1024)];
    if !head.windows(5).any(|w| w == b"%PDF-") {
        return None;
    }
    let mut page_objects: i64 = 0;
    let mut most_counted: i64 = 0;
    let mut kids = Kids::default();
    // The object whose body the scan is in (its number, from its `n g obj` header).
    let mut owner: Option<u64> = None;
    let mut i = 0;
    while let Some(at) = bytes[i..].iter().position(|&b| b == b'/') {
        owner = last_header(&bytes[i..i + at]).or(owner);
        let (name, end) = name_at(bytes, i + at + 1);
        i = end;
        match name.as_slice() {
            b"Page" => page_objects = page_objects.saturating_add(1),
            b"ObjStm" | b"XRef" => return None,
            b"Count" => {
                // Its value is read within a short reach of the name: a comment running
                // on could otherwise be scanned to its end from every `/Count` inside it
                // (quadratic in the body). A count not readable there — none, cut by the
                // reach, or a reference (`/Count n g R`: the count is in another object) —
                // makes the PDF unreadable, never a smaller count.
                let reach = &bytes[i..bytes.len().min(i + COUNT_REACH)];
                let whole = i + COUNT_REACH >= bytes.len();
                match integer_at(reach, 0) {
                    Some((n, end)) if whole || end + 64 <= reach.len() => {
                        if reference_follows(reach, end) {
                            return None;
                        }
                        // The scan goes on from the name, not past the integer: a comment
                        // skipped to reach it is scanned too, as everywhere else (a
                        // `/Count` in it may only raise the figure).
                        most_counted = most_counted.max(n);
                    }
                    _ => return None,
                }
            }
            b"Kids" => {
                let end = kids.read(bytes, i, owner)?;
                i = end;
            }
            _ => {}
        }
    }
    // A reader takes a tree node without `/Kids` as a page whatever its `/Type`, so every
    // distinct kid may be one (an inner node counted too: a few pages too many at worst).
    let kids = i64::try_from(kids.by_object.len()).unwrap_or(i64::MAX);
    let pages = page_objects.max(most_counted).max(kids);
    (pages > 0).then_some(pages)
}

/// Whether ` g R` follows `i`: the integer before `i` was an indirect reference's object
/// number.
fn reference_follows(bytes: &[u8], i: usize) -> bool {
    integer_at(bytes, i).is_some_and(|(_, end)| bytes.get(skip_space(bytes, end)) == Some(&b'R'))
}

/// PDF whitespace (ISO 32000 7.2.2).
fn is_space(b: u8) -> bool {
    matches!(b, b'\0' | b'\t' | b'\n' | b'\x0c' | b'\r' | b' ')
}

fn is_delimiter(b: u8) -> bool {
    matches!(
        b,
        b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'{' | b'}' | b'/' | b'%'
    )
}

/// The name starting at `start` (after its `/`), `#xx` escapes decoded, and where it
/// ends. Only its first 16 bytes are kept: every name compared is shorter.
fn name_at(bytes: &[u8], start: usize) -> (Vec<u8>, usize) {
    let mut name = Vec::new();
    let mut i = start;
    while let Some(&b) = bytes.get(i) {
        if is_space(b) || is_delimiter(b) {
            break;
        }
        let hex = |j: usize| bytes.get(j).and_then(|c| (*c as char).to_digit(16));
        let (byte, width) = match (b, hex(i + 1), hex(i + 2)) {
            (b'#', Some(h), Some(l)) => ((h * 16 + l) as u8, 3),
            _ => (b, 1),
        };
        if name.len() < 16 {
            name.push(byte);
        }
        i += width;
    }
    (name, i)
}

/// Past whitespace and comments from `i`.
fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while let Some(&b) = bytes.get(i) {
        if is_space(b) {
            i += 1;
        } else if b == b'%' {
            while bytes.get(i).is_some_and(|&c| c != b'\n' && c != b'\r') {
                i += 1;
            }
        } else {
            break;
        }
    }
    i
}

/// A non-negative integer after whitespace from `i` (capped, never overflowing), and
/// where it ends.
fn integer_at(bytes: &[u8], i: usize) -> Option<(i64, usize)> {
    let mut i = skip_space(bytes, i);
    if bytes.get(i) == Some(&b'+') {
        i += 1;
    }
    let start = i;
    let mut n: i64 = 0;
    while let Some(d) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
        n = n
            .saturating_mul(10)
            .saturating_add(i64::from(d - b'0'))
            .min(1_000_000_000);
        i += 1;
    }
    (i > start).then_some((n, i))
}

/// The distinct objects the `/Kids` arrays name, each with the object whose array named it
/// and which array that was (numbered in order).
#[derive(Default)]
struct Kids {
    by_object: HashMap<u64, (Option<u64>, usize)>,
    arrays: usize,
}

impl Kids {
    /// A `/Kids` array from `i`, in the body of object `owner`: `[n g R …]`, each object
    /// number recorded; `None` when it is not an inline array of references or an object
    /// is referenced a second time — twice in one array, or by another object (or one the
    /// scan cannot place). A later revision of `owner` naming its kids again is no second
    /// reference.
    fn read(&mut self, bytes: &[u8], i: usize, owner: Option<u64>) -> Option<usize> {
        self.arrays += 1;
        let this = (owner, self.arrays);
        let mut i = skip_space(bytes, i);
        if bytes.get(i) != Some(&b'[') {
            return None;
        }
        i += 1;
        loop {
            i = skip_space(bytes, i);
            if bytes.get(i) == Some(&b']') {
                return Some(i + 1);
            }
            let (object, end) = integer_at(bytes, i)?;
            let (_generation, end) = integer_at(bytes, end)?;
            let end = skip_space(bytes, end);
            if bytes.get(end) != Some(&b'R') {
                return None;
            }
            if let Some((before, array)) = self.by_object.insert(object as u64, this) {
                if array == this.1 || before.is_none() || before != owner {
                    return None;
                }
            }
            i = end + 1;
        }
    }
}

/// The number of the last object header (`n g obj`) in `region`, if any. Each `obj` is
/// looked back from over its own whitespace and two integers only, so the regions a scan
/// hands in are read in linear time all together.
fn last_header(region: &[u8]) -> Option<u64> {
    let mut found = None;
    let mut from = 0;
    while let Some(at) = region[from..].windows(3).position(|w| w == b"obj") {
        let k = from + at;
        from = k + 3;
        if region
            .get(k + 3)
            .is_some_and(|&b| !is_space(b) && !is_delimiter(b))
        {
            continue;
        }
        let digits_before = |end: usize| {
            let start = region[..end]
                .iter()
                .rposition(|b| !b.is_ascii_digit())
                .map_or(0, |p| p + 1);
            (start < end).then_some(start)
        };
        let spaces_before = |end: usize| {
            let start = region[..end]
                .iter()
                .rposition(|&b| !is_space(b))
                .map_or(0, |p| p + 1);
            (start < end).then_some(start)
        };
        let header = spaces_before(k)
            .and_then(digits_before)
            .and_then(spaces_before)
            .and_then(|end| Some((digits_before(end)?, end)));
        if let Some((start, end)) = header {
            // Only digits and whitespace may come before the number: `12 0 obj`, not
            // `x12 0 obj` (`endobj` ends in `obj` too but has no number before it).
            let clear =
                start == 0 || is_space(region[start - 1]) || is_delimiter(region[start - 1]);
            if clear {
                let number = std::str::from_utf8(&region[start..end])
                    .ok()
                    .and_then(|n| n.trim().parse::<u64>().ok());
                found = number.or(found);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PDF whose page tree is `tree` and whose objects after it are `pages`.
    fn doc(tree: &str, pages: &[&str]) -> Vec<u8> {
        let mut out = format!(
            "%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n2 0 obj {tree} endobj\n"
        );
        for (i, p) in pages.iter().enumerate() {
            out.push_str(&format!("{} 0 obj {p} endobj\n", i + 3));
        }
        out.push_str("trailer << /Root 1 0 R >>\n%%EOF\n");
        out.into_bytes()
    }

    const PAGE: &str = "<< /Type /Page /Parent 2 0 R >>";

    #[test]
    fn pages_are_counted_and_the_tree_is_not_a_page() {
        let three = doc(
            "<< /Type /Pages /Kids [3 0 R 4 0 R 5 0 R] /Count 3 >>",
            &[PAGE; 3],
        );
        assert_eq!(pages(&three), Some(3));
        // No spaces, escaped names, a comment before the count: the same pages.
        let tight = doc(
            "<</Type/Pages/Kids[3 0 R\n4 0 R]/Count % two\n 2>>",
            &["<</Type/P#61ge/Parent 2 0 R>>", "<</Type /Page#73x>>"],
        );
        assert_eq!(pages(&tight), Some(2), "/Page#73x is /Pagesx, not a page");
        // A root that counts more pages than there are objects: the count.
        let counted = doc("<< /Type /Pages /Kids [3 0 R] /Count 40 >>", &[PAGE]);
        assert_eq!(pages(&counted), Some(40));
    }

    /// A reader takes a tree node without `/Kids` as a page whatever its `/Type`: 500 leaves
    /// without `/Type /Page` under a root whose `/Count` says 3 are 500 pages.
    #[test]
    fn every_kid_is_a_page_at_least() {
        let kids: Vec<String> = (0..500).map(|i| format!("{} 0 R", i + 4)).collect();
        let leaves = vec!["<< /Parent 2 0 R >>"; 500];
        let tree = format!("<< /Type /Pages /Kids [{}] /Count 3 >>", kids.join(" "));
        assert_eq!(pages(&doc(&tree, &leaves)), Some(500));
        // An indirect `/Count 3 0 R` was read as its object number (3): what it refers to
        // is not read here, so the PDF is unreadable.
        let tree = format!("<< /Type /Pages /Kids [{}] /Count 3 0 R >>", kids.join(" "));
        let mut with_count = vec!["500"];
        with_count.extend(leaves);
        assert_eq!(pages(&doc(&tree, &with_count)), None);
    }

    #[test]
    fn what_could_hide_pages_makes_the_pdf_unreadable() {
        let cases: [(&str, Vec<u8>); 8] = [
            ("no header", b"1 0 obj << /Type /Page >> endobj".to_vec()),
            ("no page", doc("<< /Type /Pages /Kids [] /Count 0 >>", &[])),
            (
                "object streams",
                doc(
                    "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                    &[PAGE, "<< /Type /Obj#53tm /N 9 /First 40 >>"],
                ),
            ),
            (
                "xref streams",
                doc("<< /Kids [3 0 R] >>", &[PAGE, "<< /Type /XRef >>"]),
            ),
            (
                "a page referenced twice",
                doc(
                    "<< /Type /Pages /Kids [3 0 R 3 0 R 3 0 R] /Count 1 >>",
                    &[PAGE],
                ),
            ),
            (
                "a shared node",
                doc(
                    "<< /Type /Pages /Kids [3 0 R 3 0 R] /Count 1 >>",
                    &["<< /Type /Pages /Kids [4 0 R] >>", PAGE],
                ),
            ),
            (
                "indirect kids",
                doc("<< /Type /Pages /Kids 9 0 R /Count 1 >>", &[PAGE]),
            ),
            (
                "an indirect count",
                doc(
                    "<< /Type /Pages /Kids [3 0 R] /Count %x\n 4 0 R >>",
                    &[PAGE, "9"],
                ),
            ),
        ];
        for (what, bytes) in cases {
            assert_eq!(pages(&bytes), None, "{what}");
        }
    }

    /// An incremental update appends a new revision of an object under the same number:
    /// the page tree's root rewritten with a page added names its old kids again. That is
    /// one node per kid, read as the distinct kids (before: unreadable). Two different
    /// objects naming one kid are still a node referenced twice.
    #[test]
    fn a_revised_tree_naming_its_kids_again_is_read() {
        let mut revised = doc("<< /Type /Pages /Kids [3 0 R] /Count 1 >>", &[PAGE]);
        revised.extend(
            b"2 0 obj\n<< /Type /Pages /Kids [3 0 R 4 0 R] /Count 2 >>\nendobj\n\
              4 0 obj << /Type /Page /Parent 2 0 R >> endobj\ntrailer << /Prev 9 >>\n%%EOF\n",
        );
        assert_eq!(pages(&revised), Some(2));
        let mut shared = doc("<< /Type /Pages /Kids [3 0 R] /Count 1 >>", &[PAGE]);
        shared.extend(b"5 0 obj << /Type /Pages /Kids [3 0 R] >> endobj\n");
        assert_eq!(pages(&shared), None);
    }

    /// The proptest's first find: a `/Count` read past a comment jumped over a `/Count`
    /// inside that comment, which the scan had counted before the comment was closed by
    /// later text — adding a page lowered the count (1 000 000 000 to 99).
    #[test]
    fn a_count_in_a_comment_is_scanned_however_the_comment_ends() {
        // A `/Count` without a value in reach is unreadable now: the case reads as such
        // before and after the page is added, never as a smaller count.
        let mut bytes = b"%PDF-1.4\n/Count%/Count 99999999999999999999".to_vec();
        let before = pages(&bytes);
        bytes.extend(b"\n99 0 obj << /Type /Page >> endobj\n");
        let after = pages(&bytes);
        assert!(
            after >= before || after.is_none(),
            "{before:?} then {after:?}"
        );
    }

    /// `/Count%` over and over without a line end: each value is looked for within a short
    /// reach, not to the comment's end (which made the scan quadratic: minutes for a
    /// megabyte, on the request path), and a count that cannot be read there makes the PDF
    /// unreadable.
    #[test]
    fn a_count_hidden_past_a_long_comment_is_unreadable_and_read_in_linear_time() {
        let mut bytes = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n".to_vec();
        bytes.extend(b"/Count%".repeat(20_000));
        assert_eq!(pages(&bytes), None);
        let mut far = b"%PDF-1.4\n/Type /Page /Count %".to_vec();
        far.extend(vec![b'x'; 300]);
        far.extend(b"\n 7 >>");
        assert_eq!(
            pages(&far),
            None,
            "a count past the reach is not read as none"
        );
        assert_eq!(pages(b"%PDF-1.4\n/Type /Page /Count % two\n 2 >>"), Some(2));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_000))]
        /// Hostile bytes — random, or the tokens this pass looks for cut and shuffled
        /// together — are read without a panic, and a page object added anywhere never
        /// lowers the count.
        #[test]
        fn any_bytes_are_read_without_a_panic(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::collection::vec(proptest::num::u8::ANY, 0..40),
                    proptest::sample::select(vec![
                        b"/Page".to_vec(), b"/Pages".to_vec(), b"/Count".to_vec(),
                        b" 99999999999999999999".to_vec(), b"/Kids [".to_vec(), b" 3 0 R".to_vec(),
                        b"]".to_vec(), b"%".to_vec(), b"#".to_vec(), b"#4".to_vec(), b"/P#61ge".to_vec(),
                        b"\n".to_vec(), b"/ObjStm".to_vec(), b"<<".to_vec(), b"(".to_vec(),
                    ]),
                ],
                0..60,
            ),
        ) {
            let mut bytes = b"%PDF-1.4\n".to_vec();
            bytes.extend(pieces.concat());
            let before = pages(&bytes);
            if let Some(n) = before {
                proptest::prop_assert!(n > 0);
            }
            bytes.extend(b"\n99 0 obj << /Type /Page >> endobj\n");
            let after = pages(&bytes);
            if let (Some(b), Some(a)) = (before, after) {
                proptest::prop_assert!(a >= b, "{a} < {b}");
            }
        }
    }
}
