//! kiln's `KILN_*` environment variables stay few and documented: at most eight distinct names
//! appear in `crates/` outside `tests/` folders, and each of them has a row in the environment
//! table of docs/cli.md. Settled tuning values are constants, not variables; this test is what
//! keeps them that way.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

const MOST: usize = 8;

/// Every `KILN_NAME` in the Rust sources under `dir`, skipping `tests/` folders.
fn names_in(dir: &Path, names: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests" && n != "target") {
                names_in(&path, names);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("KILN_") {
                let name: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name.len() > "KILN_".len() {
                    names.insert(name.trim_end_matches('_').to_string());
                }
            }
        }
    }
}

#[test]
fn few_and_documented() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut names = BTreeSet::new();
    names_in(crates, &mut names);
    assert!(names.len() <= MOST, "{} KILN_* names outside tests/ (at most {MOST}): {names:?}", names.len());
    let doc = fs::read_to_string(crates.join("../docs/cli.md")).unwrap();
    let table: BTreeSet<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .filter(|n| n.starts_with("KILN_"))
        .collect();
    let undocumented: Vec<_> = names.iter().filter(|n| !table.contains(n.as_str())).collect();
    assert!(undocumented.is_empty(), "not in docs/cli.md's environment table: {undocumented:?}");
    let stale: Vec<_> = table.iter().filter(|n| !names.contains(**n)).collect();
    assert!(stale.is_empty(), "docs/cli.md documents variables nothing reads: {stale:?}");
}
