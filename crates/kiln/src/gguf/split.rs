//! Split models, as llama.cpp's gguf-split writes them: `NAME-00001-of-0000N.gguf` ...
//! `NAME-0000N-of-0000N.gguf`, each a GGUF file with `split.no` (0-based), `split.count`
//! and `split.tensors.count` (the whole model's) in its metadata; the first holds the
//! model's metadata, and each its own share of the tensors. Opened as one [`GgufFile`]
//! whose tensors know their part.

use std::path::{Path, PathBuf};

use super::reader::GgufFile;
use crate::error::{KilnError, Result};

/// The model `first` begins: itself, or with the other parts of its split appended.
pub(super) fn open_rest(mut first: GgufFile) -> Result<GgufFile> {
    let path = first.path().map(Path::to_path_buf);
    let meta_err = |msg: String| KilnError::Gguf { path: path.clone(), offset: 0, msg };
    let count = match first.get_u64("split.count")? {
        None | Some(0 | 1) => return Ok(first),
        Some(n) if n > 9999 => return Err(meta_err(format!("split.count {n} is impossible"))),
        Some(n) => n as usize,
    };
    let no = first.get_u64("split.no")?.unwrap_or(0);
    let Some(path) = path.clone() else { return Ok(first) }; // an image in memory: one part
    if no != 0 {
        return Err(meta_err(format!(
            "this is part {} of {count} of a split model: open the first part, {}",
            no + 1,
            sibling(&path, no as usize, 0, count)
                .map_or_else(|| "NAME-00001-of-...".into(), |p| p.display().to_string())
        )));
    }
    for i in 1..count {
        let p = sibling(&path, 0, i, count).ok_or_else(|| {
            meta_err(format!("a split model's first part must be named NAME-00001-of-{count:05}.gguf"))
        })?;
        let part = GgufFile::open_one(&p).map_err(|e| match e {
            KilnError::Io { path, source } => KilnError::Invalid(format!(
                "{}: part {} of {count} of the split model is missing ({source})",
                path.display(),
                i + 1
            )),
            e => e,
        })?;
        let bad = |msg: String| KilnError::Gguf { path: Some(p.clone()), offset: 0, msg };
        if part.get_u64("split.no")? != Some(i as u64) || part.get_u64("split.count")? != Some(count as u64) {
            return Err(bad(format!("not part {} of {count} (its split.no / split.count differ)", i + 1)));
        }
        first.append_part(part).map_err(bad)?;
    }
    if let Some(n) = first.get_u64("split.tensors.count")? {
        if n != first.tensors.len() as u64 {
            return Err(meta_err(format!(
                "split.tensors.count is {n}, the parts hold {}",
                first.tensors.len()
            )));
        }
    }
    Ok(first)
}

/// Part `to` (0-based) of the split of which `path` is part `from`, if it is so named.
fn sibling(path: &Path, from: usize, to: usize, count: usize) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let prefix = stem.strip_suffix(&format!("-{:05}-of-{count:05}", from + 1))?;
    Some(path.with_file_name(format!("{prefix}-{:05}-of-{count:05}.gguf", to + 1)))
}

impl GgufFile {
    /// Takes `other`'s tensors (and bytes) as the next part of this model.
    fn append_part(&mut self, mut other: GgufFile) -> std::result::Result<(), String> {
        let part = self.parts.len();
        for mut t in other.tensors.drain(..) {
            if self.tensor_index.contains_key(&t.name) {
                return Err(format!("tensor {} is in two parts", t.name));
            }
            t.part = part;
            self.tensor_index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(t);
        }
        self.parts.append(&mut other.parts);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = Path::new("/m/x-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(sibling(p, 0, 2, 3).unwrap(), Path::new("/m/x-Q4_K_M-00003-of-00003.gguf"));
        assert_eq!(sibling(Path::new("/m/x.gguf"), 0, 1, 3), None);
        assert_eq!(sibling(Path::new("/m/x-00002-of-00003.gguf"), 0, 1, 3), None);
        assert_eq!(
            sibling(Path::new("/m/x-00002-of-00003.gguf"), 1, 0, 3).unwrap(),
            Path::new("/m/x-00001-of-00003.gguf")
        );
    }
}
