//! llama.cpp's multi-letter single-dash flags (`-hf`), accepted exactly as written beside
//! their long forms. clap's short flags are one letter (`-hf` would read as `-h -f`), so
//! these words are rewritten to their long flags before parsing. To accept another, add a
//! row to [`WORDS`] once its long flag exists; a test checks that every row's long flag is
//! one the command has.

use std::ffi::OsString;

/// llama.cpp's spelling and the long flag it stands for.
pub const WORDS: &[(&str, &str)] = &[
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-md", "--model-draft"),
];

/// `args` (program name first) with each word of [`WORDS`], alone or as `WORD=VALUE`,
/// replaced by its long flag; nothing after a `--` is touched.
pub fn rewrite(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut rest = false;
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            if i == 0 || rest {
                return a;
            }
            let Some(s) = a.to_str() else { return a };
            if s == "--" {
                rest = true;
                return a;
            }
            let (word, value) = match s.split_once('=') {
                Some((w, v)) => (w, Some(v)),
                None => (s, None),
            };
            match WORDS.iter().find(|(w, _)| *w == word) {
                Some((_, long)) => match value {
                    Some(v) => format!("{long}={v}").into(),
                    None => (*long).into(),
                },
                None => a,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(args: &[&str]) -> Vec<String> {
        rewrite(args.iter().map(OsString::from)).into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn each_word() {
        for (word, long) in WORDS {
            assert_eq!(rw(&["kiln", "pull", word, "o/r:Q8_0"]), ["kiln", "pull", long, "o/r:Q8_0"]);
            let eq = format!("{word}=o/r");
            assert_eq!(rw(&["kiln", "run", &eq]), ["kiln".to_string(), "run".into(), format!("{long}=o/r")]);
        }
    }

    #[test]
    fn leaves_the_rest() {
        let args = ["kiln", "run", "-hfx", "-h", "-p", "x", "--", "-hf"];
        assert_eq!(rw(&args), args);
        assert_eq!(rw(&["-hf"]), ["-hf"]); // the program name
    }
}
