//! Prompt lookup: drafts from the context itself. Text that is being rewritten, refactored
//! or quoted repeats what came before; the tokens that followed the latest earlier
//! occurrence of the context's last n-gram are a draft that costs nothing to make.

/// Up to `max` tokens that followed the latest earlier occurrence of the last `ngram`
/// tokens of `context`; empty when they do not recur. Only whole n-grams match (as
/// llama.cpp's `ngram-simple`): a shorter match recurs often by chance, and a draft that
/// is rejected costs a verify forward for nothing.
pub fn draft(context: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = context.len();
    if max == 0 || ngram == 0 || len <= ngram {
        return Vec::new();
    }
    let tail = &context[len - ngram..];
    // Latest first; an occurrence must end before the tail starts so that something
    // follows it.
    match (0..len - ngram).rev().find(|&i| &context[i..i + ngram] == tail) {
        Some(start) => {
            let from = start + ngram;
            context[from..(from + max).min(len)].to_vec()
        }
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::draft;

    #[test]
    fn takes_what_followed_the_latest_match() {
        // ... 1 2 3 [4 5 6] ... 9 2 3 [7 8] ... 2 3 -> "2 3" last seen before 7 8.
        let ctx = [1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0, 2, 3];
        assert_eq!(draft(&ctx, 2, 4), vec![7, 8, 0, 2]);
        assert_eq!(draft(&ctx, 2, 1), vec![7]);
        assert_eq!(draft(&ctx, 1, 2), vec![7, 8]);
        // The 3-gram "0 2 3" never recurs: no shorter match stands in for it.
        assert!(draft(&ctx, 3, 2).is_empty());
        let ctx = [5, 6, 1, 6, 2, 5, 6];
        assert_eq!(draft(&ctx, 2, 2), vec![1, 6]);
        assert_eq!(draft(&ctx, 1, 2), vec![2, 5]);
    }

    #[test]
    fn nothing_to_draft() {
        assert!(draft(&[], 3, 4).is_empty());
        assert!(draft(&[7], 3, 4).is_empty());
        assert!(draft(&[1, 2, 3], 2, 4).is_empty());
        assert!(draft(&[1, 2, 1], 2, 0).is_empty());
        assert!(draft(&[1, 2, 1], 0, 4).is_empty());
        // A match right before the tail drafts up to the tail's own tokens.
        assert_eq!(draft(&[4, 4, 4], 1, 5), vec![4]);
    }
}
