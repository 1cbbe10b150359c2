//! Hub model names and file selection: the first line is a name (`ORG/REPO[:QUANT]` or
//! `ORG/REPO/PATH`), the rest a repository's file list. Parsing and picking must return a
//! result or an error, never panic, and a pick must be files of the list, in split order.
#![no_main]

use kiln::hub::hf::{select, HfName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.lines();
    let spec = format!("hf://{}", lines.next().unwrap_or(""));
    let files: Vec<String> = lines.map(str::to_string).collect();
    for f in &files {
        let _ = (select::split_parts(f), select::tag_of(f), select::is_model(f));
    }
    let Some(Ok(name)) = HfName::parse(&spec) else { return };
    assert!(HfName::parse(&name.spec()).is_some_and(|n| n.is_ok_and(|n| n == name)));
    if let Ok(picked) = select::select(&name.repo, &files, name.tag.as_deref()) {
        assert!(!picked.is_empty() && picked.iter().all(|p| files.contains(p)));
        let count = picked.len() as u32;
        for (i, p) in picked.iter().enumerate() {
            let (_, no, n) = select::split_parts(p).unwrap();
            assert!(count == 1 || (no == i as u32 + 1 && n == count));
        }
    }
});
