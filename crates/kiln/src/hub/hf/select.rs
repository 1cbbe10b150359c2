//! Which files of a repository a `ORG/REPO[:QUANT]` name means, by llama.cpp's `-hf` rules:
//! a model is a `.gguf` file that is not a sidecar (multimodal projector, importance
//! matrix, draft heads); the quant tag matches a file name case-insensitively as `TAG.` or
//! `TAG-` (after a separator); without a tag `Q4_K_M` is taken, else `Q8_0`, else the only
//! model. A split model (`NAME-00001-of-0000N.gguf`) counts once and comes with all its
//! parts. Unlike llama.cpp, a tag that names two different models is an error, not the
//! first of them.

use crate::error::{KilnError, Result};

/// Tags tried, in order, when the name has none.
const DEFAULT_TAGS: [&str; 2] = ["Q4_K_M", "Q8_0"];

/// Words in a `.gguf` file name that mark a sidecar, not a model.
const SIDECARS: [&str; 6] = ["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"];

/// A file name's split numbering: `("NAME", 1, 3)` for `NAME-00001-of-00003.gguf`; a file
/// that is not split is part 1 of 1 with its full name (without `.gguf`).
pub fn split_parts(path: &str) -> Option<(&str, u32, u32)> {
    let stem = strip_suffix_ci(path, ".gguf")?;
    let b = stem.as_bytes();
    // "-00001-of-00003" is 15 ASCII bytes (checked byte by byte: the stem may be any UTF-8).
    if b.len() > 15 {
        let t = &b[b.len() - 15..];
        let digits = |r: std::ops::Range<usize>| t[r].iter().all(u8::is_ascii_digit);
        if t[0] == b'-' && digits(1..6) && t[6..10].eq_ignore_ascii_case(b"-of-") && digits(10..15) {
            let num = |r: std::ops::Range<usize>| t[r].iter().fold(0u32, |n, d| n * 10 + (d - b'0') as u32);
            let (no, count) = (num(1..6), num(10..15));
            if (1..=count).contains(&no) {
                return Some((&stem[..stem.len() - 15], no, count));
            }
        }
    }
    Some((stem, 1, 1))
}

/// The name of part `no` of a split whose first part is `first`.
pub fn part_name(first: &str, no: u32, count: u32) -> String {
    let (prefix, _, _) = split_parts(first).unwrap_or((first, 1, 1));
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

fn strip_suffix_ci<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = s.len().checked_sub(suffix.len())?;
    (s.is_char_boundary(cut) && s[cut..].eq_ignore_ascii_case(suffix)).then(|| &s[..cut])
}

/// Whether `path` is a model file (a `.gguf` that is not a sidecar).
pub fn is_model(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    strip_suffix_ci(name, ".gguf").is_some() && {
        let lower = name.to_ascii_lowercase();
        !SIDECARS.iter().any(|w| lower.contains(w))
    }
}

