//! Prompt lookup: drafts from the context itself. Text that is being rewritten, refactored
//! or quoted repeats what came before; the tokens that followed an earlier occurrence of the
//! context's last tokens are a draft that costs nothing to make.

/// The draft for `context`: of the earlier occurrences of its last `ngram` tokens, the one
/// preceded by the longest run of tokens that also precede the context's end (the latest
/// among equal runs), and as many of the tokens that followed it as that run is long, at
/// most `max`. Empty where the last `ngram` tokens do not recur.
///
/// The run's length is how long the text has been repeating its source: a rewrite copying
/// a function drafts long stretches, while a token that merely recurs (a newline, an
/// indent) drafts one, whose verify costs little more than a decode step. Drafting a fixed
/// length after every match wastes the verify on tokens that rarely hold.
pub fn draft(context: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = context.len();
    if max == 0 || ngram == 0 || len <= ngram {
        return Vec::new();
    }
    // A run at least this long drafts `max` tokens: no later occurrence can do better.
    let enough = max.max(ngram);
    let (mut best, mut best_run) = (0, 0);
    // `end`: one past an occurrence's last token, leaving at least one token after it.
    for end in (ngram..len).rev() {
        let run = context[..end]
            .iter()
            .rev()
            .zip(context.iter().rev())
            .take(enough)
            .take_while(|(a, b)| a == b)
            .count();
        if run >= ngram && run > best_run {
            (best, best_run) = (end, run);
            if run == enough {
                break;
            }
        }
    }
    if best_run == 0 {
        return Vec::new();
    }
    context[best..(best + best_run.min(max)).min(len)].to_vec()
}

#[cfg(test)]
mod tests {
    use super::draft;

    #[test]
    fn takes_the_occurrence_with_the_longest_run() {
        // "2 3" recurs twice; the later one is preceded by "9 2 3", which matches the
        // context's "9 2 3" by three tokens, the earlier by two ("1 2 3" vs "9 2 3").
        let ctx = [1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0, 9, 2, 3];
        assert_eq!(draft(&ctx, 2, 8), vec![7, 8, 0]);
        assert_eq!(draft(&ctx, 2, 2), vec![7, 8]);
        assert_eq!(draft(&ctx, 3, 8), vec![7, 8, 0]);
        // No earlier "0 9 2 3".
        assert!(draft(&ctx, 4, 8).is_empty());
        // The earlier occurrence wins where its run is longer, though another is later.
        let ctx = [5, 1, 2, 3, 4, 0, 7, 2, 3, 9, 5, 1, 2, 3];
        assert_eq!(draft(&ctx, 2, 8), vec![4, 0, 7, 2]);
        // Equal runs: the latest.
        let ctx = [8, 3, 1, 9, 3, 2, 7, 3];
        assert_eq!(draft(&ctx, 1, 4), vec![2]);
    }

    #[test]
    fn a_run_drafts_its_own_length() {
        // The context repeats "1 2 3 4 5 6" from its start: a run of six drafts six.
        let ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6];
        assert_eq!(draft(&ctx, 1, 16), vec![7, 8, 9, 1, 2, 3]);
        assert_eq!(draft(&ctx, 3, 4), vec![7, 8, 9, 1]);
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
