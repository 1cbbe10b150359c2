//! docs/cli.md's flag tables against `kiln <command> --help`, for every subcommand: a flag
//! added, renamed or removed on one side only fails here, so the page cannot drift.
//!
//! The page has a section `## \`kiln CMD\`` per subcommand and sections of shared flags
//! (`## Model flags`, `## Sampling flags`) that a command section includes by linking them
//! (`[model flags](#model-flags)`). A flag table row starts `| \`-s, --long VALUE\` |`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

#[path = "../src/argv.rs"]
#[allow(dead_code)]
mod argv;

/// A flag as `(short, long)`: `("-m", "--model")`, `("", "--device")`.
type Flag = (String, String);

fn kiln_help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "kiln {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands `kiln --help` lists (without clap's `help`).
fn subcommands() -> Vec<String> {
    let help = kiln_help(&[]);
    let list = help.split("Commands:").nth(1).expect("a Commands: section");
    let list = list.split("\n\n").next().unwrap();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Parses a flag list such as `-m, --model MODEL` or `--device D`.
fn parse_flag(cell: &str) -> Flag {
    let mut short = String::new();
    let mut long = String::new();
    for part in cell.split(", ") {
        let word = part.split_whitespace().next().unwrap_or("");
        if word.starts_with("--") {
            long = word.to_string();
        } else if word.starts_with('-') {
            short = word.to_string();
        } else {
            panic!("not a flag list: {cell:?}");
        }
    }
    assert!(!long.is_empty(), "no long flag in {cell:?}");
    (short, long)
}

/// The flags of `kiln CMD --help`, without `--help` and `--version`.
fn help_flags(cmd: &str) -> BTreeSet<Flag> {
    let help = kiln_help(&[cmd]);
    let options = help.split("Options:").nth(1).expect("an Options: section");
    options
        .lines()
        // Flags are indented 2 (with a short) or 6 spaces; wrapped descriptions 10.
        .filter(|l| l.len() - l.trim_start().len() <= 6)
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            // `-m, --model <MODEL>  A .gguf path ...` or `--device <DEVICE>  ...`
            let flags: String = l.split("  ").next().unwrap().to_string();
            parse_flag(&flags)
        })
        .filter(|(_, long)| long != "--help" && long != "--version")
        .collect()
}

struct Section {
    title: String,
    body: String,
}

fn sections(doc: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for line in doc.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            out.push(Section { title: title.to_string(), body: String::new() });
        } else if let Some(s) = out.last_mut() {
            s.body.push_str(line);
            s.body.push('\n');
        }
    }
    out
}

/// The flags of a section's tables: rows whose first cell is a code span starting with `-`.
/// A multi-letter single-dash word (`-hf`) must be one the argv rewriter turns into that
/// row's long flag; it is then compared as the long flag alone, as `--help` shows it.
fn table_flags(body: &str) -> BTreeSet<Flag> {
    body.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let (short, long) = parse_flag(l.split('`').next().unwrap());
            if short.len() > 2 {
                assert!(
                    argv::WORDS.contains(&(short.as_str(), long.as_str())),
                    "{short} is not a word the argv rewriter turns into {long}"
                );
                return (String::new(), long);
            }
            (short, long)
        })
        .collect()
}

/// Every word of the rewriter stands for a long flag some command has.
#[test]
fn rewriter_words_name_real_flags() {
    let all: BTreeSet<String> = subcommands().iter().flat_map(|c| help_flags(c)).map(|(_, l)| l).collect();
    for (word, long) in argv::WORDS {
        assert!(all.contains(*long), "{word} stands for {long}, which no command has");
    }
}

/// GitHub's anchor of a heading: lowercase, spaces to dashes, punctuation dropped.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn cli_md_flags_match_help() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md")).unwrap();
    let sections = sections(&doc);
    // Shared flag groups: sections whose title is not a command.
    let groups: BTreeMap<String, BTreeSet<Flag>> = sections
        .iter()
        .filter(|s| !s.title.starts_with("`kiln "))
        .map(|s| (anchor(&s.title), table_flags(&s.body)))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    assert!(groups.contains_key("model-flags") && groups.contains_key("sampling-flags"), "{groups:?}");

    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for s in sections.iter().filter(|s| s.title.starts_with("`kiln ")) {
        let cmd = s.title.trim_matches('`').trim_start_matches("kiln ").to_string();
        let mut flags = table_flags(&s.body);
        for (id, group) in &groups {
            if s.body.contains(&format!("](#{id})")) {
                flags.extend(group.iter().cloned());
            }
        }
        let help = help_flags(&cmd);
        for f in help.difference(&flags) {
            problems.push(format!("kiln {cmd}: {f:?} is in --help but not in docs/cli.md"));
        }
        for f in flags.difference(&help) {
            problems.push(format!("kiln {cmd}: {f:?} is in docs/cli.md but not in --help"));
        }
        documented.insert(cmd);
    }
    for cmd in subcommands() {
        if !documented.contains(&cmd) {
            problems.push(format!("kiln {cmd} has no section in docs/cli.md"));
        }
    }
    assert!(problems.is_empty(), "docs/cli.md is out of date:\n{}", problems.join("\n"));
}

#[test]
fn parsing_helpers() {
    assert_eq!(parse_flag("-m, --model MODEL"), ("-m".into(), "--model".into()));
    assert_eq!(parse_flag("--logit-bias ID(+\\|-)BIAS"), ("".into(), "--logit-bias".into()));
    assert_eq!(anchor("Model flags"), "model-flags");
    assert_eq!(anchor("`kiln serve`"), "kiln-serve");
    let body = "| flag | meaning |\n|---|---|\n| `-n, --n-predict N` | x |\n| `/reset` | y |\n";
    assert_eq!(table_flags(body).len(), 1);
}