/// The quant tag a model file's name ends with (`Q4_K_M` for `x-Q4_K_M.gguf`), upper case.
pub fn tag_of(path: &str) -> Option<String> {
    let (prefix, _, _) = split_parts(path)?;
    let at = prefix.rfind(['-', '.'])?;
    let tag = &prefix[at + 1..];
    (!tag.is_empty() && tag.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'))
        .then(|| tag.to_ascii_uppercase())
}

/// Whether `path` names the quant `tag`: `TAG.` or `TAG-` after a separator, any case.
fn has_tag(path: &str, tag: &str) -> bool {
    let (p, t) = (path.to_ascii_uppercase(), tag.to_ascii_uppercase());
    p.match_indices(&t).any(|(at, _)| {
        let before = p[..at].bytes().next_back();
        let after = p.as_bytes().get(at + t.len()).copied();
        before.is_none_or(|c| !c.is_ascii_alphanumeric()) && matches!(after, Some(b'.' | b'-'))
    })
}

/// The models among `files` (one entry per model: a split's first part), in order.
fn models(files: &[String]) -> Vec<&String> {
    files.iter().filter(|f| is_model(f) && split_parts(f).is_some_and(|(_, no, _)| no == 1)).collect()
}

/// The files (every part, in order) of the model `tag` picks among a repository's `files`.
pub fn select(repo: &str, files: &[String], tag: Option<&str>) -> Result<Vec<String>> {
    let models = models(files);
    if models.is_empty() {
        let n = files.len();
        return Err(KilnError::Hub(format!("{repo} has no GGUF model file ({n} files, none a .gguf model)")));
    }
    let pick = |t: &str| -> Vec<&String> { models.iter().copied().filter(|m| has_tag(m, t)).collect() };
    let chosen = match tag {
        Some(t) => match pick(t)[..] {
            [] => return Err(KilnError::Hub(format!("{repo} has no {t} file; {}", available(&models)))),
            [one] => one,
            ref many => return Err(ambiguous(repo, t, many)),
        },
        None => match DEFAULT_TAGS.iter().map(|t| (t, pick(t))).find(|(_, m)| !m.is_empty()) {
            Some((_, m)) if m.len() == 1 => m[0],
            Some((t, m)) => return Err(ambiguous(repo, t, &m)),
            None if models.len() == 1 => models[0],
            None => {
                return Err(KilnError::Hub(format!(
                    "{repo} has {} models and none is Q4_K_M or Q8_0: name one as {repo}:QUANT; {}",
                    models.len(),
                    available(&models)
                )))
            }
        },
    };
    parts_of(repo, files, chosen)
}

/// Every part of the model whose first part is `first`, checked present in `files`.
pub fn parts_of(repo: &str, files: &[String], first: &str) -> Result<Vec<String>> {
    let (_, _, count) =
        split_parts(first).ok_or_else(|| KilnError::Hub(format!("{first} is not a .gguf file")))?;
    if count == 1 {
        return Ok(vec![first.to_string()]);
    }
    (1..=count)
        .map(|no| {
            let name = part_name(first, no, count);
            files.iter().find(|f| **f == name).cloned().ok_or_else(|| {
                KilnError::Hub(format!("{repo} lacks {name}, part {no} of {count} of {first}"))
            })
        })
        .collect()
}

fn ambiguous(repo: &str, tag: &str, many: &[&String]) -> KilnError {
    let names: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
    KilnError::Hub(format!(
        "{tag} matches {} models in {repo}: {}; name the file as hf://{repo}/PATH",
        many.len(),
        names.join(", ")
    ))
}

fn available(models: &[&String]) -> String {
    let mut tags: Vec<String> = models.iter().filter_map(|m| tag_of(m)).collect();
    tags.sort();
    tags.dedup();
    if tags.is_empty() {
        let names: Vec<&str> = models.iter().map(|s| s.as_str()).collect();
        format!("models: {}", names.join(", "))
    } else {
        format!("available: {}", tags.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn splits() {
        assert_eq!(split_parts("a/M-Q4_K_M-00002-of-00003.gguf"), Some(("a/M-Q4_K_M", 2, 3)));
        assert_eq!(split_parts("M-Q4_K_M.GGUF"), Some(("M-Q4_K_M", 1, 1)));
        assert_eq!(split_parts("M-00004-of-00003.gguf"), Some(("M-00004-of-00003", 1, 1)));
        assert_eq!(split_parts("README.md"), None);
        // Found by fuzzing: a multi-byte character where the numbering would be.
        assert_eq!(split_parts("M-00001-of\u{3bd}0003.Gguf"), Some(("M-00001-of\u{3bd}0003", 1, 1)));
        assert_eq!(
            split_parts("\u{3bd}\u{3bd}\u{3bd}\u{3bd}\u{3bd}\u{3bd}\u{3bd}\u{3bd}.gguf").map(|p| p.1),
            Some(1)
        );
        assert_eq!(part_name("x/M-00001-of-00003.gguf", 3, 3), "x/M-00003-of-00003.gguf");
        assert_eq!(tag_of("M-q4_k_m-00001-of-00002.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(tag_of("qwen2.5-0.5b-instruct-q8_0.gguf").as_deref(), Some("Q8_0"));
    }

    #[test]
    fn models_exclude_sidecars() {
        assert!(is_model("M-Q4_K_M.gguf") && is_model("dir/M.GGUF"));
        assert!(!is_model("mmproj-M-f16.gguf") && !is_model("M.imatrix.gguf") && !is_model("M.bin"));
    }

    #[test]
    fn tags() {
        let repo = files(&[
            "README.md",
            "M-Q2_K.gguf",
            "M-q4_k_m.gguf",
            "M-IQ4_NL.gguf",
            "M-Q8_0.gguf",
            "mmproj-M-Q4_K_M.gguf",
            "M-F16-00001-of-00002.gguf",
            "M-F16-00002-of-00002.gguf",
        ]);
        assert_eq!(select("o/r", &repo, None).unwrap(), ["M-q4_k_m.gguf"]);
        assert_eq!(select("o/r", &repo, Some("q8_0")).unwrap(), ["M-Q8_0.gguf"]);
        assert_eq!(select("o/r", &repo, Some("iq4_nl")).unwrap(), ["M-IQ4_NL.gguf"]);
        assert_eq!(
            select("o/r", &repo, Some("F16")).unwrap(),
            ["M-F16-00001-of-00002.gguf", "M-F16-00002-of-00002.gguf"]
        );
        let e = select("o/r", &repo, Some("Q4_NL")).unwrap_err().to_string();
        assert!(
            e.contains("no Q4_NL file") && e.contains("available: F16, IQ4_NL, Q2_K, Q4_K_M, Q8_0"),
            "{e}"
        );
        // Without Q4_K_M, Q8_0; without either, the only model.
        assert_eq!(select("o/r", &files(&["a-Q8_0.gguf", "a-Q2_K.gguf"]), None).unwrap(), ["a-Q8_0.gguf"]);
        assert_eq!(select("o/r", &files(&["only.gguf", "x.txt"]), None).unwrap(), ["only.gguf"]);
        let e = select("o/r", &files(&["a-Q2_K.gguf", "a-Q3_K.gguf"]), None).unwrap_err().to_string();
        assert!(e.contains("2 models") && e.contains("Q2_K, Q3_K"), "{e}");
    }

    #[test]
    fn bad_repos() {
        let e = select("o/r", &files(&["README.md", "mmproj-x.gguf"]), None).unwrap_err().to_string();
        assert!(e.contains("no GGUF model"), "{e}");
        let e = select("o/r", &files(&["a/M-Q4_K_M.gguf", "b/M-Q4_K_M.gguf"]), Some("Q4_K_M"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("matches 2 models") && e.contains("a/M-Q4_K_M.gguf, b/M-Q4_K_M.gguf"), "{e}");
        let e = select("o/r", &files(&["M-00001-of-00002.gguf"]), None).unwrap_err().to_string();
        assert!(e.contains("lacks M-00002-of-00002.gguf"), "{e}");
    }
}
